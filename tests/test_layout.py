"""Issue 28, "every terminal, every habit": feedback from the first moment, the words and habits of ollama,
llm, git and litgpt, and layouts measured at 60×20, 80×24, 120×40 and 200×50. Each test reproduces a finding
of the issue (it failed on the code before the fix)."""

from __future__ import annotations

import io
import re
import sys

import pexpect
import pytest
from conftest import TINY, charlm_pty, cli, one_line_error, strip_ansi
from rich.console import Console

from charlm.options import AttnConfig
from charlm.views.text import Loading

SIZES = [(60, 20), (80, 24), (120, 40), (200, 50)]


def pty(tmp_path, *args, size=(80, 24)) -> pexpect.spawn:
    """`charlm ARGS` in a real terminal of size (columns, lines)."""
    return charlm_pty(tmp_path, *args, size=size)


# ---- feedback: something on the screen at once ---------------------------------------------------


def test_loading_draws_at_once_on_a_terminal_and_nothing_in_a_pipe():
    screen = io.StringIO()
    with Loading("loading run", Console(file=screen, force_terminal=True, width=60)):
        drawn = screen.getvalue()  # before the block's work: the spinner is already there
    assert "loading run" in drawn
    piped = io.StringIO()
    with Loading("loading run", Console(file=piped, width=60)):
        pass
    assert piped.getvalue() == ""


@pytest.mark.parametrize("command", ["sample", "attn", "eval", "chat"])
def test_model_commands_say_they_are_loading_before_anything_else(command, view_runs, cmp_corpus, tmp_path):
    """Found: chat, compare, eval and sample showed a blank screen for seconds while torch and the model loaded."""
    run = view_runs["tf"]
    args = {
        "sample": ["sample", run, "-p", "ROMEO:", "-n", "5"],
        "attn": ["attn", run, "-p", "ROMEO:"],
        "eval": ["eval", run, cmp_corpus, "--unknown", "drop"],
        "chat": ["chat", run],
    }[command]
    child = pty(tmp_path, *args)
    child.expect("loading")
    assert not re.search(r"\w", strip_ansi(child.before))  # the first thing on the screen (after the spinner)
    if command == "chat":
        child.expect_exact(">>> ")
        child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0, child.before


def test_keys_typed_while_chat_loads_wait_for_the_prompt(view_runs, tmp_path):
    """Found: `hellocharlm chat · …`: keys typed before the banner printed above it."""
    child = pty(tmp_path, "chat", view_runs["tf"], "-n", "3")
    child.expect("loading")
    child.send("hello")  # while the model loads
    child.expect_exact(">>> ")
    assert "hello" not in strip_ansi(child.before)  # not above the banner
    child.expect_exact("hello")  # readline shows it at the prompt
    child.sendline("")
    child.expect_exact(">>> ")
    child.sendeof()
    child.expect(pexpect.EOF)


def test_ctrl_c_leaves_no_caret_c_inside_the_model_text(view_runs, tmp_path):
    """Found: `AUMENI^CUS:`: the terminal echoed ^C into the streamed text."""
    child = pty(tmp_path, "chat", view_runs["tf"], "-n", "100000000", "--seed", "1", size=(120, 40))
    child.expect_exact(">>> ")
    child.sendline("ROMEO:")
    child.expect("[a-z]{3}")  # it is streaming
    child.sendintr()
    child.expect(r"stopped · [\d,]+ tokens")
    assert "^C" not in child.before
    child.expect_exact(">>> ")
    child.sendeof()
    child.expect(pexpect.EOF)


def test_the_eval_bar_says_time_left_from_measured_speed_not_the_warm_up(monkeypatch):
    """Found: LSTM eval showed an ETA of 1m19s that finished in 18 s: the first, warming-up batch set the pace."""
    import charlm.views.eval as view

    clock = iter([130.0, 131.0, 132.0])  # the first batch ends at 130 s (after a warm-up), the next takes 1 s
    monkeypatch.setattr(view.time, "perf_counter", lambda: next(clock))
    screen = io.StringIO()
    with view.EvalProgress(Console(file=screen, force_terminal=True, width=100)) as progress:
        progress(1024, 10240)
        assert "measuring speed" in strip_ansi(screen.getvalue())
        progress(2048, 10240)  # 1024 tokens/s since the first call: 8192 tokens left take 8 s
        assert "8.0s left" in strip_ansi(screen.getvalue())
        progress(3072, 10240)


def test_durations_read_back_every_way_charlm_writes_them():
    from charlm.settings import parse_duration
    from charlm.views.text import duration

    for seconds in (0.4, 9.7, 45, 124, 3900):
        assert parse_duration(duration(seconds)) == pytest.approx(seconds, abs=0.05 if seconds < 10 else 30)
    # what other programs and people write
    for text, seconds in [
        ("1m30s", 90),
        ("2m04s", 124),
        ("0:05:30", 330),
        ("14 s", 14),
        ("2.0m", 120),
        ("1h05m", 3900),
    ]:
        assert parse_duration(text) == seconds, text
    with pytest.raises(ValueError):
        parse_duration("1m30")  # 30 what?


def test_max_time_takes_minutes_and_seconds(tmp_path, cmp_corpus):
    """Found: `--max-time 1m30s` was refused, though `charlm runs` prints durations as 2m04s."""
    from charlm.config import TrainConfig
    from charlm.flags import from_flags

    assert from_flags(TrainConfig, {"max_time": "1m30s"}).max_time == 90
    one_line_error(cli("train", cmp_corpus, "--max-time", "1m30", "--out", tmp_path / "run"), "1m30s")
    assert not (tmp_path / "run").exists()


# ---- habits: the words of ollama, llm, git and litgpt ---------------------------------------------


@pytest.fixture
def chat_session(view_runs):
    """A Chat on the char Transformer, drawing into a string; said(line) -> what it printed."""
    from charlm import checkpoint
    from charlm.commands.chat import Chat
    from charlm.config import SampleConfig

    screen = io.StringIO()
    session = Chat(checkpoint.load(view_runs["tf"]), SampleConfig(), Console(file=screen, width=200), interactive=True)

    def said(line: str) -> str:
        screen.seek(0), screen.truncate()
        session.handle(line)
        return screen.getvalue()

    said.session = session
    return said


@pytest.mark.parametrize(
    "line,setting,value",
    [
        ("/set num_predict 50", "max_tokens", 50),
        ("/set parameter num_predict 50", "max_tokens", 50),
        ("/set repeat_penalty 1.1", "repetition_penalty", 1.1),
        ("/set temp 0.5", "temperature", 0.5),
        ("/set parameter temperature 0.3", "temperature", 0.3),
        ('/set stop "\\n"', "stop", ["\n"]),
        ("/set stop '\\n\\n'", "stop", ["\n\n"]),
        ('/set parameter stop "ROMEO:"', "stop", ["ROMEO:"]),
    ],
)
def test_set_takes_ollamas_words_and_quoted_values(chat_session, line, setting, value):
    """Found: /set num_predict 50, repeat_penalty, temp and /set parameter num_predict all got the same usage line;
    /set stop "\\n" kept the quotes (stop = '"\\n"')."""
    chat_session(line)
    assert getattr(chat_session.session.settings, setting) == value


@pytest.mark.parametrize(
    "line,meant",
    [
        ("/set temprature 0.5", "temperature"),
        ("/set repetiton_penalty 1.2", "repetition_penalty"),
        ("/shwo", "/show"),
        ("/mode contineu", "continue"),
        ("/attn overveiw", "overview"),
        ("/gates", None),  # a transformer has none: says which viewer it has
    ],
)
def test_every_repl_word_mistyped_says_what_it_may_have_meant(chat_session, line, meant):
    out = chat_session(line)
    if meant:
        assert f"did you mean {meant}?" in out, out
    else:
        assert "/attn" in out
    assert len(out.strip().splitlines()) == 1


def test_a_model_is_named_by_its_run_name(view_runs, tmp_path, monkeypatch):
    """Found: `charlm sample tinyshakespeare-transformer-char` (the name charlm runs prints) said "no such
    checkpoint"."""
    import shutil

    monkeypatch.chdir(tmp_path)
    for name, run in [("rhymes-transformer-char", view_runs["tf"]), ("rhymes-lstm-char", view_runs["lstm"])]:
        shutil.copytree(run, tmp_path / "checkpoints" / name)
    r = cli("sample", "rhymes-transformer-char", "-p", "ROMEO:", "-n", "5", "--seed", "1")
    assert r.exit_code == 0 and r.stdout.startswith("ROMEO:"), r.output
    assert cli("info", "rhymes-lstm", "--json").exit_code == 0  # a unique start of a name
    one_line_error(cli("sample", "rhymes", "-p", "x"), "could be 2 runs", "rhymes-lstm-char, rhymes-transformer-char")
    one_line_error(cli("sample", "sonnets", "-p", "x"), "no such checkpoint or run: sonnets", "charlm runs")


def test_load_takes_a_run_name(chat_session, view_runs, tmp_path, monkeypatch):
    import shutil

    monkeypatch.chdir(tmp_path)
    shutil.copytree(view_runs["lstm"], tmp_path / "checkpoints" / "rhymes-lstm-char")
    assert chat_session("/load rhymes-lstm-char").startswith("loaded ")
    assert chat_session.session.ckpt.model_config.kind == "lstm"


def test_the_prompt_may_be_an_argument(view_runs):
    """Found: `charlm sample CKPT "ROMEO:"` -> "Got unexpected extra argument (ROMEO:)"."""
    by_flag = cli("sample", view_runs["tf"], "-p", "ROMEO:", "-n", "20", "--seed", "3")
    by_argument = cli("sample", view_runs["tf"], "ROMEO:", "-n", "20", "--seed", "3")
    assert by_argument.exit_code == 0 and by_argument.stdout == by_flag.stdout
    assert cli("attn", view_runs["tf"], "ROMEO:", "--width", "80").exit_code == 0
    assert cli("gates", view_runs["lstm"], "ROMEO:", "--width", "80").exit_code == 0
    one_line_error(cli("sample", view_runs["tf"], "ROMEO:", "-p", "JULIET:"), "give the text once")


def test_help_command_and_dash_v():
    """Found: `charlm help train` -> "No such command"; `charlm -V` -> "No such option"."""
    r = cli("help", "train")
    assert r.exit_code == 0 and r.stdout == cli("train", "--help").stdout
    assert cli("help").stdout == cli("--help").stdout
    assert cli("-V").exit_code == 0 and cli("-V").stdout == cli("--version").stdout
    one_line_error(cli("help", "trian"), "No such command", "train", code=2)


def test_sample_attn_and_gates_print_json(view_runs):
    """Found: --json was missing for sample, attn and gates (eval, compare, lab and runs have it)."""
    import json

    r = cli("sample", view_runs["tf"], "ROMEO:", "-n", "12", "--seed", "4", "--num-samples", "2", "--json")
    got = json.loads(r.stdout)
    plain = cli("sample", view_runs["tf"], "ROMEO:", "-n", "12", "--seed", "4", "--num-samples", "2").stdout
    assert got["prompt"] == "ROMEO:" and [s["tokens"] for s in got["samples"]] == [12, 12]
    assert plain == "".join(f"ROMEO:{s['text']}\n" + ("---\n" if i == 0 else "") for i, s in enumerate(got["samples"]))

    att = json.loads(cli("attn", view_runs["tf"], "ROMEO: But", "--json").stdout)
    assert "".join(att["tokens"]) == "ROMEO: But" and len(att["weights"]) == len(att["tokens"])
    for row in att["weights"]:  # each query's weights over the tokens it could see sum to 1
        assert sum(row) == pytest.approx(1, abs=1e-3)
    assert len(att["heads"]) == 2 * 2  # 2 layers × 2 heads

    g = json.loads(cli("gates", view_runs["lstm"], "ROMEO: But", "--units", "3", "--json").stdout)
    assert len(g["units"]) == 3 and set(g["values"]) >= {"forget", "input", "output", "cell_state"}
    for name in ("forget", "input", "output"):  # sigmoids: between 0 and 1
        assert all(0 <= v <= 1 for unit in g["values"][name] for v in unit)
        assert all(len(unit) == len(g["tokens"]) for unit in g["values"][name])


def test_a_flag_for_another_kind_of_model_is_not_silently_ignored(tmp_path, cmp_corpus):
    """Found: `--model lstm --heads 4` trained an LSTM without a word about --heads."""
    r = cli("train", cmp_corpus, *TINY, "--model", "lstm", "--heads", "4", "--steps", "2", "--out", tmp_path / "run")
    assert r.exit_code == 0, r.output
    assert "--heads applies to transformer runs only: ignored for this lstm run" in r.stderr


def test_compare_prompt_help_says_its_default_once():
    """Found: compare -p's help said `[default: none]. [default: ""]`."""
    out = " ".join(cli("compare", "--help").stdout.split())
    assert "[default: none]." in out and '[default: ""]' not in out


def test_a_prompt_longer_than_the_context_is_cut_with_a_word_and_the_counter_is_honest(chat_session, view_runs):
    """Found: sample and chat cut a prompt longer than the context without a word; chat showed `context 65/64`
    and /show `running text 65 tokens` after a 146-token turn."""
    long = "ROMEO: " + "But soft, what light through yonder window breaks? " * 2  # 109 chars; context 48
    chat_session("/set max_tokens 5")
    out = chat_session(long)
    assert "the prompt is 109 tokens: the model sees its last 48 (its context)" in out
    assert "context: the last 48 of 114 tokens" in " ".join(out.split())
    assert re.search(r"running text\s+114 tokens \(the model sees the last 48\)", chat_session("/show"))
    short = chat_session("ROMEO:")
    assert "context 11/48" in short and "sees its last" not in short
    r = cli("sample", view_runs["tf"], long, "-n", "3")
    assert r.exit_code == 0 and "the prompt is 109 tokens: the model sees its last 48" in r.stderr
    assert "sees its last" not in cli("sample", view_runs["tf"], "ROMEO:", "-n", "3").stderr


def test_the_readme_says_to_install_cpu_torch_before_the_command_it_must_precede():
    """Found: the note on the CPU build of PyTorch came after the command it must precede."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    setup = readme.split("## Set-up", 1)[1]
    assert setup.index("download.pytorch.org/whl/cpu") < setup.index("pip install -e . && charlm train")


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
    from charlm import checkpoint
    from charlm.commands.chat import Chat
    from charlm.config import SampleConfig

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
    child = pty(tmp_path, *args, size=size)
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


def test_attn_says_when_a_rows_largest_weight_is_left_of_the_window(view_runs):
    """Found: a row shaded against a maximum outside the visible window looked faint, and nothing said why."""
    from charlm import checkpoint
    from charlm.commands.look import attention
    from charlm.options import AttnConfig
    from charlm.views.attention import map_lines
    from charlm.views.heatmap import Screen

    ck = checkpoint.load(view_runs["tf"])
    ids = ck.tokenizer.encode("ROMEO: But soft, what light through yonder window breaks?")
    marks = []
    for tokens in (8, 30):
        opts = AttnConfig(tokens=tokens)
        att = attention(ck.model, ck.tokenizer, ids, opts)
        lines = [line.plain for line in map_lines(ck.tokenizer, att, opts, Screen(100))]
        first = len(ids) - tokens - att.offset  # the window's first row, counted in the model's view
        w = att.chosen
        off = [att.offset + i for i in range(first, len(w)) if int(w[i, : i + 1].argmax()) < first]
        marked = [int(m.group(1)) for line in lines if (m := re.match(r"^\s*(\d+) .*←\d\.\d\d$", line))]
        assert marked == off, "\n".join(lines)
        assert ("←: the row's largest weight is on a token left of the window" in lines) == bool(off)
        marks.append(bool(off))
    assert any(marks)  # the case the finding is about does occur here


def test_compare_panels_fold_a_long_word_instead_of_cutting_it(cmp_runs, tmp_path):
    """Found: compare's side-by-side panels cut long "words" with an ellipsis."""
    word = "thecatsatonthematandthedograntothelog" * 2  # 74 characters: longer than a panel at 80 columns
    child = pty(tmp_path, "compare", cmp_runs["lstm"], cmp_runs["tf"], "-p", word, "-n", "2", size=(80, 24))
    child.expect(pexpect.EOF)
    screen = strip_ansi(re.sub(r"\x1b\[\d*A", "\n", child.before))  # each redraw of the live view on new lines
    last = screen[screen.rfind("╭─ cmp-lstm") :].splitlines()  # the live view's last frame
    panel = [line for line in last if line.startswith("│")]
    assert panel and "…" not in "".join(panel)
    left = "".join(line.split("│")[1].strip() for line in panel)
    assert word in left, screen


def test_gates_ascii_glyphs_mean_one_thing_each(view_runs):
    """Found: in gates --ascii, - and + meant middling gate values in the gate panels and a sign in the sign legend;
    _ was both the space label and the strongest negative value."""
    from charlm.views.heatmap import GATES_ASCII_RAMP, SIGNED_RAMPS

    out = cli("gates", view_runs["lstm"], "To be, or not", "--ascii", "--units", "3", "--width", "100").stdout
    pos, neg = SIGNED_RAMPS[True]
    assert not (set(GATES_ASCII_RAMP) - set(" .@")) & set(pos + neg)  # faint . and strongest @ alike in both
    assert "_" not in pos + neg and "_" in out  # _ is the space label only
    assert "scale: " + GATES_ASCII_RAMP[1:] in out and "sign: + " + pos[1:] + "  - " + neg[1:] in out


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


def test_attn_overview_leaves_out_the_first_layers_on_a_short_screen():
    """Found: at 60×20 --overview of a 4-layer, 4-head model showed only layers 2-3, and its title scrolled off. Now
    the title stays, the last layers that fit are shown, and a hint names those left out."""
    import numpy as np

    from charlm.models.probes import Attention, head_stats
    from charlm.tokenizer import CharTokenizer
    from charlm.views.attention import overview_lines
    from charlm.views.heatmap import Screen, height_of

    tok = CharTokenizer(sorted(set("ROMEO: But soft, what light through yonder")))
    ids = tok.encode("ROMEO: But soft, what light through yonder")
    T = len(ids)
    w = np.tril(np.ones((T, T))) / np.arange(1, T + 1)[:, None]  # each token looks evenly at all it sees
    weights = np.broadcast_to(w, (4, 4, T, T)).astype(np.float32)
    att = Attention(ids, 0, weights, head_stats(weights), 3, None, None)
    for (cols, rows), hidden in (((60, 20), "layers 0..2"), ((80, 24), None), ((120, 40), None)):
        lines = overview_lines(tok, att, AttnConfig(overview=True), Screen(cols, rows))
        screen = "\n".join(line.plain for line in lines)
        assert height_of(lines, cols) + 1 <= rows, screen  # with the shell's prompt after it
        assert lines[0].plain.startswith("attention overview: 4 layers × 4 heads"), screen
        hint = f"{hidden} of 4 left out (no room): | less or a taller terminal shows all"
        titles = " ".join(line.plain for line in lines if line.plain.startswith("L"))  # the maps' titles
        assert (hint in screen) == bool(hidden) and ("L0H0" in titles) == (not hidden) and "L3H3" in titles


def test_the_command_line_draws_before_numpy_or_torch_load():
    """What runs before the first spinner frame: the command line itself, which imported numpy (0.2-0.6 s on a
    busy 2-core machine) through charlm.commands' error list."""
    import subprocess

    probe = "import sys, charlm.cli; print(sorted(m for m in ('numpy', 'torch') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_compare_of_char_and_bpe_writes_texts_as_long_and_says_what_n_counts(cmp_runs):
    """Found: -n counts tokens, so compare of a char and a BPE model showed panels of very different lengths. When
    the models' tokens differ, -n counts characters (compare --help and the notes say so); otherwise tokens."""
    import json

    mixed = json.loads(cli("compare", cmp_runs["tf"], cmp_runs["bpe"], "-p", "the cat", "-n", "20", "--json").stdout)
    assert [m["chars"] for m in mixed["models"]] == [20, 20] and mixed["max_tokens_counts"] == "characters"
    tf, bpe = mixed["models"]
    assert tf["tokens"] == 20 and bpe["tokens"] < 20  # a BPE token holds several characters
    r = cli("compare", cmp_runs["tf"], cmp_runs["bpe"], "-p", "the cat", "-n", "20", "--seed", "1")
    notes = " ".join(r.stdout.split())
    assert "--max-tokens 20 counts characters here (the models' tokens differ in size)" in notes
    same = cli("compare", cmp_runs["tf"], cmp_runs["lstm"], "-p", "the cat", "-n", "20", "--seed", "1", "--json")
    assert json.loads(same.stdout)["max_tokens_counts"] == "tokens" and "counts" not in same.stderr
    assert "--max-tokens counts characters" in " ".join(cli("compare", "--help").stdout.split())


# ---- plain lines: Rich wraps prose at spaces, commands break between words ------------------------

LONG_RUN = "checkpoints/tinyshakespeare-transformer-char-2nd-try"


def training_screen(cols: int, tmp_path, monkeypatch) -> tuple[str, object]:
    """What the training view prints on a terminal `cols` wide, with the console `charlm train` makes (soft_wrap:
    a log line in a pipe stays whole): the header, an evaluation with its sample, the summary of a run on a busy
    CPU that barely learned."""
    from conftest import tiny_train

    from charlm.config import ModelConfig
    from charlm.events import Evaluated, Result, Started, Stepped
    from charlm.views.progress import TrainView

    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1}, raising=False)
    screen = io.StringIO()
    view = TrainView(Console(file=screen, width=cols, height=40, force_terminal=True, soft_wrap=True), corpus="my.txt")

    def bar_elsewhere():  # the live bar redraws itself in place: draw it apart from the lines printed
        from rich.progress import Progress

        if view.progress is None:
            view.progress = Progress(console=Console(file=io.StringIO()))
            view.progress.start()
        return view.progress

    view._ensure_progress = bar_elsewhere
    cfg = tiny_train(50)
    view(Started(out_dir=LONG_RUN, device="cpu", params=1000, model_config=ModelConfig(vocab_size=65),
                 train_config=cfg, start_step=0, train_tokens=1000, val_tokens=100, vocab_size=65))  # fmt: skip
    for step in range(1, 21):
        view(Stepped(step=step, loss=4.0, lr=1e-3, tokens_per_s=5000.0, elapsed=step / 10, load=9.0))
    sample = "ROMEO:\nBut soft, what light through yonder window breaks? " * 6
    view(Evaluated(step=20, train_loss=4.0, val_loss=4.0, val_bpc=5.8, is_best=True, sample=sample))
    view.finish(Result(out_dir=LONG_RUN, step=20, stopped="steps", train_seconds=2.0, best_val_loss=4.0,
                       best_val_bpc=5.8, last_val_loss=4.0, params=1000))  # fmt: skip
    return strip_ansi(screen.getvalue()), view


def commands_in(lines: list[str]) -> list[str]:
    """The shell commands on a screen, their ' \\' continuation lines joined as a shell reads them."""
    found, current = [], ""
    for line in lines:
        if current or line.startswith("  charlm ") or line.startswith("resume with: charlm"):
            current += line.strip().removeprefix("resume with: ") if not current else " " + line.strip()
            if current.endswith(" \\"):
                current = current[:-2]
            else:
                found.append(current)
                current = ""
    return found


@pytest.mark.parametrize("cols", [60, 120])
def test_training_prose_wraps_at_spaces_and_commands_break_between_words(cols, tmp_path, monkeypatch):
    """Found: train's lines were wrapped by the terminal mid-word at every width (`…tinyshakespeare-transf⏎ormer-char`
    at 120 columns, `Train again w⏎hen`), and at 60 columns the commands meant to be copied broke
    (`--out checkpoints⏎/tinyshakespeare-lstm-char`); the samples at each evaluation overflowed even 200 columns."""
    out, _ = training_screen(cols, tmp_path, monkeypatch)
    lines = out.splitlines()
    assert max(map(len, lines)) <= cols, out  # nothing left for the terminal to wrap
    words = set(out.split())
    for word in ["quieter,", "Train", "again", "when", "barely", "started", LONG_RUN]:
        assert word in words, (word, out)  # each one whole
    run = LONG_RUN
    assert commands_in(lines) == [
        f"charlm train my.txt --out {run} --resume --max-time 10m",
        f"charlm chat {run}",
        f'charlm sample {run} --prompt "..."',
        f"charlm info {run}",
    ], out
    preview = [line for line in lines if line.startswith("  ROMEO:")]
    assert len(preview) == 1 and preview[0].endswith("…"), out  # the evaluation's sample: one line, cut


def test_the_resume_command_after_ctrl_c_breaks_between_words(tmp_path):
    """Found with the above: the resume command printed after Ctrl-C broke mid-path at 60 columns."""
    from charlm.events import TrainingInterrupted
    from charlm.views.progress import TrainView

    resume = f"charlm train 'my corpus.txt' --out {LONG_RUN} --resume"
    for cols in (60, 120):
        screen = io.StringIO()
        view = TrainView(Console(file=screen, width=cols, force_terminal=True, soft_wrap=True))
        view.interrupted(TrainingInterrupted(None, out_dir=LONG_RUN, saved_step=5), resume)
        lines = strip_ansi(screen.getvalue()).splitlines()
        assert max(map(len, lines)) <= cols and commands_in(lines) == [resume], lines
    piped = io.StringIO()  # a log keeps it on one line, as long as it is
    TrainView(Console(file=piped, width=60, soft_wrap=True)).interrupted(
        TrainingInterrupted(None, out_dir=LONG_RUN, saved_step=5), resume
    )
    assert f"resume with: {resume}\n" in piped.getvalue()


def test_plot_writes_training_time_as_every_other_output_does():
    """Found: one kind of duration was written six ways, `123.805` on plot's time axis among them."""
    from charlm.views.runs import loss_chart

    for n in (5, 30):  # the measured times as ticks (a few points), or evenly spaced ones
        points = [
            {"step": k, "elapsed": 123.805 * k / (n - 1), "train_loss": 2.0, "val_loss": 2.1, "val_bpc": 3.0}
            for k in range(n)
        ]
        chart = loss_chart({"run": points}, x="time", width=70, height=12, color=False)
        assert "2m04s" in chart and "123.8" not in chart and "training time" in chart, chart


def test_a_command_broken_to_fit_reads_back_as_the_same_words():
    """command_lines breaks only between words: the shell reads the lines (joined at their ' \\') as the words of
    the command, for paths with spaces, quotes and escapes alike, at every width."""
    import shlex

    from charlm.views.text import command_lines, shell_quote

    paths = ["checkpoints/run", "my runs/a b", "it's here", "tab\there", "[bold]x", "é/ü 3"]
    for path in paths:
        command = f"charlm train {shell_quote(path + '.txt')} --out {shell_quote(path)} --resume --max-time 10m"
        for width in (20, 40, 60, 200):
            lines = command_lines(command, width)
            joined = "\n".join(lines).replace(" \\\n", " ")
            if "\t" not in path:  # ($'...' is bash's, not shlex's)
                assert shlex.split(joined) == shlex.split(command), lines
            assert joined.split() == command.split(), lines  # whole words, in order
            too_long = [line for line in lines if len(line) > width]  # only a word longer than a line stands alone
            assert all(len(shlex.split(line.strip().removesuffix(" \\"))) == 1 for line in too_long), lines


def test_the_bar_shows_the_final_evaluation_not_the_one_before():
    """Found: after the final evaluation the progress bar still showed the stale `val 3.874`."""
    from conftest import tiny_train

    from charlm.config import ModelConfig
    from charlm.events import Evaluated, Started, Stepped
    from charlm.views.progress import TrainView

    view = TrainView(Console(file=io.StringIO(), width=120, force_terminal=True))
    view(Started(out_dir="run", device="cpu", params=1000, model_config=ModelConfig(vocab_size=65),
                 train_config=tiny_train(50), start_step=0, train_tokens=1000, val_tokens=100, vocab_size=65))  # fmt: skip
    view(Stepped(step=25, loss=3.9, lr=1e-3, tokens_per_s=5000.0, elapsed=1.0))
    view(Evaluated(step=25, train_loss=3.9, val_loss=3.874, val_bpc=5.6, is_best=True))
    view(Stepped(step=50, loss=2.6, lr=1e-3, tokens_per_s=5000.0, elapsed=2.0))
    view(Evaluated(step=50, train_loss=2.6, val_loss=2.512, val_bpc=3.6, is_best=True))  # the last one: no step after
    info = view.progress.tasks[view.train_task].fields["info"]
    view.close()
    assert "val 2.512" in info and "3.874" not in info, info


@pytest.mark.parametrize("cols", [60, 80, 120])
def test_the_training_bar_leaves_words_out_rather_than_cut_them(cols):
    """Found with the audit: at 60 columns the live bar read `sam… step 14 · loss 3.982 · val 3.981 (5.74 bpc) ·
    30,480 …` (its label and the speed cut). Its words now fit the room the bar leaves them: the speed, then the
    loss left out."""
    import re

    from charlm.views.progress import TrainView

    for label in ("training", "evaluating"):
        console = Console(file=io.StringIO(), width=cols, force_terminal=True, color_system=None)
        view = TrainView(console)
        view.train_task = view._ensure_progress().add_task(label, total=100, info="", completed=50)
        view.last_step, view.tps, view.last_val = (1206, 1.479), 10731.0, " · val 1.666 (2.40 bpc)"
        view.progress.update(view.train_task, info=view._bar_info())
        view.progress.refresh()
        view.close()
        screen = strip_ansi(re.sub(r"\r", "\n", console.file.getvalue()))
        bar = [line for line in screen.splitlines() if line.strip()][-1]
        assert "…" not in bar and bar.startswith(label) and "step 1206 · " in bar and "val 1.666 (2.40 bpc)" in bar
        assert ("10,731 tok/s" in bar) == (cols >= 120) and ("loss 1.479" in bar) == (cols >= 80), bar


@pytest.mark.parametrize("cols", [60, 80, 120])
def test_the_eval_bar_keeps_its_numbers_whole(cols):
    """Found with the audit: at 60 and 80 columns compare --eval's bar read `eval tinyshakespeare-… tokens ·…`: the
    counts and the time left were cut. The numbers now stay whole; a long label gives way, with an ellipsis."""
    import re
    import time

    from charlm.views.eval import EvalProgress

    for label in ("evaluating", "eval tinyshakespeare-transformer-char"):
        console = Console(file=io.StringIO(), width=cols, force_terminal=True, color_system=None)
        bar = EvalProgress(console, label)
        bar(100, 100_000)
        time.sleep(0.02)
        bar(2_000, 100_000)
        bar.__exit__(None, None, None)
        screen = strip_ansi(re.sub(r"\r", "\n", console.file.getvalue()))
        line = [line for line in screen.splitlines() if line.strip()][-1]
        assert re.search(r"2,000/100,000 tokens · \d+(\.\d)?s left$", line), line
        assert line.startswith(label) or (cols < 80 and line.startswith(label[:10]) and "…" in line), line
