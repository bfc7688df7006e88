"""LSTM/GRU gates recomputed from the weights, and the gate viewer."""

from __future__ import annotations

import io
import re

import numpy as np
import pexpect
import pytest
import torch
import torch.nn as nn
from click.testing import CliRunner
from conftest import cli, strip_ansi
from rich.cells import cell_len
from rich.console import Console

from charlm.cli import main
from charlm.commands.look import gates
from charlm.commands.words import parse_words
from charlm.config import ModelConfig
from charlm.errors import ConfigError
from charlm.models import build_model
from charlm.models.probes import LayerTrace, choose_units, trace_rnn
from charlm.options import GatesConfig, parse_units
from charlm.tokenizer import CharTokenizer
from charlm.views.gates import draw_gates, fitting_units
from charlm.views.gates import panels as gate_panels
from charlm.views.heatmap import GATES_ASCII_RAMP, SIGNED_RAMPS, UNICODE_RAMP, Screen, shade_index

TEXT = "ROMEO:\nBut soft, what light through yonder window breaks?\nJULIET:\nO Romeo, Romeo!"
UNIT_ROW = re.compile(r"^\s*u(\d+) ")


@pytest.fixture(scope="module")
def tok():
    return CharTokenizer.train([TEXT])


def rnn_model(kind, tok, dropout=0.0):
    torch.manual_seed(1)
    model = build_model(ModelConfig(kind=kind, vocab_size=tok.vocab_size, n_layers=2, d_model=24, dropout=dropout))
    with torch.no_grad():  # livelier than the default init: gates that swing between 0 and 1
        for p in model.rnn.parameters():
            p.normal_(0, 0.4)
    return model.eval()


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_recomputed_states_equal_torch(kind):
    torch.manual_seed(0)
    layer = (nn.LSTM if kind == "lstm" else nn.GRU)(8, 16, num_layers=2, batch_first=True, dropout=0.3).eval()
    x = torch.randn(3, 11, 8)
    h0 = torch.randn(2, 3, 16)
    state = (h0, torch.randn(2, 3, 16)) if kind == "lstm" else h0
    with torch.no_grad():
        out, final = layer(x, state)
        traces = trace_rnn(layer, x, state)
    h_n = final[0] if kind == "lstm" else final
    torch.testing.assert_close(traces[-1].h, out, atol=1e-5, rtol=0)  # the top layer, every step
    for i, t in enumerate(traces):  # every layer's last step
        torch.testing.assert_close(t.h[:, -1], h_n[i], atol=1e-5, rtol=0)
        if kind == "lstm":
            torch.testing.assert_close(t.c[:, -1], final[1][i], atol=1e-5, rtol=0)
    # the first layer on its own, every step: a one-layer torch layer with the same weights
    single = (nn.LSTM if kind == "lstm" else nn.GRU)(8, 16, num_layers=1, batch_first=True)
    single.load_state_dict({k: v for k, v in layer.state_dict().items() if k.endswith("_l0")})
    with torch.no_grad():
        out0, _ = single(x, (h0[:1], state[1][:1]) if kind == "lstm" else h0[:1])
    torch.testing.assert_close(traces[0].h, out0, atol=1e-5, rtol=0)
    names = ("input", "forget", "cell", "output") if kind == "lstm" else ("reset", "update", "new")
    assert tuple(traces[0].gates) == names
    for name, g in traces[0].gates.items():
        assert g.shape == (3, 11, 16)
        if name not in ("cell", "new"):  # sigmoid gates
            assert 0 <= g.min() and g.max() <= 1


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_trace_model_matches_the_models_own_forward(kind, tok):
    model = rnn_model(kind, tok, dropout=0.3)  # dropout between layers and after the embedding: off in eval
    idx = torch.tensor([tok.encode(TEXT)])
    with torch.no_grad():
        logits, _ = model(idx)
        traces = model.trace(idx)
        torch.testing.assert_close(model.head(traces[-1].h), logits, atol=1e-5, rtol=0)
    if kind == "lstm":  # the LSTM equations, checked on the recomputed gates: c' = f c + i g, h' = o tanh(c')
        t = traces[0]
        g = t.gates
        c_prev = torch.cat([torch.zeros_like(t.c[:, :1]), t.c[:, :-1]], dim=1)
        torch.testing.assert_close(t.c, g["forget"] * c_prev + g["input"] * g["cell"], atol=1e-6, rtol=0)
        torch.testing.assert_close(t.h, g["output"] * torch.tanh(t.c), atol=1e-6, rtol=0)


def test_choose_units():
    T, H = 20, 6
    rng = np.random.default_rng(0)
    gates = {name: torch.full((1, T, H), 0.5) for name in ("input", "forget", "cell", "output")}
    gates["forget"][0, :, 4] = torch.tensor(rng.uniform(0, 1, T))  # changes most
    gates["input"][0, :, 1] = torch.tensor(rng.uniform(0.4, 0.6, T))  # changes a little
    gates["cell"][0, :, 3] = torch.tensor(rng.uniform(-1, 1, T))  # a candidate value, not a gate: not counted
    trace = LayerTrace(gates, torch.zeros(1, T, H), torch.zeros(1, T, H))
    assert choose_units(trace, 2) == [4, 1]
    assert choose_units(trace, [5, 0]) == [5, 0]
    assert len(choose_units(trace, None)) == H  # the default 8, or all when there are fewer
    with pytest.raises(ConfigError, match="unit 6 is out of range: this layer has units 0..5"):
        choose_units(trace, [1, 6])
    with pytest.raises(ConfigError, match="units must be between 1 and 6"):
        choose_units(trace, 7)


def test_the_words_of_gates_are_the_config_fields():
    assert parse_units("8") == 8 and parse_units("3,17") == [3, 17] and parse_units("5,") == [5]
    with pytest.raises(ConfigError, match="units must be a count"):
        parse_units("three")
    parse = lambda args: parse_words(GatesConfig, args, "gates")  # noqa: E731
    assert parse([]) == GatesConfig()
    o = parse(["1", "units", "2,3", "tokens", "12", "ascii"])
    assert (o.layer, o.units, o.tokens, o.ascii) == (1, [2, 3], 12, True)
    for args, message in (
        (["sideways"], "unknown /gates argument"),
        (["units"], "needs a value"),
        (["tokens", "x"], "whole number"),
        (["units", "three"], "units must be a count"),
        (["1", "2"], "at most a layer"),
    ):
        with pytest.raises(ConfigError, match=message):
            parse(args)


def show_gates(console, model, tok, ids, args):
    """What chat's /gates ARGS draws: the words as a GatesConfig, the numbers, the view."""
    opts = parse_words(GatesConfig, args, "gates")
    screen = Screen.of(console, opts.ascii)
    fits = lambda trace: fitting_units(len(gate_panels(trace)), screen.height)  # noqa: E731
    draw_gates(console, tok, gates(model, ids, opts, fits), opts, screen)


def render(model, tok, args, width=100, text=TEXT):
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    show_gates(console, model, tok, tok.encode(text), args)
    return console.export_text()


def panels(text):
    """{title's first word: {unit: row plain text}} of the rendered panels."""
    out, title = {}, None
    for line in text.splitlines():
        m = UNIT_ROW.match(line)
        if m:
            out[title][int(m.group(1))] = line
        elif line.split(" ", 1)[0] in ("forget", "input", "output", "update", "reset", "cell", "hidden"):
            title = line.split()[0]
            out.setdefault(title, {})
    return {k: v for k, v in out.items() if v}


@pytest.mark.parametrize("ascii", [False, True])
def test_gate_cells_are_the_right_shades(tok, ascii):
    model = rnn_model("lstm", tok)
    ids = tok.encode(TEXT)
    with torch.no_grad():
        t = model.trace(torch.tensor([ids]))[0]
    text = render(model, tok, ["0", "units", "3,7,20"] + (["ascii"] if ascii else []), width=200)
    ramp = GATES_ASCII_RAMP if ascii else UNICODE_RAMP
    shown = panels(text)
    assert set(shown) >= {"forget", "input", "output", "cell"}
    n = len(ids)
    for name in ("forget", "input", "output"):
        assert list(shown[name]) == [3, 7, 20]
        for unit, line in shown[name].items():
            cells = line[len(line) - 5 - 2 * n : len(line) - 5][::2]  # 2 cells per token: the text fits
            want = [ramp[shade_index(float(v), 1.0, len(ramp))] for v in t.gates[name][0, :, unit]]
            assert list(cells) == want, (name, unit)
            assert float(line[-4:]) == pytest.approx(float(t.gates[name][0, :, unit].mean()), abs=0.006)
    pos, neg = SIGNED_RAMPS[ascii]
    for unit, line in shown["cell"].items():  # each unit scaled to its own largest |c|
        signed = t.c[0, :, unit]
        c = signed.abs()
        assert float(line[-4:]) == pytest.approx(float(c.max()), abs=0.006)
        cells = line[len(line) - 5 - 2 * n : len(line) - 5][::2]
        assert cells[int(c.argmax())] == (neg if signed[int(c.argmax())] < 0 else pos)[-1]
        # the sign is in the glyph itself, readable without colour (piped, NO_COLOR)
        for glyph, value in zip(cells, signed.tolist()):
            want = (neg if value < 0 else pos)[shade_index(abs(value), float(c.max()), len(pos))]
            assert glyph == want, (unit, value)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("width", [40, 80, 150])
def test_fits_the_width_and_shows_the_changing_units(tok, kind, width):
    model = rnn_model(kind, tok)
    text = render(model, tok, ["units", "5"], width=width)
    assert all(cell_len(line) <= width for line in text.splitlines())
    shown = panels(text)
    first = "forget" if kind == "lstm" else "update"
    assert len(shown[first]) == 5
    state = "cell" if kind == "lstm" else "hidden"
    assert list(shown[state]) == list(shown[first])  # the same units in every panel
    magnitude = [line for line in text.splitlines() if line.strip().startswith(("|c|", "|h|"))]
    assert magnitude, "the state magnitude strip is missing"
    ids = tok.encode(TEXT)
    prose = " ".join(text.split())  # the title may wrap on a narrow terminal
    assert f"tokens {len(ids) - min(len(ids), width - 4 - 5)}..{len(ids) - 1} of {len(ids)}" in prose


def test_window_and_errors(tok):
    lstm = rnn_model("lstm", tok)
    text = render(lstm, tok, ["tokens", "6", "end", "20"])
    assert "tokens 14..19 of" in text
    for args, message in (
        (["2"], "layer 2 is out of range: this model has layers 0..1"),
        (["units", "0"], "units must be between 1 and 24"),
        (["units", "3,99"], "unit 99 is out of range"),
        (["end", "500"], "outside"),
    ):
        with pytest.raises(ConfigError, match=message):
            render(lstm, tok, args)
    tf = build_model(ModelConfig(kind="transformer", vocab_size=tok.vocab_size, n_layers=1, d_model=16, n_heads=2))
    with pytest.raises(
        ConfigError, match=r"^a transformer has no gates; charlm attn \(/attn in chat\) shows its attention$"
    ):
        render(tf.eval(), tok, ["units", "3"])
    with pytest.raises(ConfigError, match="no text to look at yet"):
        render(lstm, tok, [], text="")


def test_cli_gates(view_runs):
    r = cli("gates", view_runs["lstm"], "--prompt", "ROMEO:\nBut soft", "--layer", "0", "--units", "4", "--width", "70")
    assert r.exit_code == 0, r.output
    assert "LSTM layer 0: 4 of 32 units" in r.stdout and "forget gate" in r.stdout and "cell state" in r.stdout
    assert all(cell_len(line) <= 70 for line in r.stdout.splitlines())
    r = cli("gates", view_runs["gru"], "-p", "JULIET:\nO Romeo", "--units", "1,2", "--ascii")
    assert r.exit_code == 0, r.output
    assert "update gate" in r.stdout and "reset gate" in r.stdout and "hidden state" in r.stdout
    assert all(ord(ch) < 128 for ch in r.stdout)


@pytest.mark.parametrize(
    "run_name,args,message",
    [
        ("tf", [], "a transformer has no gates; charlm attn (/attn in chat) shows its attention"),
        ("lstm", ["--layer", "5"], "layer 5 is out of range"),
        ("lstm", ["--units", "x"], "units must be a count"),
        ("lstm", ["--units", "40,"], "unit 40 is out of range"),
        ("lstm", ["--width", "5"], "--width must be at least 20"),
        ("gru", ["--prompt", ""], "--prompt is empty"),
    ],
)
def test_cli_gates_errors_are_one_line(view_runs, run_name, args, message):
    r = cli("gates", view_runs[run_name], "--prompt", "ROMEO", *args)
    assert r.exit_code != 0
    assert message in r.stderr and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_gates_in_chat_in_a_real_terminal(view_runs, chat_pty):
    """/gates in `charlm chat` draws the gates of the running text; /attn on an LSTM points to /gates."""
    child = chat_pty(view_runs["lstm"], "--max-tokens", "5", "--seed", "1")
    child.expect_exact(">>> ")
    child.sendline("ROMEO:")
    child.expect_exact(">>> ")
    child.sendline("/gates 0 units 3")
    child.expect_exact(">>> ")
    screen = strip_ansi(child.before)
    assert "LSTM layer 0: 3 of 32 units" in screen and "forget gate" in screen and "cell state" in screen
    assert len([line for line in screen.splitlines() if UNIT_ROW.match(line)]) == 4 * 3  # f, i, o, c
    child.sendline("/attn")
    child.expect_exact(">>> ")
    assert "/gates" in child.before
    child.sendeof()
    child.expect(pexpect.EOF)


# ---- issue 13: maps that fit the screen and read without colour ----------------------------------


@pytest.mark.parametrize("kind,height", [("lstm", 40), ("gru", 40), ("lstm", 30)])
def test_gates_fit_the_terminal_height_with_the_legends_first(tok, kind, height):
    """Regression (issue 13): gates at 120×40 took ~48 lines with the legend at the very end."""
    model = rnn_model(kind, tok)
    console = Console(width=120, height=height, file=io.StringIO(), force_terminal=True, color_system=None)
    show_gates(console, model, tok, tok.encode(TEXT), [])
    lines = console.file.getvalue().splitlines()
    assert len(lines) <= height - 1, len(lines)  # and a line left for the next prompt
    assert lines[0].startswith("scale: ") and lines[1].startswith("sign: + ")
    shown = panels("\n".join(lines))
    assert 1 <= len(shown["forget" if kind == "lstm" else "update"]) < 8  # fewer units than the default 8
    assert len(panels(render(model, tok, []))["cell" if kind == "lstm" else "hidden"]) == 8  # a pipe: all 8


def test_the_sign_legend_shows_both_glyph_families(tok):
    text = render(rnn_model("lstm", tok), tok, ["units", "3"])
    pos, neg = SIGNED_RAMPS[False]
    assert f"sign: + {pos[1:]}  − {neg[1:]}" in text
    ascii_text = render(rnn_model("lstm", tok), tok, ["units", "3", "ascii"])
    pos, neg = SIGNED_RAMPS[True]
    assert f"sign: + {pos[1:]}  - {neg[1:]}" in ascii_text and all(ord(ch) < 128 for ch in ascii_text)


def test_cli_gates_reads_the_prompt_from_a_file_or_stdin_and_names_its_flags(view_runs, tmp_path):
    prompt = "JULIET:\nO Romeo, Romeo! wherefore art thou Romeo?"
    (tmp_path / "p.txt").write_text(prompt, encoding="utf-8")
    direct = cli("gates", view_runs["lstm"], "--prompt", prompt, "--tokens", "10")
    from_file = cli("gates", view_runs["lstm"], "--prompt-file", tmp_path / "p.txt", "--tokens", "10")
    piped = CliRunner().invoke(main, ["gates", str(view_runs["lstm"]), "--tokens", "10"], input=prompt)
    assert direct.exit_code == from_file.exit_code == piped.exit_code == 0, piped.output
    assert direct.stdout == from_file.stdout == piped.stdout
    assert "showing tokens 39..48; move with --end N, size with --tokens N" in direct.stdout
    r = cli("gates", view_runs["lstm"], "--prompt", "x", "--prompt-file", tmp_path / "p.txt")
    assert r.exit_code != 0 and "give --prompt or --prompt-file, not both" in r.stderr


def test_gates_ascii_glyphs_mean_one_thing_each(view_runs):
    """Found: in gates --ascii, - and + meant middling gate values in the gate panels and a sign in the sign legend;
    _ was both the space label and the strongest negative value."""
    from charlm.views.heatmap import GATES_ASCII_RAMP, SIGNED_RAMPS

    out = cli("gates", view_runs["lstm"], "To be, or not", "--ascii", "--units", "3", "--width", "100").stdout
    pos, neg = SIGNED_RAMPS[True]
    assert not (set(GATES_ASCII_RAMP) - set(" .@")) & set(pos + neg)  # faint . and strongest @ alike in both
    assert "_" not in pos + neg and "_" in out  # _ is the space label only
    assert "scale: " + GATES_ASCII_RAMP[1:] in out and "sign: + " + pos[1:] + "  - " + neg[1:] in out
