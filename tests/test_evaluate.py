"""charlm.evaluate and `charlm eval`: every token but the first scored exactly once, against
independent references (one full forward pass; a per-token recomputation of the documented windows)."""

import io
import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import cli, one_line_error, strip_ansi
from rich.console import Console

from charlm.config import ModelConfig
from charlm.data import CorpusError
from charlm.errors import ConfigError
from charlm.evaluate import evaluate_file, evaluate_ids, token_nats
from charlm.models import build_model
from charlm.tokenizer import BPETokenizer, CharTokenizer

TEXT = "Zwölf Boxkämpfer jagen Viktor quer über den großen Sylter Deich. 中文 😀\n" * 3


def tiny(kind: str, vocab_size: int, context: int, seed: int = 0):
    torch.manual_seed(seed)
    cfg = ModelConfig(kind=kind, vocab_size=vocab_size, n_layers=2, d_model=32, n_heads=2, context=context)
    return build_model(cfg).eval()


def full_pass_nats(model, ids) -> np.ndarray:
    """The reference: -log p(t_j | t_<j) for j = 1..N-1 from one forward pass over the whole text."""
    x = torch.tensor([list(ids)], dtype=torch.long)
    with torch.no_grad():
        logits, _ = model(x[:, :-1])
    return F.cross_entropy(logits[0].double(), x[0, 1:], reduction="none").numpy()


def scored(model, ids, stride=None) -> tuple[list[int], np.ndarray]:
    positions, parts = [], []
    for j, nats in token_nats(model, np.asarray(ids), stride, batch_size=3):
        positions += range(j, j + len(nats))
        parts.append(nats)
    return positions, np.concatenate(parts)


@pytest.mark.parametrize("stride", [None, 1, 7, 64])
def test_transformer_windows_equal_one_full_pass_when_the_text_fits(stride):
    tok = CharTokenizer.train([TEXT])
    ids = tok.encode(TEXT)[:60]
    model = tiny("transformer", tok.vocab_size, context=64)
    positions, nats = scored(model, ids, stride)
    assert positions == list(range(1, len(ids)))
    np.testing.assert_allclose(nats, full_pass_nats(model, ids), rtol=0, atol=1e-5)


@pytest.mark.parametrize("stride", [None, 1, 5])
def test_transformer_sliding_windows_match_per_token_reference(stride):
    """Longer than the context: each target j is scored with the left context the documented plan
    gives it, recomputed here one token at a time from a closed form of that plan."""
    tok = CharTokenizer.train([TEXT])
    ids = tok.encode(TEXT)[:70]
    C = 16
    S = C // 2 if stride is None else stride
    model = tiny("transformer", tok.vocab_size, context=C, seed=1)
    positions, nats = scored(model, ids, stride)
    assert positions == list(range(1, len(ids)))  # every token but the first, once, in order
    last_start = max(0, len(ids) - 1 - C)
    for j, got in zip(positions, nats):
        start = 0 if j <= C else min(math.ceil((j - C) / S) * S, last_start)
        assert C - S + 1 <= j - start <= C or start == 0  # the promised minimum context
        with torch.no_grad():
            logits, _ = model(torch.tensor([ids[start:j]]))
        want = -torch.log_softmax(logits[0, -1].double(), -1)[ids[j]].item()
        assert abs(got - want) < 1e-5, (j, start)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_rnn_windows_carry_state_equal_one_full_pass(kind):
    tok = CharTokenizer.train([TEXT])
    ids = tok.encode(TEXT)
    model = tiny(kind, tok.vocab_size, context=8)  # windows of 8 over ~220 tokens
    positions, nats = scored(model, ids)
    assert positions == list(range(1, len(ids)))
    np.testing.assert_allclose(nats, full_pass_nats(model, ids), rtol=1e-6, atol=1e-6)


def test_char_model_bits_per_char_is_loss_over_ln2_exactly():
    tok = CharTokenizer.train([TEXT])
    ids = np.array(tok.encode(TEXT))
    r = evaluate_ids(tiny("lstm", tok.vocab_size, context=16), tok, ids)
    assert r.tokens == r.chars == len(TEXT) - 1
    assert r.bits_per_char == r.loss / math.log(2)
    assert r.bytes == len(TEXT.encode()) - len(TEXT[0].encode())
    assert r.perplexity == pytest.approx(math.exp(r.loss))


def test_bpe_counts_the_chars_and_bytes_of_the_scored_tokens():
    text = "😀😀 naïve café " * 20 + "x"
    tok = BPETokenizer.train([text * 5], vocab_size=270)
    ids = tok.encode(text)
    assert tok.decode(ids) == text and len(ids) < len(text.encode())
    model = tiny("transformer", tok.vocab_size, context=256)
    r = evaluate_ids(model, tok, np.array(ids))
    rest = text.encode()[len(tok.token_bytes(ids[0])) :]  # the bytes of tokens 2..N
    assert r.bytes == len(rest)
    # a character counts when its first byte is scored: decoding the rest drops the tail of a split one
    assert r.chars == len(rest.decode("utf-8", errors="ignore"))
    total = full_pass_nats(model, ids).sum()
    assert r.loss == pytest.approx(total / (len(ids) - 1), rel=1e-6)
    assert r.bits_per_char == pytest.approx(total / r.chars / math.log(2), rel=1e-6)
    assert r.bits_per_byte == pytest.approx(total / r.bytes / math.log(2), rel=1e-6)


def test_file_is_read_like_a_corpus_bom_and_crlf_normalised(tmp_path):
    tok = CharTokenizer.train([TEXT])
    model = tiny("gru", tok.vocab_size, context=32)
    lf, crlf = tmp_path / "lf.txt", tmp_path / "crlf.txt"
    lf.write_bytes(TEXT.encode())
    crlf.write_bytes(b"\xef\xbb\xbf" + TEXT.replace("\n", "\r\n").encode())
    a, b = evaluate_file(model, tok, lf), evaluate_file(model, tok, crlf)
    assert (a.nats, a.tokens, a.chars, a.bytes) == (b.nats, b.tokens, b.chars, b.bytes)
    assert a.nats == pytest.approx(full_pass_nats(model, tok.encode(TEXT)).sum(), rel=1e-6)


def test_unknown_characters_error_names_them_and_drop_scores_the_rest(tmp_path):
    tok = CharTokenizer.train(["abc \n"])
    model = tiny("lstm", tok.vocab_size, context=8)
    path = tmp_path / "t.txt"
    path.write_text("abc é cab ba\né c 😀\n", encoding="utf-8")
    with pytest.raises(CorpusError) as e:
        evaluate_file(model, tok, path)
    msg = str(e.value)
    assert "'é'" in msg and "'😀'" in msg and "3 occurrences" in msg and "--unknown drop" in msg and "\n" not in msg
    r = evaluate_file(model, tok, path, unknown="drop")
    clean = "abc  cab ba\n c \n"
    assert r.unknown_dropped == 3 and r.tokens == len(clean) - 1 == r.chars
    assert r.nats == pytest.approx(full_pass_nats(model, tok.encode(clean)).sum(), rel=1e-6)


def test_too_short_and_bad_stride_are_user_errors(tmp_path):
    tok = CharTokenizer.train(["ab"])
    model = tiny("transformer", tok.vocab_size, context=8)
    one = tmp_path / "one.txt"
    one.write_text("a")
    with pytest.raises(CorpusError, match="too short"):
        evaluate_file(model, tok, one)
    with pytest.raises(ConfigError, match="--stride must be between 1 and the model's context"):
        evaluate_ids(model, tok, np.array([0, 1, 0, 1]), stride=9)


# ---- the CLI ------------------------------------------------------------------------------------


def test_cli_eval_json_matches_the_library(cmp_runs, cmp_corpus):
    from charlm.storage import checkpoint

    # the library runs on the CPU below: so does the CLI (--device auto would pick a GPU, whose sums differ)
    r = cli("eval", cmp_runs["bpe"], cmp_corpus, "--json", "--device", "cpu")
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)  # one JSON object and nothing else on stdout
    for key in ("loss", "bits_per_char", "bits_per_byte", "tokens", "chars", "bytes", "perplexity", "seconds"):
        assert key in got
    ck = checkpoint.load(cmp_runs["bpe"])
    want = evaluate_file(ck.model, ck.tokenizer, cmp_corpus)
    text = cmp_corpus.read_text()  # ASCII: one char per byte
    first = ck.tokenizer.token_bytes(ck.tokenizer.encode(text)[0])
    assert got["tokens"] == want.tokens and got["chars"] == got["bytes"] == len(text) - len(first)
    assert got["bits_per_char"] == pytest.approx(want.bits_per_char, rel=1e-9)
    assert got["tokenizer"] == "bpe" and got["stride"] == ck.model_config.context // 2


def test_cli_eval_table(cmp_runs, cmp_corpus):
    r = cli("eval", cmp_runs["lstm"], cmp_corpus)
    assert r.exit_code == 0, r.output
    assert "bits/char" in r.stdout and "bits/byte" in r.stdout and "one pass, state carried" in r.stdout


def test_cli_eval_user_errors_are_one_line(cmp_runs, cmp_corpus, tmp_path):
    one_line_error(cli("eval", tmp_path / "nope", cmp_corpus), "no such checkpoint", "nope")
    one_line_error(cli("eval", cmp_runs["tf"], tmp_path / "missing.txt"), "no such file", "missing.txt")
    (tmp_path / "bin.dat").write_bytes(bytes(range(256)) * 4)
    one_line_error(cli("eval", cmp_runs["tf"], tmp_path / "bin.dat"), "binary")
    (tmp_path / "latin1.txt").write_bytes("café au lait".encode("latin-1"))
    one_line_error(cli("eval", cmp_runs["tf"], tmp_path / "latin1.txt"), "not UTF-8")
    (tmp_path / "accents.txt").write_text("the café sat\n", encoding="utf-8")
    one_line_error(cli("eval", cmp_runs["tf"], tmp_path / "accents.txt"), "'é'", "--unknown drop")
    one_line_error(cli("eval", cmp_runs["tf"], cmp_corpus, "--stride", "0"), "--stride")
    dropped = cli("eval", cmp_runs["tf"], tmp_path / "accents.txt", "--unknown", "drop", "--json")
    assert dropped.exit_code == 0 and json.loads(dropped.stdout)["unknown_dropped"] == 1


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
