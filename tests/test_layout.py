"""Layouts measured at 60×20, 80×24, 120×40 and 200×50 (issue 28): chat's status, `charlm runs`, gates, attn
and its overview, and compare's panels fit the terminal, use its width, and never cut a number, a name or a
word. Each test reproduces a finding of the issue (it failed on the code before the fix)."""

from __future__ import annotations

import io
import re

import pexpect
import pytest
from conftest import charlm_pty, strip_ansi
from rich.console import Console

SIZES = [(60, 20), (80, 24), (120, 40), (200, 50)]


# ---- layouts: 60×20, 80×24, 120×40, 200×50 ---------------------------------------------------------


def words_whole(screen: str, width: int, words) -> None:
    """Every line fits the width, and each of `words` stands whole on one line."""
    lines = strip_ansi(screen).splitlines()
    assert max(map(len, lines)) <= width, screen
    for word in words:
        assert any(word in line for line in lines), (word, screen)


@pytest.mark.parametrize("cols,rows", SIZES)
def test_chat_status_and_hints_wrap_at_spaces_never_inside_a_number(view_runs, cols, rows):
    """Found: at 60 columns the status line wrapped mid-number (`context 42/6⏎4`)."""
    from charlm.commands.chat import Chat
    from charlm.config import SampleConfig
    from charlm.storage import checkpoint

    screen = io.StringIO()
    console = Console(file=screen, width=cols, height=rows, force_terminal=True)
    chat = Chat(checkpoint.load(view_runs["tf"]), SampleConfig(max_tokens=7, seed=1), console, interactive=True)
    chat.handle("ROMEO: But soft, what light")
    chat.handle("/set temprature 0.5")
    stats = chat.gen.stats
    words_whole(screen.getvalue(), cols, ["7 tokens", f"{stats.tokens_per_s:,.0f}", "context 34/48", "temperature?"])


@pytest.mark.parametrize("cols,rows", SIZES)
def test_runs_keeps_run_names_whole(cols, rows):
    """Found: at 60 columns `charlm runs` split names (`tinyshak/espeare-/transfor/mer-bpe`)."""
    from charlm.views.runs import render_runs

    names = ["tinyshakespeare-transformer-bpe", "tinyshakespeare-lstm-char", "sonnets-gru-char"]
    found = [
        {"run": n, "path": f"checkpoints/{n}", "modified": 1000.0 - k, "corpus": "tinyshakespeare.txt",
         "model": n.split("-")[1], "layers": 2, "d_model": 256, "tokenizer": n.split("-")[2], "params": 1_090_000,
         "steps": 12_345, "train_seconds": 124.0, "best_val_bpc": 2.3991}
        for k, n in enumerate(names)
    ]  # fmt: skip
    screen = io.StringIO()
    render_runs(Console(file=screen, width=cols, height=rows, force_terminal=True), found, "3 runs", now=1100.0)
    words_whole(screen.getvalue(), cols, names + ["2.399"])
    if cols >= 80:  # room for everything
        words_whole(screen.getvalue(), cols, ["2m04s", "12,345", "1.09M", "1m ago"])


def on_screen(tmp_path, size, *args) -> list[str]:
    """What `charlm ARGS` leaves on a terminal of size (columns, lines), line by line; every line fits."""
    child = charlm_pty(tmp_path, *args, size=size)
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0, child.before
    raw = child.before
    screen = strip_ansi(raw[raw.find("\x1b[?25h") :] if "\x1b[?25h" in raw else raw)  # after the spinner goes
    lines = [line for line in screen.split("\n")]
    lines = lines[:-1] if lines and not lines[-1].strip() else lines
    assert max(map(len, lines)) <= size[0], screen
    return lines


@pytest.mark.parametrize("cols,rows", SIZES)
def test_gates_fits_the_screen_with_as_many_units_as_there_is_room_for(view_runs, cols, rows, tmp_path):
    """Found: at 120×40 gates showed 1 unit (2 at 200×50), though 8 is its default: the fit reserved 6 lines of
    column labels per panel, which a char model's 1-line labels do not need; at 60×20 its scale, sign legend and
    title scrolled off the top. Now the panels stand side by side where the width holds them (8 units at 120×40),
    and a screen too short for one unit of every panel leaves panels out and says which."""
    lines = on_screen(tmp_path, (cols, rows), "gates", view_runs["lstm"], "ROMEO: But soft, what light through yonder")
    screen = "\n".join(lines)
    assert len(lines) + 1 <= rows, screen  # everything on one screen, with the shell's prompt after it
    assert lines[0].startswith("scale:") and "sign: +" in screen and "LSTM layer 1:" in screen
    shown = int(re.search(r"(\d+) of 32 units", screen).group(1))
    assert shown == {60: 1, 80: 1, 120: 8, 200: 8}[cols], screen  # 8: the default
    left_out = "2 panels left out (input, output): | less or a taller terminal shows all"
    assert (left_out in " ".join(screen.split())) == (cols == 60), screen
    assert screen.count("forget gate f") == 1 and screen.count("cell state c:") == 1


@pytest.mark.parametrize("cols,rows", SIZES)
def test_attn_fits_the_screen_and_uses_its_width(view_runs, cols, rows, tmp_path):
    """Found: at 60×20 attn lost its first lines and half its legend off the top (its legends wrap there); at
    200×50 the map used 96 of 200 columns."""
    text = "ROMEO: But soft, what light through yonder"
    lines = on_screen(tmp_path, (cols, rows), "attn", view_runs["tf"], text)
    assert len(lines) + 1 <= rows, "\n".join(lines)  # with the shell's prompt after it
    assert lines[0].startswith("scale:") and any(line.startswith("rows: each token") for line in lines)
    if rows >= 40:  # room for every token: the map widens its cells to the width, or every token is a column
        shown = re.search(r"tokens 0\.\.(\d+) of (\d+)", next(line for line in lines if line.startswith("layer ")))
        every = shown is not None and int(shown[1]) + 1 == int(shown[2])
        assert max(map(len, lines)) >= 0.8 * cols or every and max(map(len, lines)) >= 0.75 * cols, "\n".join(lines)


def test_compare_panels_fold_a_long_word_instead_of_cutting_it(cmp_runs, tmp_path):
    """Found: compare's side-by-side panels cut long "words" with an ellipsis."""
    word = "thecatsatonthematandthedograntothelog" * 2  # 74 characters: longer than a panel at 80 columns
    child = charlm_pty(tmp_path, "compare", cmp_runs["lstm"], cmp_runs["tf"], "-p", word, "-n", "2", size=(80, 24))
    child.expect(pexpect.EOF)
    screen = strip_ansi(re.sub(r"\x1b\[\d*A", "\n", child.before))  # each redraw of the live view on new lines
    last = screen[screen.rfind("╭─ cmp-lstm") :].splitlines()  # the live view's last frame
    panel = [line for line in last if line.startswith("│")]
    assert panel and "…" not in "".join(panel)
    left = "".join(line.split("│")[1].strip() for line in panel)
    assert word in left, screen


@pytest.mark.parametrize("cols,rows", SIZES)
def test_attn_overview_fits_the_screen_and_uses_its_width(view_runs, cols, rows, tmp_path):
    """Found: at 60×20 --overview showed only layers 2-3 (the rest, and its title, scrolled off); at 200×50 it used
    43 columns, with 9-token maps (6 at 120×40): one row of maps per layer. The maps now flow across layers, and a
    screen too short for every layer shows the last ones under the title, and says which were left out."""
    text = "ROMEO: But soft, what light through yonder window breaks?"
    lines = on_screen(tmp_path, (cols, rows), "attn", view_runs["tf"], text, "--overview")
    screen = "\n".join(lines)
    assert len(lines) + 1 <= rows, screen
    assert lines[0].startswith("attention overview") or lines[1].startswith("attention overview")
    assert "L0H0" in screen and "L1H1" in screen  # (2 layers × 2 heads: room for all at 60×20)
    tokens = re.search(r"tokens (\d+)\.\.(\d+)", "\n".join(lines))
    shown = int(tokens.group(2)) - int(tokens.group(1)) + 1
    if cols >= 120:
        assert shown >= 12 and max(map(len, lines)) >= 0.7 * cols, "\n".join(lines)
