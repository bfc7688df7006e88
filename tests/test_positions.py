"""Positions: ALiBi and NoPE against an attention written out from the papers' definitions, every
encoding's KV cache (torch and the numpy step, rolled or re-prefilled) against full recomputation, the
`--positions` choices through `train`, and `lab positions` at --quick size, checked for the in-context
plateau with a margin and for extrapolation only where the literature agrees on the sign."""

from __future__ import annotations

import json
import math

import pytest
import torch
from click.testing import CliRunner
from conftest import CITIZENS, TINY
from safetensors.torch import load_file

from charlm.cli import main
from charlm.config import POSITIONS, ModelConfig
from charlm.generate import Streamer
from charlm.models import build_model, param_shapes
from charlm.models.transformer import alibi_slopes
from charlm.storage import checkpoint
from charlm.storage.checkpoint import BEST
from charlm.tokenizer import CharTokenizer

CHARS = CharTokenizer(list("\n abcdefghijklmnopqrstuvwxyz.,!?'ABCDEFGHIJ"))


def model_of(positions: str, context: int = 16, layers: int = 2, heads: int = 4, seed: int = 0):
    """Random weights large enough that logits are O(1..10), so a 1e-4 agreement means something."""
    torch.manual_seed(seed)
    cfg = ModelConfig(
        vocab_size=CHARS.vocab_size, n_layers=layers, d_model=32, n_heads=heads, context=context, positions=positions
    )
    model = build_model(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    return model


# ---- the definitions, written out ---------------------------------------------------------------------


def paper_slopes(n: int) -> list[float]:
    """Press et al.'s get_slopes, as published: 2^(-8/n) and its powers for a power of two n; otherwise the
    power of two below, then every other slope of twice that."""

    def power_of_2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n).is_integer():
        return power_of_2(n)
    below = 2 ** math.floor(math.log2(n))
    return power_of_2(below) + paper_slopes(2 * below)[0::2][: n - below]


@pytest.mark.parametrize("heads", [1, 2, 3, 4, 6, 8, 12])
def test_alibi_slopes_are_the_papers(heads):
    assert alibi_slopes(heads).tolist() == pytest.approx(paper_slopes(heads), rel=1e-6)
    if heads == 8:
        assert alibi_slopes(8).tolist() == [2.0**-k for k in range(1, 9)]


def reference_logits(model, ids: list[int]) -> torch.Tensor:
    """Every position's logits over ids (any length), attention written out per query and key: each
    query sees itself and the context - 1 keys before it (a sliding window, as a rolled cache does);
    ALiBi adds -slope_h * (i - j) to head h's score of key j for query i; NoPE adds nothing. (N, vocab)."""
    cfg, N = model.cfg, len(ids)
    nh, hs = cfg.n_heads, cfg.d_model // cfg.n_heads
    slopes = paper_slopes(nh) if cfg.positions == "alibi" else [0.0] * nh
    bias = torch.tensor([[[-slopes[h] * (i - j) for j in range(N)] for i in range(N)] for h in range(nh)])
    seen = torch.tensor([[i - cfg.context < j <= i for j in range(N)] for i in range(N)])  # (query, key)
    x = model.tok_emb(torch.tensor(ids))  # (N, C)
    for block in model.blocks:
        q, k, v = (t.view(N, nh, hs).transpose(0, 1) for t in block.attn.qkv(block.norm1(x)).split(cfg.d_model, -1))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(hs) + bias  # (nh, N, N)
        y = scores.masked_fill(~seen, float("-inf")).softmax(-1) @ v  # (nh, N, hs)
        x = x + block.attn.proj(y.transpose(0, 1).reshape(N, cfg.d_model))
        x = x + block.mlp(block.norm2(x))
    return model.head(model.norm(x))


@pytest.mark.parametrize("positions", ["alibi", "nope"])
@pytest.mark.parametrize("heads", [4, 2])
def test_a_full_pass_is_the_written_out_attention(positions, heads):
    model = model_of(positions, heads=heads)
    ids = torch.randint(0, CHARS.vocab_size, (16,), generator=torch.Generator().manual_seed(1)).tolist()
    with torch.no_grad():
        got = model(torch.tensor([ids]))[0][0]
        want = reference_logits(model, ids)
    assert (got - want).abs().max().item() <= 1e-4
    assert want.abs().max() > 1.0  # large enough logits for the comparison to bite


def test_nope_sees_no_order_but_the_causal_mask():
    """Without positions, the last query attends to a set: swapping two earlier tokens leaves its logits
    as they were (up to float rounding); with any other encoding they change."""
    ids = torch.randint(0, CHARS.vocab_size, (10,), generator=torch.Generator().manual_seed(2)).tolist()
    swapped = [ids[3], *ids[1:3], ids[0], *ids[4:]]
    for positions in POSITIONS:
        model = model_of(positions, layers=1)
        with torch.no_grad():
            a, b = (model(torch.tensor([x]))[0][0, -1] for x in (ids, swapped))
        moved = (a - b).abs().max().item()
        assert (moved <= 1e-4) if positions == "nope" else (moved > 1e-2), positions


# ---- every encoding's cache against recomputation -----------------------------------------------------


@pytest.mark.parametrize("positions", POSITIONS)
@pytest.mark.parametrize("fast", [True, False])
def test_streaming_past_the_context_equals_recomputation(positions, fast):
    """60 tokens through the Streamer with a context of 16 (prefill, one-token steps in torch or numpy,
    and past the context either a rolled cache or a re-prefilled window), each step's logits against a
    full pass: for the relative encodings (RoPE, ALiBi, whose caches roll) the sliding-window pass over
    the whole text so far (reference_logits for ALiBi), for the others the pass over the last 16 tokens
    (for NoPE, reference_logits over them)."""
    model = model_of(positions)
    g = torch.Generator().manual_seed(7)
    gen = Streamer(model, CHARS, fast_decode=fast)
    gen.ids = torch.randint(0, CHARS.vocab_size, (5,), generator=g).tolist()
    text = list(gen.ids)
    got, want = [], []
    for _ in range(60):
        got.append(torch.as_tensor(gen.next_logits()))
        with torch.no_grad():
            if positions == "nope":
                want.append(reference_logits(model, text[-16:])[-1])
            elif positions in ("learned", "sinusoidal"):
                want.append(model(torch.tensor([text[-16:]]))[0][0, -1])
        token = int(torch.randint(0, CHARS.vocab_size, (1,), generator=g))
        gen.ids.append(token)
        text.append(token)
    if positions == "alibi":
        with torch.no_grad():
            want = list(reference_logits(model, text)[4:-1])  # at every position from the prompt's last
    if positions != "rope":  # (RoPE's: test_generate.test_cached_steps_equal_a_full_pass_at_every_position)
        assert (torch.stack(got) - torch.stack(want)).abs().max().item() <= 1e-4
    assert (gen.fast is not None) == fast  # the numpy step ran when asked for
    assert (gen.cache.pos > 16) == model.rolling_cache == (positions in ("rope", "alibi"))  # rolled, past 16


@pytest.mark.parametrize("positions", POSITIONS)
def test_prefill_in_chunks_then_numpy_steps_equal_a_full_pass(positions):
    model = model_of(positions, context=32)
    ids = torch.randint(0, CHARS.vocab_size, (1, 32), generator=torch.Generator().manual_seed(8))
    from charlm.models.fast_decode import FastDecoder

    with torch.no_grad():
        full, _ = model(ids)
        cache = model.new_cache(1)
        step = FastDecoder(model, cache).step
        outs, start = [], 0
        for size in (5, 1, 1, 3, 1, 7, 1, 1, 2, 10):
            out = (
                step(int(ids[0, start])).view(1, 1, -1)
                if size == 1
                else model(ids[:, start : start + size], cache=cache)[0]
            )
            outs.append(out)
            start += size
    assert cache.pos == 32
    assert (torch.cat(outs, dim=1) - full).abs().max().item() <= 1e-4


# ---- through train: the flag, the checkpoint --------------------------------------------------------


@pytest.mark.parametrize("positions", ["alibi", "nope"])
def test_train_positions_round_trips_through_the_checkpoint(tmp_path, positions):
    corpus = tmp_path / "citizens.txt"
    corpus.write_text(CITIZENS)
    run = tmp_path / positions
    r = CliRunner().invoke(
        main, ["train", str(corpus), "--out", str(run), "--positions", positions, "--steps", "30", *TINY]
    )
    assert r.exit_code == 0, r.output
    ck = checkpoint.load(run)
    assert ck.model_config.positions == positions
    assert set(ck.model.state_dict()) == set(param_shapes(ck.model_config))  # no tensor of its own to save
    x = torch.tensor([ck.tokenizer.encode("First Citizen:\nBefore we")])
    rebuilt = build_model(ck.model_config).eval()
    missing, unexpected = rebuilt.load_state_dict(load_file(run / BEST), strict=False)  # as any reader sees them
    tied = ["head.weight"] if ck.model_config.tied else []  # a tied head is stored once, as tok_emb.weight
    assert (missing, unexpected) == (tied, [])
    assert torch.equal(rebuilt(x)[0], ck.model(x)[0])
    assert ck.saved.best_val_bpc < math.log2(ck.tokenizer.vocab_size)  # it learned something
    r = CliRunner().invoke(main, ["sample", str(run), "--max-tokens", "80", "--seed", "1", "--prompt", "First"])
    assert r.exit_code == 0 and r.output.startswith("First")
    info = CliRunner().invoke(main, ["info", str(run), "--json"])
    assert info.exit_code == 0 and json.loads(info.stdout)["positions"] == positions


# ---- lab positions ------------------------------------------------------------------------------------


def test_the_perfect_copier_pays_for_the_symbols_and_the_length_only():
    """Per line, the perfect copier's bits add up to log2 of the lengths it could have had plus log2 of the
    symbols free at each draw (distinct symbols), and nothing for the copy and the newline after it."""
    from charlm.lab import positions as lab

    data = lab.corpus((1, 15), 3000, seed=0)
    bits = lab.perfect_bits(data.text, (1, 15))
    lines = data.text.split("\n")[1:-1]
    at = len(lab.ALPHABET) + 1
    for ln in lines:
        n = ln.index(lab.SEP)
        want = math.log2(15) + sum(math.log2(len(lab.SYMBOLS) - k) for k in range(n))
        assert bits[at : at + len(ln) + 1].sum() == pytest.approx(want)
        assert not bits[at + n + 1 : at + len(ln) + 1].any()  # the copy and its newline: free
        at += len(ln) + 1
    assert len(lines) > 100 and lab.order_blind_bits(1) == 0.0
    assert lab.order_blind_bits(3) == pytest.approx(math.log2(6) / 3)


@pytest.fixture(scope="module")
def positions_result(tmp_path_factory):
    out = tmp_path_factory.mktemp("positions")
    r = CliRunner().invoke(
        main, ["lab", "positions", "--quick", "--json", "--device", "cpu", "--out", str(out / "runs")]
    )
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def test_every_encoding_copies_in_order_within_its_context(positions_result):
    """The plateau, with a margin: in context every encoding copies (measured at --quick size on seeds 0-1
    of a Zen 4: 0.003-0.02 bits per copied symbol; the perfect copier 0), far below the order-blind
    shortcut (1.3 bits: which symbols are left, not their order) and guessing (5.95)."""
    rows = {(r["positions"], r["scored"]): r for r in positions_result["results"]}
    for p in POSITIONS:
        r = rows[(p, "copy N=1-7")]
        assert r["perfect"] == 0.0 and r["guessing"] == pytest.approx(math.log2(62))
        assert r["shortcut"] > 1.0
        assert r["bits"] <= 0.4, p
    summary = {r["positions"]: r for r in positions_result["details"]["summary"]}
    assert set(summary) == set(POSITIONS)


def test_no_encoding_beats_the_perfect_copier_on_text(positions_result):
    """The perfect copier's figure is the text's entropy: a model can only come close to it from above."""
    for r in positions_result["results"]:
        if r["scored"].startswith("text ") and r["bits"] is not None:
            assert r["bits"] >= r["perfect"] - 0.02, r
            assert r["perfect"] < r["guessing"]
            assert r["gap"] == pytest.approx(r["bits"] - r["perfect"], abs=2e-3)  # what the reading quotes


def test_extrapolation_has_the_sign_the_literature_agrees_on(positions_result):
    """Only signs, where published results agree (Press et al. 2022, "Train short, test long"): a learned
    table cannot run past its context at all; on text in windows past the context, ALiBi loses less than
    RoPE and sinusoidal positions (measured at --quick size, seeds 0-1: +1.2 against +3.6-3.8 bits/char at
    4x); and no encoding copies a line twice the longest it trained on as well as those (8-14 bits against
    0.005-0.02)."""
    rows = {(r["positions"], r["scored"]): r["bits"] for r in positions_result["results"]}
    gaps = {(r["positions"], r["scored"]): r.get("gap") for r in positions_result["results"]}
    C = positions_result["settings"]["context"]
    assert rows[("learned", "copy N=15")] is None and rows[("learned", f"text {2 * C}")] is None
    assert "Learned cannot run past 16 tokens" in positions_result["reading"]
    # read as the gap to the perfect copier on the same windows (raw bits/char mix in the windows' make-up)
    gain = {p: gaps[(p, f"text {4 * C}")] - gaps[(p, f"text {C}")] for p in ("alibi", "rope", "sinusoidal")}
    assert gain["alibi"] < min(gain["rope"], gain["sinusoidal"])
    for p in ("rope", "alibi", "nope", "sinusoidal"):
        assert rows[(p, "copy N=15")] > rows[(p, "copy N=1-7")]
