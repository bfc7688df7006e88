"""`charlm explore` (issue 29): the app driven through Textual's own harness (App.run_test and its pilot:
keys, clicks, resizes), checked against independent references: the attention shown against
models/probes.py's capture_attention on the same window, the head labels against `lab heads`' scoring, a
knock-out's bits/char change against `lab ablate`'s, the gates against `charlm gates`' trace, the
surprisal against a plain forward pass. Snapshots of the screen at three sizes (pytest-textual-snapshot) use
seeded untrained models, so they hold on any CPU."""

from __future__ import annotations

import asyncio
import html
import io
import json
import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

from charlm.commands import explore as ex
from charlm.commands.look import gates as trace_gates_view
from charlm.config import ModelConfig
from charlm.lab import ablate, heads
from charlm.models import build_model
from charlm.models.inspect import nats
from charlm.models.probes import capture_attention, trace_rnn, zero_units
from charlm.options import GatesConfig
from charlm.storage import checkpoint
from charlm.tokenizer import CharTokenizer
from tests.conftest import VIEW_TEXT, charlm_pty, cli, one_line_error

textual = pytest.importorskip("textual")
from textual.widgets import Input  # noqa: E402

from charlm.explore.app import ExploreApp  # noqa: E402
from charlm.explore.widgets import TextPane, num  # noqa: E402

SHORT = "ROMEO:\nBut soft, what light\nthrough yonder window breaks?"  # 55 characters: over the context of 48
TWO_LINES = "ROMEO:\nBut soft, what light"  # 26: one window


def drive(app: ExploreApp, *keys: str, size=(100, 30), then=None):
    """Run the app headless at `size`, press keys, then call then(app, pilot) (an async function or None)."""

    async def go():
        async with app.run_test(size=size) as pilot:
            await pilot.pause()
            await pilot.press(*keys)
            await pilot.pause()
            if then is not None:
                await then(app, pilot)

    asyncio.run(go())
    return app


@pytest.fixture(scope="module")
def loaded(view_runs):
    return {name: checkpoint.load(path) for name, path in view_runs.items()}


def new_app(ck, text: str) -> ExploreApp:
    return ExploreApp(ck.model, ck.tokenizer, ck.tokenizer.encode(text), name="run", unknown="error")


# ---- Transformer: what the screen shows equals the probes' numbers ----------------------------------------


@pytest.mark.parametrize("kind", ["tf", "bpe"])
def test_attention_shown_is_the_probe_s_for_that_query(loaded, kind):
    """The cursor token's shading is its attention row in the selected layer and head, exactly as
    probes.capture_attention gives it for the window that token is read in (here a text over the context)."""
    ck = loaded[kind]
    text = VIEW_TEXT[:160]
    app = new_app(ck, text)
    ids, ctx = app.scene.ids, ck.model_config.context
    assert len(ids) > ctx  # read in more than one window

    async def check(app, pilot):
        for keys, layer, head in [((), 1, 0), (("up",), 0, 0), (("right_square_bracket",), 0, 1), (("a",), 0, None)]:
            await pilot.press(*keys, *["left"] * 7)
            await pilot.pause()
            assert (app.view.layer_no, app.view.head) == (layer, head)
            i = app.cursor
            a = int(app.scene.seen_from[i])  # the window i is read in
            assert i - a >= ctx // 2 - 1 or a == 0  # it sees at least half a context
            offset, w = capture_attention(ck.model, ids[: a + ctx])  # the probe's own window ending there
            assert offset == a
            row = w[layer, :, i - offset] if head is None else w[layer, head, i - offset]
            row = row.mean(axis=0) if head is None else row
            shown = app.view.values(app.cursor)
            np.testing.assert_allclose(shown[a : i + 1], row[: i + 1 - a], atol=1e-6)
            assert shown[:a].sum() == 0 and shown[i + 1 :].sum() == 0
            top, weight = app.scene.top_keys(i, layer, head)[0]
            assert f"@{top} {num(weight)}" in str(app.query_one("#panel").render())

    drive(app, then=check)


def test_direction_flips_to_the_tokens_that_looked_at_it(loaded):
    ck = loaded["tf"]
    app = new_app(ck, VIEW_TEXT[:120])
    ids, ctx = app.scene.ids, ck.model_config.context

    async def check(app, pilot):
        await pilot.press("home")
        pane = app.query_one(TextPane)
        lines = pane.lines(pane.content_size.width)
        y = pane.line_of(lines, 50)
        x = sum(len(piece) for t, piece in lines[y] if t < 50)
        await pilot.click(TextPane, offset=(1 + x, y - pane.top))  # token 50, by a click
        await pilot.press("d")
        await pilot.pause()
        j = app.cursor
        assert (j, app.view.looking) == (50, "from")
        shown = app.view.values(app.cursor)
        probes = {}  # one probe a window
        for q in range(len(ids)):
            a = int(app.scene.seen_from[q])
            if q < j or a > j:
                assert shown[q] == 0
                continue
            if a not in probes:
                probes[a] = capture_attention(ck.model, ids[: a + ctx])
            offset, w = probes[a]
            assert shown[q] == pytest.approx(
                float(w[app.view.layer_no, app.view.head, q - offset, j - offset]), abs=1e-6
            )

    drive(app, then=check)


def test_head_labels_are_lab_heads_scores_on_its_probe(loaded):
    """On lab heads' own probe (P distinct tokens, twice), the explorer's scores of every head equal
    lab.heads.score_heads', and so do the roles."""
    ck = loaded["tf"]
    P = 20
    half = list(range(1, P + 1))
    ids = half + half
    s = ex.scene(ck.model, ck.tokenizer, ids)
    _, weights = capture_attention(ck.model, ids)
    ref = heads.score_heads(weights, P)
    for mine, theirs in zip(s.labels, ref):
        assert (mine.layer, mine.head) == (theirs["layer"], theirs["head"])
        for key in ("previous", "induction", "distance", "entropy"):
            assert getattr(mine, key) == pytest.approx(theirs[key], abs=6e-5), key  # (records keep 4 decimals)
        assert mine.role == theirs["role"]


def test_a_hand_made_previous_token_head_is_labelled_so():
    """Attention that puts all weight on the token before (a previous-token head) and attention spread
    evenly are told apart, with lab heads' names."""
    n, C = 30, 30
    rows = np.zeros((n, 1, 2, C), dtype=np.float32)
    for i in range(n):
        rows[i, 0, 0, max(0, i - 1)] = 1.0
        rows[i, 0, 1, : i + 1] = 1.0 / (i + 1)
    labels = ex.head_scores(rows, np.zeros(n, dtype=int), list(range(n)))
    assert [lab.role for lab in labels] == ["previous-token", "global"]
    assert labels[0].previous == pytest.approx(1.0) and labels[0].distance == pytest.approx(1.0)


def test_surprisal_and_predictions_are_the_model_s(loaded):
    ck = loaded["tf"]
    app = new_app(ck, TWO_LINES)
    ids = app.scene.ids

    async def check(app, pilot):
        await pilot.press("left", "left")
        await pilot.pause()
        i = app.cursor
        with torch.no_grad():
            logits = ck.model(torch.tensor([ids]))[0][0]
        logp = torch.log_softmax(logits.float(), dim=-1)
        bits = -float(logp[i - 1, ids[i]]) / math.log(2)
        assert app.scene.surprisal_bits()[i] == pytest.approx(bits, abs=1e-4)
        best = int(logp[i].argmax())
        assert app.scene.predictions(i)[0] == (best, pytest.approx(float(logp[i].exp()[best]), abs=1e-5))
        panel = str(app.query_one("#panel").render())
        assert f"surprisal {bits:.2f} bits" in panel
        await pilot.press("s")
        assert app.mode == "surprisal"
        shade = app.shading()
        assert np.argmax(shade[1:]) + 1 == int(np.nanargmax(app.scene.surprisal_bits()))

    drive(app, then=check)


def test_knock_out_matches_lab_ablate(loaded, tmp_path):
    """x on L1H1 shows the bits/char change `lab ablate` measures for that head on the same text (one window
    of the whole text: --rows 1), and shades where the loss rose."""
    ck = loaded["tf"]
    text = VIEW_TEXT[:40]
    (tmp_path / "t.txt").write_text(text, encoding="utf-8")
    app = new_app(ck, text)

    async def check(app, pilot):
        await pilot.press("right_square_bracket", "x")
        await pilot.pause()
        assert (app.view.layer_no, app.view.head, app.mode) == (1, 1, "knockout")
        result = ablate.run(str(ck.path), text=str(tmp_path / "t.txt"), rows=1)
        theirs = next(r for r in result.results if r["layer"] == 1 and r["part"] == "head 1")
        assert app.knocked.change == pytest.approx(theirs["damage"], abs=1e-4)
        assert app.scene.bpc == pytest.approx(result.settings["baseline_bits_per_char"], abs=1e-3)
        assert f"({app.knocked.change:+.3f})" in str(app.query_one("#note").render())
        screen = re.sub(r"\s", "", svg_text(app.export_screenshot()))
        assert "lossrosemostat" in screen  # on screen, not cut off (the panel wraps it)
        rise = np.clip(app.knocked.rise, 0, None)
        assert np.argmax(app.shading()) == (np.argmax(rise) + 1 if rise.max() > 0 else 0)
        await pilot.press("a", "x")  # the mean: nothing to knock out
        assert app.knocked is None

    drive(app, then=check)


# ---- keys, mouse, edits, windows and sizes -------------------------------------------------------------


def test_keys_move_the_cursor_layer_and_head(loaded):
    app = new_app(loaded["tf"], SHORT)
    n = len(app.scene.ids)

    async def check(app, pilot):
        assert (app.cursor, app.view.layer_no, app.view.head) == (n - 1, 1, 0)
        await pilot.press("home")
        assert app.cursor == 0
        await pilot.press("left", "right", "right")
        assert app.cursor == 2
        await pilot.press("end", "right")
        assert app.cursor == n - 1
        await pilot.press("down", "up", "up", "up")
        assert app.view.layer_no == 0
        await pilot.press(*["right_square_bracket"] * 3)
        assert app.view.head == 1
        await pilot.press("a")
        assert app.view.head is None and "mean of the layer's heads" in str(app.query_one("#grid").render())
        await pilot.press("a", "d", "d")
        assert (app.view.head, app.view.looking) == (0, "to")
        await pilot.press("question_mark")
        await pilot.pause()
        assert type(app.screen).__name__ == "Help"
        await pilot.press("space")
        await pilot.pause()
        assert type(app.screen).__name__ != "Help"
        await pilot.press("q")
        await pilot.pause()
        assert app.return_code == 0

    drive(app, then=check)


def test_a_click_moves_the_cursor_to_that_token(loaded):
    app = new_app(loaded["tf"], TWO_LINES)

    async def check(app, pilot):
        await pilot.click(TextPane, offset=(1 + 3, 0))  # the pane's padding, then 'E' of ROMEO
        await pilot.pause()
        assert app.cursor == 3
        await pilot.click(TextPane, offset=(1 + 4, 1))  # second line: 'soft'... its 5th character
        await pilot.pause()
        assert app.cursor == len("ROMEO:\n") + 4

    drive(app, then=check)


def test_a_click_on_the_head_grid_selects_that_head(loaded):
    app = new_app(loaded["tf"], TWO_LINES)

    async def check(app, pilot):
        cell = app.view.cell_width()
        await pilot.click("#grid", offset=(1 + 4 + cell + 2, 2))  # padding, 'L0  ', then into the second cell
        await pilot.pause()
        assert (app.view.layer_no, app.view.head) == (0, 1)
        await pilot.click("#grid", offset=(1 + 4 + 2, 3))  # (rows 0, 1: the title, H0 H1)
        await pilot.pause()
        assert (app.view.layer_no, app.view.head) == (1, 0)

    drive(app, then=check)


def test_edit_re_runs_the_text(loaded):
    ck = loaded["tf"]
    app = new_app(ck, TWO_LINES)

    async def check(app, pilot):
        await pilot.press("e")
        await pilot.pause()
        box = app.query_one(Input)
        assert box.display and box.value == TWO_LINES.replace("\n", "⏎")  # the one-line editor's newlines
        box.value = "JULIET:\\nO Romeo"  # \n typed: a newline, as ⏎
        await pilot.press("enter")
        await pilot.pause()
        assert app.scene.ids == ck.tokenizer.encode("JULIET:\nO Romeo")
        assert not box.display and app.cursor == len(app.scene.ids) - 1
        await pilot.press("e", "escape")  # Esc: nothing changes
        assert app.scene.ids == ck.tokenizer.encode("JULIET:\nO Romeo") and not app.prompting
        await pilot.press("e")
        box.value = "O Romeo€"  # a character the model never saw (--unknown error): a message, no change
        await pilot.press("enter")
        await pilot.pause()
        assert app.scene.ids == ck.tokenizer.encode("JULIET:\nO Romeo") and app.is_running
        # issue 37: said in the app (no command-line flags), the typed text kept in the editor to be put right
        note = str(app.query_one("#note").render())
        assert "never saw '€'" in note and "--unknown" not in note
        assert box.display and box.value == "O Romeo€" and app.prompting == "edit"
        box.value = "O Romeo"
        await pilot.press("enter")
        await pilot.pause()
        assert app.scene.ids == ck.tokenizer.encode("O Romeo") and not box.display and not app.message

    drive(app, then=check)


def test_a_long_text_windows_with_the_cursor_and_says_what_the_model_sees(loaded):
    """A text longer than the context: every token sees between half a context and a context; the text pane
    scrolls to keep the cursor on screen at 80 × 24."""
    ck = loaded["tf"]
    app = new_app(ck, VIEW_TEXT[:1200])
    ctx = ck.model_config.context
    seen = np.arange(len(app.scene.ids)) - app.scene.seen_from
    assert seen.max() == ctx - 1 and seen[ctx:].min() >= ctx // 2

    async def check(app, pilot):
        pane = app.query_one(TextPane)
        assert "windows of 48" in str(app.query_one("#title").render())
        assert f"sees {app.scene.seen_from[app.cursor]}..{app.cursor}" in str(app.query_one("#panel").render())
        await pilot.press("home")
        await pilot.pause()
        assert pane.top == 0
        await pilot.press("end")
        await pilot.pause()
        lines = pane.lines(pane.content_size.width)
        assert pane.top <= pane.line_of(lines, app.cursor) < pane.top + pane.content_size.height
        assert pane.top > 0

    drive(app, size=(80, 24), then=check)


def test_the_screen_resizes_live(loaded):
    app = new_app(loaded["tf"], VIEW_TEXT[:400])

    async def check(app, pilot):
        for size in [(200, 50), (80, 24), (120, 40)]:
            await pilot.resize_terminal(*size)
            await pilot.pause()
            assert app.size == size
            pane = app.query_one(TextPane)
            lines = pane.lines(pane.content_size.width)
            assert max(sum(len(p) for _, p in line) for line in lines) <= pane.content_size.width
            assert pane.top <= pane.line_of(lines, app.cursor) < pane.top + pane.content_size.height

    drive(app, then=check)


# ---- LSTM / GRU -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_gate_values_shown_are_charlm_gates(loaded, kind):
    ck = loaded[kind]
    app = new_app(ck, SHORT)
    ids = app.scene.ids

    async def check(app, pilot):
        await pilot.press("left_square_bracket", "down", "down", *["left"] * 5)
        await pilot.pause()
        assert app.view.layer_no == 0 and app.view.unit == app.view.order[2]
        ref = trace_gates_view(ck.model, ids, GatesConfig(layer=0)).trace
        t, u = app.cursor, app.view.unit
        shown = app.view.values_at(app.cursor)
        for name, v in ref.gates.items():
            assert shown[name] == pytest.approx(float(v[0, t, u]), abs=1e-6)
        assert shown["hidden"] == pytest.approx(float(ref.h[0, t, u]), abs=1e-6)
        if kind == "lstm":
            assert shown["cell state"] == pytest.approx(float(ref.c[0, t, u]), abs=1e-6)
        panel = str(app.query_one("#panel").render())
        first = next(iter(ref.gates))
        assert f"{first} {float(ref.gates[first][0, t, u]):.2f}" in panel
        # g cycles what shades the text: the shading is that quantity of the unit
        quantities, before = app.scene.quantities, app.view.quantity
        await pilot.press("g")
        assert app.view.quantity == quantities[(quantities.index(before) + 1) % len(quantities)]
        values = app.scene.values(0, app.view.quantity)[:, u]
        scale = np.abs(values).max() if app.view.quantity in ("cell", "new", "cell state", "hidden") else 1.0
        np.testing.assert_allclose(app.shading() * scale, values, atol=1e-6)

    drive(app, then=check)


def test_search_finds_the_unit_that_follows_the_line_position(loaded):
    """`/line` selects the unit whose memory (its cell state) correlates most with the characters since the
    last newline, computed here with numpy's corrcoef."""
    ck = loaded["lstm"]
    app = new_app(ck, VIEW_TEXT[:300])
    text = ck.tokenizer.decode(app.scene.ids)
    col, c = [], 0
    for ch in text:
        col.append(c)
        c = 0 if ch == "\n" else c + 1

    async def check(app, pilot):
        await pilot.press("slash", *"line", "enter")
        await pilot.pause()
        assert app.view.behaviour == "line"
        cell = app.scene.values(app.view.layer_no, "cell state")
        r = [abs(np.corrcoef(cell[:, u], col)[0, 1]) for u in range(cell.shape[1])]
        assert app.view.unit == int(np.argmax(r))
        await pilot.press("down")
        assert app.view.unit == int(np.argsort(r)[-2])
        await pilot.press("slash", *"nothing", "enter")  # an unknown behaviour: a message, nothing changes
        await pilot.pause()
        assert app.view.behaviour == "line"

    drive(app, then=check)


@pytest.mark.parametrize("kind, keys", [("gru", []), ("lstm", ["left_square_bracket"])])  # last layer, first
def test_zeroing_a_unit_matches_lab_ablate_s_intervention(loaded, kind, keys):
    ck = loaded[kind]
    app = new_app(ck, SHORT)

    async def check(app, pilot):
        await pilot.press(*keys, "x")
        await pilot.pause()
        assert app.view.layer_no == (0 if keys else 1)
        ids = torch.tensor([app.scene.ids])
        x = ck.model.tok_emb(ids[:, :-1])
        base = nats(ck.model.head(trace_rnn(ck.model.rnn, x)[-1].h), ids)  # stepped in Python, from the equations
        hurt = nats(
            ck.model.head(trace_rnn(ck.model.rnn, x, intervene=zero_units(app.view.layer_no, [app.view.unit]))[-1].h),
            ids,
        )
        chars = len(ck.tokenizer.decode(app.scene.ids[1:]))
        tokens = len(app.scene.ids) - 1
        assert app.knocked.change == pytest.approx((hurt - base) * tokens / chars / math.log(2), abs=1e-5)

    drive(app, then=check)


# ---- snapshots: the whole screen at three sizes (seeded untrained models: the same on every CPU) ---------


def seeded(kind: str) -> tuple:
    chars = sorted(set(VIEW_TEXT))
    torch.manual_seed(0)
    cfg = ModelConfig(kind=kind, n_layers=2, d_model=32, n_heads=4, context=48, vocab_size=len(chars))
    return build_model(cfg).eval(), CharTokenizer(chars)


@pytest.mark.parametrize("size", [(80, 24), (140, 40), (60, 20)])
@pytest.mark.parametrize("kind", ["transformer", "lstm"])
def test_snapshot(snap_compare, kind, size):
    model, tok = seeded(kind)
    app = ExploreApp(model, tok, tok.encode(VIEW_TEXT[:200]), name="seeded")
    assert snap_compare(app, terminal_size=size, press=["left", "left", "up"])


# ---- the command line -------------------------------------------------------------------------------------


def svg_text(svg: str) -> str:
    """The characters of an SVG screenshot, in order (each styled run is its own <text> element)."""
    return html.unescape("".join(re.findall(r">([^<]*)</text>", svg))).replace("\xa0", " ")


def test_screenshot_draws_the_first_screen(view_runs, tmp_path):
    out = tmp_path / "shot.svg"
    r = cli("explore", view_runs["tf"], "ROMEO:\nBut soft", "--screenshot", out, "--size", "80x24")
    assert r.exit_code == 0, r.output
    svg = out.read_text(encoding="utf-8")
    assert svg.startswith("<svg") and "ROMEO:" in svg_text(svg) and "heads: role" in svg_text(svg)


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["ROMEO"], "run it in a terminal"),  # CliRunner's stdin is no terminal
        (["ROMEO", "-p", "x", "--screenshot", "s.svg"], "give the text once"),
        (["", "--screenshot", "s.svg"], "the text is empty"),
        (["ROMEO", "--screenshot", "s.svg", "--size", "80"], "--size must be COLUMNSxROWS"),
        (["ROMEO", "--screenshot", "s.svg", "--size", "10x5"], "--size must be 40x12"),
        (["ROMEO", "--screenshot", ""], "--screenshot is empty"),
        (["ROMEO", "--screenshot", "no/such/dir/s.svg"], "--screenshot: cannot write"),
        (["zzz€", "--screenshot", "s.svg"], "€"),
    ],
)
def test_bad_input_is_one_line(view_runs, tmp_path, monkeypatch, args, fragment):
    monkeypatch.chdir(tmp_path)
    one_line_error(cli("explore", view_runs["tf"], *args), fragment)


def test_no_text_explores_the_start_of_the_run_s_corpus(view_runs, tmp_path):
    out = tmp_path / "shot.svg"
    assert cli("explore", view_runs["tf"], "--screenshot", out).exit_code == 0
    assert "ROMEO:" in svg_text(out.read_text(encoding="utf-8"))


PROBE = """
import json, sys
from charlm.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print(json.dumps([m for m in ("textual", "torch") if m in sys.modules]))
"""


@pytest.mark.parametrize("args", [["--help"], ["explore", "--help"], ["attn", "--help"], ["explore"]])
def test_other_commands_never_import_textual(args, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "CHARLM_DEBUG"}
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, *args], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120
    )
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []


def test_control_characters_in_the_text_are_shown_harmless(loaded):
    """A text with terminal escapes (a title change, a bell, colours) reaches the screen as visible escapes."""
    ck = loaded["bpe"]  # byte-level BPE: it encodes any text
    app = new_app(ck, "ROMEO: \x1b]0;pwned\x07 \x1b[31mred\x1b[0m [bold]x[/bold]")

    async def check(app, pilot):
        shown = app.query_one(TextPane).text()
        assert "\x1b" not in shown and "\x07" not in shown
        assert "\\x1b]0;pwned\\x07" in shown.replace("\n", "") and "[bold]x[/bold]" in shown.replace("\n", "")
        await pilot.press("home")
        assert "\x1b" not in str(app.query_one("#panel").render())

    drive(app, then=check)


@pytest.mark.parametrize("quit_key", ["q", "\x03"])
def test_the_app_runs_in_a_real_terminal_and_q_quits(view_runs, tmp_path, quit_key):
    """`charlm explore` in a pseudo-terminal (100 × 30): the first screen, a key, q (or Ctrl-C, which showed
    Textual's "Press ctrl+q to quit"), exit status 0."""
    import pexpect

    child = charlm_pty(tmp_path, "explore", view_runs["tf"], "ROMEO:\nBut soft", size=(100, 30))
    try:
        child.expect("heads: role")
        child.send("]")
        child.expect("L1H1")
        child.send(quit_key)
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0 and "ctrl+q" not in child.before


@pytest.mark.parametrize("kind", ["tf", "lstm"])
def test_a_text_past_the_limit_shows_its_last_tokens_and_says_so(loaded, kind, monkeypatch):
    monkeypatch.setattr(ex, "MAX_TOKENS", 100)
    monkeypatch.setattr(ex, "MAX_GATE_TOKENS", 100)
    ck = loaded[kind]
    ids = ck.tokenizer.encode(VIEW_TEXT[:150])
    app = ExploreApp(ck.model, ck.tokenizer, ids, name="run")
    assert app.scene.ids == ids[-100:] and app.scene.start == len(ids) - 100

    async def check(app, pilot):
        assert "the text's last 100 tokens" in str(app.query_one("#title").render())

    drive(app, then=check)


# ---- issue 37 and 38: a student's walk at 60 × 20, 80 × 24 and 120 × 40 -----------------------------------

SIZES = [(60, 20), (80, 24), (120, 40)]


def screen(app) -> str:
    return re.sub(r"\s", "", svg_text(app.export_screenshot()))


def seeded_app(kind: str, text: str = VIEW_TEXT[:200], **kw) -> ExploreApp:
    model, tok = seeded(kind)
    return ExploreApp(model, tok, tok.encode(text), name="seeded", **kw)


def help_text(app) -> str:
    """The help page shown, as plain text, one line a row."""
    from rich.console import Console

    console = Console(width=400, file=io.StringIO(), color_system=None)
    console.print(app.screen.pages[app.screen.shown])
    return console.file.getvalue()


@pytest.mark.parametrize("kind", ["transformer", "lstm"])
def test_help_then_two_quick_keys_closes_it_once(kind):
    """Issue 38: `?` then two keys queued before the first closed the help ended in Textual's "ScreenStackError:
    Can't pop screen" traceback."""
    from textual import events

    async def check(app, pilot):
        await pilot.press("question_mark")
        await pilot.pause()
        help_screen = app.screen
        assert type(help_screen).__name__ == "Help"
        help_screen.post_message(events.Key("a", "a"))
        help_screen.post_message(events.Key("b", "b"))
        await pilot.pause()
        await pilot.pause()
        assert type(app.screen).__name__ != "Help" and app.is_running

    drive(seeded_app(kind), size=(60, 20), then=check)


@pytest.mark.parametrize("kind", ["transformer", "lstm"])
def test_a_one_token_text_says_so_without_warnings_or_nan(kind):
    """Issue 38: x on a one-token text (or a text edited down to one character) ended in "ValueError: zero-size
    array"; one-token texts warned ("Mean of empty slice", "degrees of freedom") and showed nan."""
    import warnings

    async def check(app, pilot):
        assert "nan" not in screen(app).lower() and "onetoken" in screen(app)
        await pilot.press("x")
        await pilot.pause()
        assert app.knocked is None and "nothingtoknockout" in screen(app)
        await pilot.press("e")
        app.query_one(Input).value = "ROMEO"
        await pilot.press("enter", "x")
        await pilot.pause()
        assert app.knocked is not None  # five tokens: a knock-out
        await pilot.press("x", "e")
        app.query_one(Input).value = "R"
        await pilot.press("enter", "x", "slash", *"line", "enter")
        await pilot.pause()
        assert len(app.scene.ids) == 1 and app.knocked is None and app.is_running
        assert "nan" not in screen(app).lower()

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        drive(seeded_app(kind, "R"), size=(60, 20), then=check)


@pytest.mark.parametrize("kind", ["transformer", "lstm"])
@pytest.mark.parametrize("off", ["x", "escape"])
def test_x_again_or_escape_takes_the_knock_out_off(kind, off):
    """Issue 37: after x there was no way back (x recomputed, Escape did nothing, [knock-out] stayed)."""

    async def check(app, pilot):
        await pilot.press("x")
        await pilot.pause()
        assert app.mode == "knockout" and app.knocked is not None
        assert "[knock-out: x or Esc off]" in str(app.query_one("#keys").render())
        await pilot.press(off)
        await pilot.pause()
        assert app.mode == "attention" and app.knocked is None
        assert "knock-out" not in str(app.query_one("#keys").render()) and "without" not in screen(app)
        await pilot.press("question_mark")
        await pilot.pause()
        assert "x again or Esc: back" in help_text(app)

    drive(seeded_app(kind), size=(80, 24), then=check)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("kind", ["transformer", "lstm"])
def test_help_quit_and_every_value_stay_on_screen(kind, size):
    """Issue 37: at 60 × 20 the footer ended before `? keys` and `q`, the title and detail line were cut without
    their value, and at 80 × 24 the knock-out result was cut mid-sentence."""

    async def check(app, pilot):
        assert str(app.query_one("#keys").render()).startswith("? help  q quit")
        shown = screen(app)
        assert "?helpqquit" in shown and f"{app.scene.bpc:.3f}bits/char" in shown
        if kind == "transformer":
            lab = app.scene.label(app.view.layer_no, app.view.head)
            assert f"ent{lab.entropy:.1f}b" in shown
        await pilot.press("x")
        await pilot.pause()
        k = app.knocked
        worst = int(np.argmax(k.rise)) + 1
        assert f"({k.change:+.3f});lossrosemostat" in screen(app)
        assert f"@{worst}(+{k.rise.max():.2f}bits)" in screen(app)

    drive(seeded_app(kind), size=size, then=check)


def test_a_resize_lays_the_head_grid_out_again(loaded):
    """Issue 37: after a resize the head grid kept its old layout and lost numbers. After each resize the grid
    is the one an app started at that size draws."""

    async def fresh(size):
        app = seeded_app("transformer")
        async with app.run_test(size=size) as pilot:
            await pilot.pause()
            return str(app.query_one("#grid").render()), app.view.size.width

    async def check(app, pilot):
        for size in [(120, 40), (60, 20), (80, 24)]:
            await pilot.resize_terminal(*size)
            await pilot.pause()
            assert (str(app.query_one("#grid").render()), app.view.size.width) == await fresh(size)
            for lab in app.scene.labels[-app.scene.heads :]:
                assert f"{lab.distance:.1f}" in screen(app)

    drive(seeded_app("transformer"), size=(80, 24), then=check)


def test_no_previous_token_or_induction_head_points_to_lab_runs():
    """Issue 37: on a run whose heads all read `global`, the app says so and where such heads are."""
    app = seeded_app("transformer")

    async def check(app, pilot):
        assert {lab.role for lab in app.scene.labels}.isdisjoint({"previous-token", "induction"})
        shown = screen(app)
        assert "Noprevious-tokenorinductionheadonthistext" in shown
        assert "charlmlabinduction" in shown and "labcopy--quick" in shown and "induction-transformer-s0" in shown

    drive(app, size=(120, 40), then=check)


def test_a_knock_out_s_result_is_whole_at_60x20_beside_the_pointer():
    """Found in the round's walk: at 60 x 20 the knock-out's result and the pointer to lab runs shared the
    4-line note, and the pointer's end was cut off. The result shows whole; the pointer returns with x off."""
    app = seeded_app("transformer")

    async def check(app, pilot):
        await pilot.press("x")
        await pilot.pause()
        shown = screen(app)
        assert "bits/char" in shown and "lossrosemostat" in shown and "Noprevious-token" not in shown
        await pilot.press("x")
        await pilot.pause()
        assert "Noprevious-tokenorinductionheadonthistext" in screen(app)

    drive(app, size=(60, 20), then=check)


def test_the_legend_explains_the_grid_and_uses_the_grid_s_names():
    """Issue 37: no H0–H3 header, no legend; the same head was `far` in the grid and `distant` in the detail line."""
    from charlm.explore.views import short_name

    far = ex.HeadLabel(0, 0, "distant", 0.0, 0.0, 20.0, 1.0, 7, 0.2)
    assert short_name(far) == far.name == "distant"

    async def check(app, pilot):
        assert "H0H1H2H3" in screen(app)
        await pilot.press("question_mark", "tab")
        await pilot.pause()
        shown = help_text(app)
        for words in ["windows of C", "H0, H1", "prev", "ind", "ent", "red shading", "distant", "grey: tokens"]:
            assert words in shown, words

    drive(seeded_app("transformer"), size=(120, 40), then=check)


@pytest.mark.parametrize("kind", ["transformer", "lstm"])
def test_a_lab_run_s_title_says_it_is_scored_on_its_trained_positions(kind):
    """Issue 36/37: a lab run is scored on the positions it was trained to predict (the scene's `scored`), and the
    title says so, at 60 columns too."""
    app = seeded_app(kind)
    app.view.scene.__class__ = type("LabScene", (type(app.scene),), {"scored": "trained positions"})

    async def check(app, pilot):
        assert "scoredonthepositionsitwastrainedtopredict" in screen(app)

    drive(app, size=(60, 20), then=check)


def test_ctrl_c_quits_cleanly():
    async def check(app, pilot):
        await pilot.press("ctrl+c")
        await pilot.pause()
        assert not app.is_running and app.return_code == 0

    drive(seeded_app("lstm"), size=(60, 20), then=check)


# ---- LSTM search on the text at hand ----------------------------------------------------------------------


def test_quotes_and_brackets_are_the_marks_the_text_uses():
    texts = list("he said 'don't' and “no” (then [x]) o'er")
    quotes, used = ex._text_signal(texts, "quotes")
    inside = "".join(ch for ch, q in zip(texts, quotes) if q)
    assert inside == "don't'no”" and used == ["'", "“"]  # the apostrophe in don't and o'er opens nothing
    brackets, used = ex._text_signal(texts, "brackets")
    assert "".join(ch for ch, b in zip(texts, brackets) if b) == "then [x])" and used == ["(", "["]


@pytest.mark.parametrize("query, behaviour", [("/newline", "line"), ("newline", "line"), ("quote", "quotes"),
                                              ("/brackets", "brackets"), ("sat", "saturated")])  # fmt: skip
def test_search_synonyms(query, behaviour):
    assert ex.find_behaviour(query) == behaviour


def test_a_search_for_marks_the_text_lacks_says_so_and_keeps_the_order():
    """Issue 37: the corpus quotes with ' and has no brackets; both searches ranked units by gap/sd 0.00."""
    text = "ROMEO: 'tis 'soft', what light"
    torch.manual_seed(0)
    tok = CharTokenizer(sorted(set(text)))
    model = build_model(ModelConfig(kind="lstm", n_layers=1, d_model=16, context=48, vocab_size=tok.vocab_size))
    app = ExploreApp(model.eval(), tok, tok.encode(text), name="quotes")

    async def check(app, pilot):
        await pilot.press("slash", *"quotes", "enter")
        await pilot.pause()
        assert app.view.behaviour == "quotes" and "inside'quotes" in screen(app)
        order = list(app.view.order)
        await pilot.press("slash", *"brackets", "enter")
        await pilot.pause()
        assert app.view.behaviour == "quotes" and app.view.order == order
        assert "thistexthasnobrackets" in screen(app)
        await pilot.press("e")
        app.query_one(Input).value = "ROMEO: what light"  # no quotes left: ranked by changes again, and said
        await pilot.press("enter")
        await pilot.pause()
        assert app.view.behaviour == "changes" and "thistexthasnoquotes" in screen(app)

    drive(app, size=(80, 24), then=check)


def test_screenshot_says_where_and_never_writes_through_a_link_or_a_fifo(view_runs, tmp_path):
    """Issue 38: --screenshot opened its path with open(): through a link it overwrote the target, on a FIFO it
    hung. Issue 37: it wrote its file silently."""
    out = tmp_path / "shot.svg"
    r = cli("explore", view_runs["tf"], "ROMEO", "--screenshot", out, "--size", "60x20")
    assert r.exit_code == 0 and f"to {out}" in r.output.replace("\n", "")
    target = tmp_path / "precious.txt"
    target.write_text("keep me", encoding="utf-8")
    (tmp_path / "link.svg").symlink_to(target)
    one_line_error(cli("explore", view_runs["tf"], "ROMEO", "--screenshot", tmp_path / "link.svg"), "symbolic link")
    assert target.read_text(encoding="utf-8") == "keep me"
    os.mkfifo(tmp_path / "fifo.svg")
    one_line_error(cli("explore", view_runs["tf"], "ROMEO", "--screenshot", tmp_path / "fifo.svg"), "a FIFO")
