"""The attention viewer: shades, the diagonal, labels, fitting the width, head stats, focus, the CLI."""

from __future__ import annotations

import io
import math
import re

import numpy as np
import pexpect
import pytest
import torch
from click.testing import CliRunner
from conftest import cli, strip_ansi
from rich.cells import cell_len
from rich.console import Console

from charlm.cli import main
from charlm.commands.look import attention
from charlm.commands.words import parse_words
from charlm.config import ModelConfig
from charlm.errors import ConfigError
from charlm.models import build_model
from charlm.models.probes import head_stats
from charlm.options import AttnConfig
from charlm.storage import checkpoint
from charlm.tokenizer import BPETokenizer, CharTokenizer
from charlm.views.attention import MAX_CELL, draw_attention, map_lines
from charlm.views.heatmap import ASCII_RAMP, UNICODE_RAMP, Screen, shade_index, token_label

TEXT = "But soft, what light through yonder window breaks?\nIt is the east, and Juliet is the sun."
ROW = re.compile(r"^\s*(\d+) ")
NOTE = 5  # " 0.93" at the right of each map row


@pytest.fixture(scope="module")
def tok():
    return CharTokenizer.train([TEXT + "[]\x1b\tcm0123456789"])


@pytest.fixture(scope="module")
def peaky(tok):
    """A 2-layer, 3-head model with large random q/k weights, so each row has a clear favourite."""
    torch.manual_seed(0)
    model = build_model(
        ModelConfig(kind="transformer", vocab_size=tok.vocab_size, n_layers=2, d_model=24, n_heads=3, context=64)
    )
    with torch.no_grad():
        for block in model.blocks:
            block.attn.qkv.weight.normal_(0, 0.6)
    return model.eval()


def weights_of(model, ids):
    """Reference weights straight from the model's forward: (L, nh, T, T) for the last `context` ids."""
    offset = max(0, len(ids) - model.cfg.context)
    attn = []
    with torch.no_grad():
        model(torch.tensor([ids[offset:]]), attn=attn)
    return offset, torch.stack([a[0] for a in attn]).numpy()


def show_attention(console, model, tok, ids, args):
    """What chat's /attn ARGS draws: the words as an AttnConfig, the numbers, the views."""
    opts = parse_words(AttnConfig, args, "attn")
    draw_attention(console, tok, attention(model, tok, ids, opts), opts, Screen.of(console, opts.ascii))


def render(model, tok, ids, args, width=100, encoding=None):
    file = io.StringIO()
    console = Console(width=width, record=True, file=file, color_system=None)
    show_attention(console, model, tok, ids, args)
    return console.export_text(), file.getvalue()


def grid(lines, n, cell):
    """{position: [one char per column]} of the map rows in `lines` (Text or str)."""
    rows = {}
    for line in lines:
        plain = getattr(line, "plain", line)
        m = ROW.match(plain)
        if m:
            cells = plain[len(plain) - NOTE - n * cell : len(plain) - NOTE]
            chars = cells[::cell]
            assert all(cells[k * cell : (k + 1) * cell] == chars[k] * cell for k in range(n)), plain
            rows[int(m.group(1))] = (chars, float(plain[-4:]))
    return rows


def test_shade_index_buckets():
    levels = 6
    rng = np.random.default_rng(0)
    for vmax in (1.0, 0.37, 5.0):
        for w in rng.uniform(0, vmax, 500):
            k = shade_index(float(w), vmax, levels)
            assert 1 <= k <= levels - 1
            lo, hi = (k - 1) / (levels - 1) * vmax, k / (levels - 1) * vmax
            assert lo <= w + 1e-12 and (w < hi or k == levels - 1)
    assert shade_index(0.0, 1.0, levels) == 0
    assert shade_index(-0.1, 1.0, levels) == 0
    assert shade_index(float("nan"), 1.0, levels) == 0
    assert shade_index(0.5, 0.0, levels) == 0
    assert shade_index(1e-9, 1.0, levels) == 1  # any weight at all is visible
    assert shade_index(0.37, 0.37, levels) == levels - 1  # the row's largest weight is the darkest


def test_capture_rows_sum_to_one_and_outputs_unchanged(peaky, tok):
    ids = tok.encode(TEXT[:40])
    idx = torch.tensor([ids])
    attn = []
    with torch.no_grad():
        fast, _ = peaky(idx)
        explicit, _ = peaky(idx, attn=attn)
    torch.testing.assert_close(explicit, fast, atol=1e-5, rtol=1e-5)
    for w in attn:  # (1, nh, T, T)
        T = w.size(-1)
        torch.testing.assert_close(w.sum(-1), torch.ones_like(w.sum(-1)))
        assert (w[..., ~torch.ones(T, T, dtype=torch.bool).tril()] == 0).all()


@pytest.mark.parametrize("ascii", [False, True])
@pytest.mark.parametrize("width,tokens,end", [(140, None, None), (60, None, None), (100, 12, 50)])
def test_map_cells_are_the_right_shades(peaky, tok, ascii, width, tokens, end):
    ids = tok.encode(TEXT)
    offset, weights = weights_of(peaky, ids)
    layer, head = 1, 2
    opts = AttnConfig(layer=layer, head=head, tokens=tokens, end=end, ascii=ascii)
    lines = map_lines(tok, attention(peaky, tok, ids, opts), opts, Screen(width, None, ascii))
    n = len([x for x in lines if ROW.match(x.plain)])
    prefix = len(str(len(ids) - 1)) + 3  # "<pos> <one-char label> "
    cell = max(1, min(MAX_CELL, (width - prefix - NOTE) // n))  # wider cells where the width has room
    rows = grid(lines, n, cell)
    assert len(rows) == n and all(cell_len(x.plain) <= width for x in lines if x.no_wrap)  # grid lines never wrap
    ramp = ASCII_RAMP if ascii else UNICODE_RAMP
    stop = end if end is not None else len(ids)
    positions = sorted(rows)
    assert positions[-1] == stop - 1  # the window ends where asked (the end of the text by default)
    if tokens:
        assert len(positions) == tokens
    start = positions[0]
    for p, (chars, note) in rows.items():
        q = p - offset
        w_row = weights[layer, head, q]
        vmax = w_row[: q + 1].max()  # the scale: the row's largest weight over every key it saw
        assert note == pytest.approx(vmax, abs=0.006)
        levels = [ramp.index(ch) for ch in chars]
        for c, level in enumerate(levels):
            key = start + c
            if key > p:
                assert chars[c] == " ", f"drawn above the diagonal at row {p}, key {key}"
                continue
            w = w_row[key - offset] / vmax
            lo, hi = (level - 1) / (len(ramp) - 1), level / (len(ramp) - 1)
            assert level >= 1 and lo - 1e-6 <= w and (w < hi + 1e-6 or level == len(ramp) - 1)
        shown = w_row[start - offset : p - offset + 1]
        assert levels[int(shown.argmax())] == max(levels)  # the brightest cell is the row's argmax


def test_labels_escaped_and_whitespace_visible(peaky, tok):
    ids = tok.encode("[bold]a b\tc\n\x1b[31m")
    text, raw = render(peaky, tok, ids, ["0", "0"], width=120)
    assert "\x1b" not in raw  # the ESC from the text never reaches the terminal
    assert "\\x1b" in text  # ...it is shown escaped
    header = next(line for line in text.splitlines() if "[" in line and not ROW.match(line))
    assert "[bold]a␣b⇥c⏎" in "".join(header.split())  # markup-looking text shown literally


def test_bpe_labels_are_clean_bytes():
    bpe = BPETokenizer.train([TEXT * 20], vocab_size=300)
    ids = bpe.encode(" the sun\n")
    labels = [token_label(bpe, i) for i in ids]
    joined = "".join(labels)
    assert joined == "␣the␣sun⏎"
    assert "Ġ" not in joined and "Ċ" not in joined  # GPT-2's byte markers
    ascii_labels = "".join(token_label(bpe, i, ascii=True) for i in ids)
    assert ascii_labels == "_the_sun\\n"
    by_bytes = {bpe.token_bytes(i): i for i in range(bpe.vocab_size)}
    assert token_label(bpe, by_bytes["é".encode()[:1]]) == "\ufffd"  # half a character: replaced, not a crash
    assert token_label(bpe, by_bytes[b"\x07"]) == "\\x07"  # a control byte: escaped


@pytest.mark.parametrize("width", [40, 72, 130])
def test_every_view_fits_the_width(peaky, tok, width):
    ids = tok.encode(TEXT)
    for args in ([], ["overview"], ["stats"], ["focus", "-1"], ["0", "1", "ascii"], ["1", "mean", "abs"]):
        text, _ = render(peaky, tok, ids, args, width=width)
        too_long = [line for line in text.splitlines() if cell_len(line) > width]
        assert not too_long, (args, too_long)
    text, _ = render(peaky, tok, ids, [], width=width)
    rows = [int(ROW.match(line).group(1)) for line in text.splitlines() if ROW.match(line)]
    assert rows == list(range(rows[0], len(ids)))  # the last tokens that fit, one unwrapped line each
    assert len(rows) == min(64, width - 5 - NOTE)  # as many as fit beside "<pos> <label> " and the note


def test_long_text_uses_the_last_context_tokens(peaky, tok):
    ids = tok.encode(TEXT * 2)  # longer than the context of 64
    text, _ = render(peaky, tok, ids, ["tokens", "10"], width=80)
    assert f"the model sees the last 64 of {len(ids)} tokens" in text
    rows = [int(ROW.match(line).group(1)) for line in text.splitlines() if ROW.match(line)]
    assert rows == list(range(len(ids) - 10, len(ids)))
    with pytest.raises(ConfigError, match="outside the text the model sees"):
        render(peaky, tok, ids, ["focus", "3"])


def test_head_stats_match_hand_computation():
    T = 6
    self_head = np.eye(T)
    uniform = np.tril(np.ones((T, T))) / np.arange(1, T + 1)[:, None]
    first = np.zeros((T, T))
    first[:, 0] = 1
    stats = head_stats(np.stack([np.stack([self_head, uniform, first])]))  # (1 layer, 3 heads, T, T)
    s_self, s_uni, s_first = stats
    assert s_self.entropy == 0 and s_self.distance == 0 and s_self.offset == 0 and s_self.offset_share == 1
    queries = range(1, T)
    assert s_uni.entropy == pytest.approx(np.mean([math.log2(i + 1) for i in queries]))
    assert s_uni.distance == pytest.approx(np.mean([sum(i - j for j in range(i + 1)) / (i + 1) for i in queries]))
    assert s_first.distance == pytest.approx(np.mean(list(queries)))
    assert s_first.entropy == 0


def test_stats_name_the_most_local_and_global_heads(peaky, tok):
    ids = tok.encode(TEXT)
    offset, weights = weights_of(peaky, ids)
    dist = {}
    for layer in range(weights.shape[0]):
        for head in range(weights.shape[1]):
            w = weights[layer, head]
            dist[(layer, head)] = np.mean([sum(w[i, j] * (i - j) for j in range(i + 1)) for i in range(1, len(w))])
    local, far = min(dist, key=dist.get), max(dist, key=dist.get)
    for args in (["stats"], ["overview"]):
        text, _ = render(peaky, tok, ids, args, width=130)
        assert f"most local: L{local[0]}H{local[1]} (looks {dist[local]:.1f} tokens back)" in text
        assert f"most global: L{far[0]}H{far[1]} (looks {dist[far]:.1f} tokens back)" in text


def test_focus_lists_the_top_keys(peaky, tok):
    ids = tok.encode(TEXT)
    offset, weights = weights_of(peaky, ids)
    q = 40
    text, _ = render(peaky, tok, ids, ["0", "1", "focus", str(q), "top", "4"], width=100)
    row = weights[0, 1, q - offset, : q - offset + 1]  # the model saw the text from `offset` on
    want = np.argsort(-row, kind="stable")[:4]
    bars = [line for line in text.splitlines() if ROW.match(line)]
    assert [int(ROW.match(b).group(1)) for b in bars] == [offset + int(k) for k in want]
    for b, k in zip(bars, want):
        assert f"{row[k]:.3f}" in b
    assert f"what did token {q} '{token_label(tok, ids[q])}' look at? (layer 0, head 1)" in text
    # by the token's text: the last one with that text
    text, _ = render(peaky, tok, ids, ["focus", "J"], width=100)
    assert f"what did token {TEXT.rindex('J')} 'J' look at?" in text


def test_the_words_of_attn_are_the_config_fields():
    parse = lambda args: parse_words(AttnConfig, args, "attn")  # noqa: E731
    assert parse([]) == AttnConfig()
    o = parse(["2", "1"])
    assert (o.layer, o.head, o.show_map) == (2, 1, True)
    o = parse(["overview"])
    assert o.overview and not o.show_map
    o = parse(["1", "focus", "e", "tokens", "9", "end", "20", "ascii", "abs"])
    assert (o.layer, o.focus, o.tokens, o.end, o.ascii, o.scale) == (1, "e", 9, 20, True, "abs")
    assert parse(["focus"]).focus == "" and parse(["focus", "tokens", "3"]).focus == ""  # the last token
    assert not parse(["0", "1", "focus", "3"]).show_map  # the head chosen is the focus view's
    assert parse(["scale", "abs"]).scale == "abs" and parse(["top", "3"]).top == 3


@pytest.mark.parametrize(
    "args,message",
    [
        (["7"], "layer 7 is out of range: this model has layers 0..1"),
        (["0", "3"], "head 3 is out of range: each layer has heads 0..2"),
        (["0", "1", "mean"], "choose one head or the mean over heads, not both"),
        (["sideways"], "unknown /attn argument 'sideways'"),
        (["tokens"], "'tokens' needs a value after it"),
        (["tokens", "x"], "tokens must be a whole number"),
        (["tokens", "0"], "tokens must be at least 1"),
        (["end", "999"], "end 999 is outside"),
        (["focus", "Z"], "no 'Z' in the text the model sees"),
        (["1", "2", "3"], "at most a layer and a head"),
        (["overview", "1"], "overview shows every head"),
    ],
)
def test_bad_arguments_are_one_line_config_errors(peaky, tok, args, message):
    with pytest.raises(ConfigError) as e:
        render(peaky, tok, tok.encode(TEXT[:30]), args)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_too_narrow_is_a_config_error(peaky, tok):
    with pytest.raises(ConfigError, match="too narrow"):
        render(peaky, tok, tok.encode(TEXT), [], width=10)


def test_no_attention_on_an_rnn_and_no_text(peaky, tok):
    lstm = build_model(ModelConfig(kind="lstm", vocab_size=tok.vocab_size, n_layers=1, d_model=16)).eval()
    with pytest.raises(
        ConfigError, match=r"^this LSTM has no attention; charlm gates \(/gates in chat\) shows its gates$"
    ):
        render(lstm, tok, tok.encode("abc"), ["overview"])
    with pytest.raises(ConfigError, match="no text to look at yet"):
        render(peaky, tok, [], [])


# ---- the CLI, on checkpoints trained for a few steps ---------------------------------------------


def test_cli_attn_char_and_bpe(view_runs):
    r = cli("attn", view_runs["tf"], "--prompt", "ROMEO:\nBut soft", "--width", "60")
    assert r.exit_code == 0, r.output
    assert "layer 1, mean of 2 heads" in r.stdout and "R" in r.stdout
    rows = [line for line in r.stdout.splitlines() if ROW.match(line)]
    assert len(rows) == len("ROMEO:\nBut soft")
    r = cli(
        "attn",
        view_runs["tf"],
        "-p",
        "O Romeo, Romeo!",
        "--overview",
        "--stats",
        "--focus",
        "-1",
        "--ascii",
        "--width",
        "70",
    )
    assert r.exit_code == 0, r.output
    assert "L0H0" in r.stdout and "L1H1" in r.stdout and "most global" in r.stdout and "look at?" in r.stdout
    assert all(ord(ch) < 128 for ch in r.stdout)  # --ascii: nothing a plain terminal can't show
    assert all(cell_len(line) <= 70 for line in r.stdout.splitlines())
    r = cli(
        "attn",
        view_runs["bpe"],
        "--prompt",
        "JULIET:\nO Romeo, wherefore",
        "--layer",
        "0",
        "--head",
        "1",
        "--tokens",
        "6",
    )
    assert r.exit_code == 0, r.output
    assert "layer 0, head 1" in r.stdout and "Ġ" not in r.stdout
    assert len([line for line in r.stdout.splitlines() if ROW.match(line)]) == 6


@pytest.mark.parametrize(
    "args,message",
    [
        (["--layer", "2"], "layer 2 is out of range"),
        (["--head", "5"], "head 5 is out of range"),
        (["--overview", "--layer", "0"], "overview shows every head: drop the layer/head/mean choice"),
        (["--head", "0", "--mean"], "choose one head or the mean"),
        (["--width", "10"], "--width must be at least 20"),
        (["--focus", "99"], "outside the text"),
        (["--tokens", "0"], "tokens must be at least 1"),
    ],
)
def test_cli_attn_errors_are_one_line(view_runs, args, message):
    r = cli("attn", view_runs["tf"], "--prompt", "ROMEO: But soft, what light", *args)
    assert r.exit_code != 0
    assert message in r.stderr and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_cli_attn_focus_takes_text_as_its_help_says(view_runs):
    """--focus is a position or text (the option was generated with type int: "light" was refused)."""
    by_text = cli("attn", view_runs["tf"], "-p", "But soft, what light", "--focus", "light", "--width", "80")
    by_position = cli("attn", view_runs["tf"], "-p", "But soft, what light", "--focus", "-1", "--width", "80")
    assert by_text.exit_code == 0 and by_position.exit_code == 0, by_text.output
    assert by_text.stdout == by_position.stdout  # "light": its last token, the prompt's last


def test_cli_attn_wrong_model_prompt_and_checkpoint(view_runs, tmp_path):
    for args, message in (
        ([view_runs["lstm"], "-p", "ROMEO"], "has no attention; charlm gates (/gates in chat) shows its gates"),
        ([view_runs["tf"], "-p", ""], "--prompt is empty"),
        ([view_runs["tf"], "-p", "zebra ☃"], "never saw"),
        ([tmp_path / "nothing", "-p", "ROMEO"], "no such checkpoint"),
    ):
        r = cli("attn", *args)
        assert r.exit_code != 0 and message in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
    r = cli("attn", view_runs["tf"], "-p", "ROMEO ☃", "--unknown", "drop")
    assert r.exit_code == 0, r.output


def test_attn_in_chat_in_a_real_terminal(view_runs, chat_pty):
    """/attn in `charlm chat` draws the map of the running text; /gates on a transformer points to /attn."""
    child = chat_pty(view_runs["tf"], "--max-tokens", "5", "--seed", "1")
    child.expect_exact(">>> ")
    child.sendline("ROMEO:")
    child.expect_exact(">>> ")
    child.sendline("/attn 0 1 tokens 8")
    child.expect_exact(">>> ")
    screen = strip_ansi(child.before)
    assert "layer 0, head 1" in screen and "tokens 3..10 of 11" in screen  # 6 typed + 5 generated tokens
    assert len([line for line in screen.splitlines() if ROW.match(line)]) == 8
    assert "move with end N, size with tokens N" in screen  # the REPL's words, not the CLI's flags
    child.sendline("/gates")
    child.expect_exact(">>> ")
    assert "/attn" in child.before
    child.sendeof()
    child.expect(pexpect.EOF)


# ---- issue 13: maps that fit the screen and explain themselves -----------------------------------


def render_screen(model, tok, ids, args, width, height):
    """What /attn draws on a terminal of width × height (colours off)."""
    console = Console(width=width, height=height, file=io.StringIO(), force_terminal=True, color_system=None)
    show_attention(console, model, tok, ids, args)
    return console.file.getvalue()


@pytest.mark.parametrize("args", [[], ["overview"], ["0", "1"]])
def test_views_fit_the_terminal_height_with_the_legend_first(peaky, tok, args):
    """Regression (issue 13): /attn at 120×40 printed 109 rows and the legend came last, so the column
    header scrolled away."""
    ids = tok.encode(TEXT)
    screen = render_screen(peaky, tok, ids, args, width=120, height=40)
    lines = screen.splitlines()
    assert len(lines) <= 40 - 1, len(lines)  # and a line left for the next prompt
    first = next(line for line in lines if not line.startswith("(the model sees the last"))
    assert first.startswith("scale:" if not args or args[0] != "overview" else "attention overview")
    if not args or args[0] != "overview":
        rows = [int(ROW.match(line).group(1)) for line in lines if ROW.match(line)]
        assert rows == list(range(len(ids) - len(rows), len(ids))) and len(rows) >= 20  # the last ones that fit
    # a pipe is not a screen: it gets every token that fits the width
    assert len(render(peaky, tok, ids, args, width=120)[0].splitlines()) > len(lines)


def test_hints_name_the_cli_flags_in_the_cli_and_the_words_in_chat(view_runs, peaky, tok):
    r = cli("attn", view_runs["tf"], "--prompt", "ROMEO:\nBut soft", "--tokens", "5")
    assert r.exit_code == 0, r.output
    assert "move with --end N, size with --tokens N" in r.stdout
    text, _ = render(peaky, tok, tok.encode(TEXT), ["tokens", "5"])
    assert "move with end N, size with tokens N" in text  # the REPL's own words


def test_focus_by_a_piece_of_text_or_a_position_and_a_miss_lists_the_nearest_tokens(peaky, tok):
    short = TEXT[:60]  # within the model's context of 64
    ids = tok.encode(short)
    q = short.index("light") + len("light") - 1  # a char model: the token holding the last character, 't'
    text, _ = render(peaky, tok, ids, ["focus", "light"], width=100)
    assert f"what did token {q} 't' look at?" in text
    text, _ = render(peaky, tok, ids, ["focus", "h"], width=100)  # a token's own text: its last occurrence
    assert f"what did token {short.rindex('h')} 'h' look at?" in text
    with pytest.raises(ConfigError) as e:
        render(peaky, tok, ids, ["focus", "lihgt"])
    assert "no 'lihgt' in the text the model sees" in str(e.value) and "give a position (0..59)" in str(e.value)
    with pytest.raises(ConfigError, match="'light' is only in the text before the last 64 tokens"):
        render(peaky, tok, tok.encode(TEXT), ["focus", "light"])  # 89 tokens: the model sees 25..88
    bpe = BPETokenizer.train([TEXT * 20], vocab_size=300)
    model = build_model(
        ModelConfig(kind="transformer", vocab_size=bpe.vocab_size, n_layers=1, d_model=16, n_heads=2, context=64)
    ).eval()
    ids = bpe.encode(TEXT)
    text, _ = render(model, bpe, ids, ["focus", "what"], width=100)  # no token is 'what': BPE has '␣what'
    q = int(re.search(r"what did token (\d+) ", text).group(1))
    before, upto = bpe.decode(ids[:q]), bpe.decode(ids[: q + 1])
    assert len(before) < upto.rindex("what") + 4 <= len(upto)  # the last 'what' ends in token q
    assert "what" not in bpe.decode(ids[q + 1 :])
    with pytest.raises(ConfigError) as e:
        render(model, bpe, ids, ["focus", "whta"])
    assert "no 'whta' in the text the model sees; nearest tokens: " in str(e.value)


def test_bpe_column_labels_read_down_their_column_whole(view_runs):
    """Regression (issue 13): BPE column headers were clipped to two characters and stacked in pieces."""
    prompt = "JULIET:\nO Romeo, wherefore art thou"
    r = cli("attn", view_runs["bpe"], "--prompt", prompt, "--width", "100")
    assert r.exit_code == 0, r.output
    ck = checkpoint.load(view_runs["bpe"])
    ids = ck.tokenizer.encode(prompt)
    labels = [token_label(ck.tokenizer, t) for t in ids]
    lines = r.stdout.splitlines()
    first_row = next(k for k, line in enumerate(lines) if ROW.match(line))
    title = next(k for k, line in enumerate(lines) if line.startswith("layer "))
    header = lines[title + 1 : first_row]
    assert len(header) == min(6, max(len(x) for x in labels))
    prefix = len(str(len(ids) - 1)) + 1 + min(8, max(cell_len(x) for x in labels)) + 1  # "<pos> <label> "
    cell = (len(lines[first_row]) - 5 - prefix) // len(ids)  # (wider where the width has room)
    label_start = len(lines[first_row]) - 5 - cell * len(ids)  # the map's first column
    for k, label in enumerate(labels):
        column = "".join(line[label_start + cell * k] if label_start + cell * k < len(line) else " " for line in header)
        assert column.rstrip() == (label if len(label) <= 6 else label[:5] + "…"), (k, label, column)


def test_stats_explain_themselves_and_fit_60_columns(view_runs):
    r = cli("attn", view_runs["tf"], "--prompt", "ROMEO:\nBut soft, what light", "--stats", "--width", "60")
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert all(cell_len(line) <= 60 for line in lines)
    heads = [line for line in lines if re.match(r"^\s*L\dH\d\s", line)]
    assert len(heads) == 4 and all(re.search(r"\d\.\d\d\s+\d+\.\d\s+(itself|previous|\d+ back) \d+%", h) for h in heads)
    legend = " ".join(" ".join(lines).split())
    assert "low = focused on a few tokens, high = spread out (diffuse)" in legend
    assert "(previous = the token just before it)" in legend


def test_cli_attn_reads_the_prompt_from_a_file_or_stdin(view_runs, tmp_path):
    prompt = "ROMEO:\nBut soft"
    (tmp_path / "p.txt").write_text(prompt, encoding="utf-8")
    direct = cli("attn", view_runs["tf"], "--prompt", prompt)
    from_file = cli("attn", view_runs["tf"], "--prompt-file", tmp_path / "p.txt")
    piped = CliRunner().invoke(main, ["attn", str(view_runs["tf"])], input=prompt)
    assert direct.exit_code == from_file.exit_code == piped.exit_code == 0, piped.output
    assert direct.stdout == from_file.stdout == piped.stdout
    empty = CliRunner().invoke(main, ["attn", str(view_runs["tf"])], input="")
    assert empty.exit_code != 0 and "no text to look at: give --prompt TEXT or --prompt-file FILE" in empty.stderr


def test_a_map_at_80_columns_shows_as_many_keys_as_fit_in_cells_two_wide(peaky, tok):
    """Issue 37: at 80×24 the map showed 16 tokens in 4-wide cells (the height's rows set the columns too),
    where 34 fit in cells two wide. Now the columns hold the keys that fit, the rows the last queries."""
    ids = tok.encode(TEXT)  # 89 tokens
    lines = render_screen(peaky, tok, ids, ["0", "1"], width=80, height=24).splitlines()
    assert len(lines) <= 23 and max(cell_len(line) for line in lines) <= 80
    title = next(line for line in lines if line.startswith("layer 0, head 1"))
    start, stop = map(int, re.search(r"tokens (\d+)\.\.(\d+) of", title).groups())
    keys = stop - start + 1
    assert keys == (80 - (2 + 1 + 1 + 1) - NOTE) // 2 == 35  # "<pos> <token> ", the note: 35 keys fit
    rows = [line for line in lines if ROW.match(line)]
    assert 8 <= len(rows) < keys and int(ROW.match(rows[-1]).group(1)) == len(ids) - 1  # the last queries
    # the last query sees every key: its cells, two wide each, fill the width between label and note
    last = rows[-1]
    assert cell_len(last) == 2 + 1 + 1 + 1 + 2 * keys + NOTE


def test_attn_says_when_a_rows_largest_weight_is_left_of_the_window(view_runs):
    """Found: a row shaded against a maximum outside the visible window looked faint, and nothing said why."""
    from charlm.commands.look import attention
    from charlm.options import AttnConfig
    from charlm.storage import checkpoint
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
