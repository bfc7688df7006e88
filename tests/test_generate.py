"""The generation engine: pure sampling against straightforward reference implementations, seeded
determinism, stop strings, UTF-8-safe streaming, and the cache (KV cache / RNN state, incl. the
numpy one-token step and the sliding window) against full recomputation."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from conftest import cli

from charlm.config import ModelConfig
from charlm.errors import ConfigError
from charlm.generate import SampleConfig, Streamer, Utf8Stream, sample_next_token, sampling_probs
from charlm.models import build_model
from charlm.models.fast_decode import FastDecoder
from charlm.models.fast_rnn import FastRNN
from charlm.tokenizer import BPETokenizer, CharTokenizer

CHARS = CharTokenizer(list("\n abcdefghijklmnopqrstuvwxyz.,!?'ABCDEFGHIJ"))


def model_of(
    kind="transformer",
    positions="rope",
    vocab=CHARS.vocab_size,
    context=16,
    layers=2,
    d_model=32,
    heads=4,
    scale=0.3,
    seed=0,
):
    """A random model with large weights, so logits are O(1..10) and a 1e-4 agreement means something."""
    torch.manual_seed(seed)
    cfg = ModelConfig(
        kind=kind,
        vocab_size=vocab,
        n_layers=layers,
        d_model=d_model,
        n_heads=heads,
        context=context,
        positions=positions,
    )
    model = build_model(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, scale)
    return model


# ---- sampling, against references written out in plain Python ----------------------------------


def ref_softmax(xs: list[float]) -> list[float]:
    top = max(x for x in xs if x != -math.inf)
    exps = [math.exp(x - top) if x != -math.inf else 0.0 for x in xs]
    total = sum(exps)
    return [e / total for e in exps]


def ref_probs(logits: list[float], temperature=1.0, top_k=0, top_p=1.0, penalty=1.0, history=()) -> list[float]:
    xs = list(logits)
    for i in set(history):
        xs[i] = xs[i] / penalty if xs[i] > 0 else xs[i] * penalty
    xs = [x / temperature for x in xs]
    if top_k:
        best = sorted(range(len(xs)), key=lambda i: -xs[i])[:top_k]
        xs = [x if i in best else -math.inf for i, x in enumerate(xs)]
    probs = ref_softmax(xs)
    if top_p < 1:
        order = sorted(range(len(probs)), key=lambda i: -probs[i])
        kept, total = [], 0.0
        for i in order:  # the smallest set of most likely tokens whose probability reaches top_p
            kept.append(i)
            total += probs[i]
            if total >= top_p:
                break
        probs = [p / total if i in kept else 0.0 for i, p in enumerate(probs)]
    return probs


def assert_probs(got: torch.Tensor, want: list[float]):
    assert got.shape == (len(want),)
    assert {i for i, p in enumerate(want) if p > 0} == set(torch.nonzero(got).flatten().tolist())
    assert max(abs(g - w) for g, w in zip(got.tolist(), want)) < 1e-5


def test_settings_are_validated():
    for bad in (
        dict(temperature=-1),
        dict(top_k=-1),
        dict(top_p=0),
        dict(top_p=1.5),
        dict(repetition_penalty=0),
        dict(max_tokens=-1),
        dict(stop=[""]),
        dict(seed=-1),
    ):
        with pytest.raises(ConfigError):
            SampleConfig(**bad).validate()
    SampleConfig(temperature=0, top_k=5, top_p=0.5, repetition_penalty=1.3, stop=["\n"], seed=3).validate()


def test_temperature_zero_is_argmax():
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        logits = torch.randn(40, generator=g) * 3
        assert sample_next_token(logits, SampleConfig(temperature=0), g) == int(logits.argmax())
        assert_probs(
            sampling_probs(logits, SampleConfig(temperature=0)), [float(i == int(logits.argmax())) for i in range(40)]
        )


@pytest.mark.parametrize("temperature", [1e-5, 1e-39, 5e-324], ids=["1e-5", "below float32", "subnormal"])
@pytest.mark.parametrize(
    "extra",
    [dict(top_k=5), dict(top_p=0.9), dict(repetition_penalty=1.3), {}],
    ids=["top_k", "top_p", "penalty", "plain"],
)
def test_tiny_temperatures_are_greedy(temperature, extra):
    """Regression (issue 10): below ~1e-38 logits / temperature overflowed, so the sampler returned the last
    token every time (an IndexError with top-p), and a subnormal one printed numpy warnings and garbage."""
    logits = torch.tensor([0.5, 3.0, -1.0, 2.9, 0.0, 1.0])
    history = torch.tensor([3])  # the penalty shrinks 2.9 further: 1 stays the best
    s = SampleConfig(temperature=temperature, **extra)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a numpy overflow warning fails the test
        for seed in range(5):
            assert sample_next_token(logits, s, torch.Generator().manual_seed(seed), history) == 1
        assert sampling_probs(logits, s, history).tolist() == [0, 1, 0, 0, 0, 0]


def test_top_k_keeps_exactly_the_k_best():
    g = torch.Generator().manual_seed(1)
    for k in (1, 2, 5, 17):
        logits = torch.randn(30, generator=g) * 2
        s = SampleConfig(temperature=0.7, top_k=k)
        assert_probs(sampling_probs(logits, s), ref_probs(logits.tolist(), 0.7, top_k=k))
        draws = {sample_next_token(logits, s, g) for _ in range(300)}
        assert draws <= set(torch.topk(logits, k).indices.tolist())


def test_top_k_with_ties_still_keeps_k():
    """Regression: masking below the k-th value kept every token tied with it (here all 10)."""
    logits = torch.zeros(10)
    probs = sampling_probs(logits, SampleConfig(temperature=1.0, top_k=3))
    assert int((probs > 0).sum()) == 3
    assert torch.allclose(probs[probs > 0], torch.full((3,), 1 / 3))


def test_top_p_keeps_the_smallest_set_reaching_p():
    g = torch.Generator().manual_seed(2)
    for trial in range(20):
        logits = torch.randn(25, generator=g) * 2
        probs = sorted(ref_softmax(logits.tolist()), reverse=True)
        cum = [sum(probs[: i + 1]) for i in range(len(probs))]
        n = 1 + trial % 8  # aim between two cumulative sums: exactly n tokens reach p, never a near tie
        p = (cum[n - 2] + cum[n - 1]) / 2 if n > 1 else cum[0] / 2
        got = sampling_probs(logits, SampleConfig(temperature=1.0, top_p=p))
        assert int((got > 0).sum()) == n
        assert_probs(got, ref_probs(logits.tolist(), 1.0, top_p=p))


def test_top_k_then_top_p_then_temperature_together():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(50, generator=g) * 2
    s = SampleConfig(temperature=1.3, top_k=10, top_p=0.6)
    assert_probs(sampling_probs(logits, s), ref_probs(logits.tolist(), 1.3, top_k=10, top_p=0.6))


def test_repetition_penalty_follows_ctrl():
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(20, generator=g) * 2
    history = [0, 3, 3, 7, 12]
    s = SampleConfig(temperature=0.9, repetition_penalty=1.5)
    got = sampling_probs(logits, s, torch.tensor(history).unique())
    assert_probs(got, ref_probs(logits.tolist(), 0.9, penalty=1.5, history=history))
    plain = sampling_probs(logits, SampleConfig(temperature=0.9))
    assert all(got[i] < plain[i] for i in set(history))  # seen tokens always lose probability
    # greedy with a penalty: the argmax of the penalised logits
    ref = ref_probs(logits.tolist(), 1.0, penalty=1.5, history=history)
    assert sample_next_token(
        logits, SampleConfig(temperature=0, repetition_penalty=1.5), g, torch.tensor(history)
    ) == max(range(20), key=lambda i: ref[i])


@pytest.mark.parametrize("settings", [SampleConfig(temperature=0.8), SampleConfig(temperature=1.0, top_k=6, top_p=0.9)])
def test_the_draw_is_the_inverse_cdf_of_one_uniform(settings):
    """The token is where one uniform number from the generator falls in the reference CDF."""
    g = torch.Generator().manual_seed(5)
    for _ in range(200):
        logits = torch.randn(12, generator=g) * 2
        probs = ref_probs(logits.tolist(), settings.temperature, settings.top_k, settings.top_p)
        u = torch.rand((), generator=torch.Generator().set_state(g.get_state()), dtype=torch.float64).item()
        acc, want = 0.0, None
        for i, p in enumerate(probs):
            acc += p
            if p > 0 and u < acc:
                want = i
                break
        assert sample_next_token(logits, settings, g) == (
            want if want is not None else max(i for i, p in enumerate(probs) if p)
        )


def test_draw_frequencies_match_probabilities():
    g = torch.Generator().manual_seed(6)
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0])
    probs = ref_probs(logits.tolist())
    n = 6000
    counts = [0] * 5
    for _ in range(n):
        counts[sample_next_token(logits, SampleConfig(temperature=1.0), g)] += 1
    for c, p in zip(counts, probs):
        assert abs(c / n - p) < 4 * math.sqrt(p * (1 - p) / n)


# ---- the generator -----------------------------------------------------------------------------


def test_same_seed_same_text_different_seed_different_text():
    model = model_of()
    s = SampleConfig(temperature=1.0, max_tokens=80, seed=11)
    prompt = CHARS.encode("hello there")
    a = Streamer(model, CHARS).complete(prompt, s)
    b = Streamer(model, CHARS).complete(prompt, s)
    gen = Streamer(model, CHARS)
    gen.complete(CHARS.encode("something else"), s)
    gen.reset()
    c = gen.complete(prompt, s)  # a used generator, reset, is as good as new
    d = Streamer(model, CHARS).complete(prompt, SampleConfig(temperature=1.0, max_tokens=80, seed=12))
    assert a == b == c
    assert len(a) == 80 and a != d


@pytest.mark.parametrize("positions,layers", [("rope", 1), ("learned", 2), ("sinusoidal", 2)])
def test_cached_and_uncached_generation_agree(positions, layers):
    """Well past the context. (A rolled cache in a RoPE model of 2+ layers sees further back than the
    window recomputed without a cache: test_rolling_cache_generation_is_sliding_window_attention.)"""
    model = model_of(positions=positions, layers=layers, context=16)
    s = SampleConfig(temperature=0, max_tokens=60)
    prompt = CHARS.encode("the cat")
    assert Streamer(model, CHARS).complete(prompt, s) == Streamer(model, CHARS, use_cache=False).complete(prompt, s)


def test_rolling_cache_generation_is_sliding_window_attention():
    """Greedy generation with a rolling cache picks, at every step, the argmax of the sliding-window
    reference over the whole text so far."""
    model = model_of(context=16, layers=3)
    gen = Streamer(model, CHARS)
    text = CHARS.encode("the cat") + CHARS.encode(
        gen.complete(CHARS.encode("the cat"), SampleConfig(temperature=0, max_tokens=60))
    )
    with torch.no_grad():
        reference = sliding_window_logits(model, text[:-1]).argmax(-1)
    assert text[7:] == reference[6:].tolist()
    assert text != CHARS.encode(
        "the cat"
        + Streamer(model, CHARS, use_cache=False).complete(
            CHARS.encode("the cat"), SampleConfig(temperature=0, max_tokens=60)
        )
    )  # the two semantics do differ here


def test_stats_are_filled():
    gen = Streamer(model_of(), CHARS)
    gen.complete(CHARS.encode("abc"), SampleConfig(max_tokens=30, seed=0))
    d = gen.stats.to_dict()
    assert d["tokens"] == 30 and d["prompt_tokens"] == 3 and d["seconds"] > 0 and d["tokens_per_s"] > 0
    assert 0 < d["ttft_ms"] <= d["seconds"] * 1000


def test_empty_prompt_starts_from_a_newline():
    gen = Streamer(model_of(), CHARS)
    text = gen.complete([], SampleConfig(max_tokens=5, seed=0))
    assert len(text) == 5 and gen.ids[0] == CHARS.encode("\n")[0]


@pytest.mark.parametrize("tokenizer", ["char", "bpe"])
def test_stop_strings_cut_exactly_even_across_tokens(tokenizer):
    """Generate freely, pick a stop string that spans two tokens, generate again with the same seed:
    the text must be the free text cut just before the stop string's first appearance."""
    tok = (
        CHARS
        if tokenizer == "char"
        else BPETokenizer.train(["the cat sat on the mat. " * 50, "hello world! " * 50], 300)
    )
    model = model_of(vocab=tok.vocab_size, context=32)
    settings = SampleConfig(temperature=1.0, max_tokens=150, seed=21)
    tokens = tokens_by_hand(model, tok, "the ", settings)
    data = [tok.token_bytes(t) for t in tokens]
    free = b"".join(data).decode("utf-8", errors="replace")
    assert Streamer(model, tok).complete(tok.encode("the "), settings) == free
    # a boundary between two tokens a third of the way in (where the bytes so far are whole characters)
    cut = None
    for i in range(len(data)):
        try:
            cut = len(b"".join(data[: i + 1]).decode("utf-8"))
        except UnicodeDecodeError:
            continue
        if cut >= len(free) // 3:
            break
    stop = free[cut - 2 : cut + 2]
    first = free.find(stop)
    with_stop = SampleConfig(**{**settings.to_dict(), "stop": [stop]})
    pieces = list(Streamer(model, tok).stream(tok.encode("the "), with_stop))
    assert "".join(pieces) == free[:first]
    # of two stop strings, the earlier one wins
    other = free[first + 5 : first + 8]
    both = SampleConfig(**{**settings.to_dict(), "stop": [other, stop]})
    assert Streamer(model, tok).complete(tok.encode("the "), both) == free[: min(first, free.find(other))]


def tokens_by_hand(model, tok, prompt: str, settings: SampleConfig) -> list[int]:
    """The generation of Streamer.stream, step by step by hand: the new token ids."""
    gen = Streamer(model, tok)
    generator = torch.Generator().manual_seed(settings.seed)
    gen.ids = tok.encode(prompt)
    out = []
    for _ in range(settings.max_tokens):
        token = sample_next_token(gen.next_logits(), settings, generator)
        gen.ids.append(token)
        out.append(token)
    return out


def test_utf8_stream_never_shows_half_a_character():
    text = "日本語のテキスト 🎉🐍 emoji and 中文字符 mixed 😀👍🏽 text. " * 20
    tok = BPETokenizer.train([text], 300)  # few merges: most multi-byte characters stay split in bytes
    ids = tok.encode(text)
    broken = 0
    for t in ids:
        try:
            tok.token_bytes(t).decode("utf-8")
        except UnicodeDecodeError:
            broken += 1
    assert broken > 10  # the point of the test: tokens that are not whole characters
    stream, pieces = Utf8Stream(), []
    for t in ids:
        pieces.append(stream.push(tok.token_bytes(t)))
    pieces.append(stream.flush())
    assert not any("\ufffd" in p for p in pieces)
    assert "".join(pieces) == text


def test_generator_streams_bpe_bytes_like_a_whole_decode():
    """Streaming must decode exactly as decoding all the bytes at once would: '�' only where the bytes
    really are invalid, never for a character split between two tokens."""
    text = "日本語のテキスト 🎉🐍 中文字符 😀👍🏽 " * 20
    tok = BPETokenizer.train([text], 300)
    model = model_of(vocab=tok.vocab_size, context=24, scale=0.1)
    settings = SampleConfig(temperature=1.0, max_tokens=300, seed=3)
    pieces = list(Streamer(model, tok).stream(tok.encode("日本"), settings))
    whole = decode_at_once(model, tok, "日本", settings)
    assert "".join(pieces) == whole
    assert sum(ord(c) > 0x3000 and c != "\ufffd" for c in whole) > 10  # it did make multi-byte characters


def decode_at_once(model, tok, prompt: str, settings: SampleConfig) -> str:
    """The same generation without streaming, then one decode of all the bytes."""
    return b"".join(tok.token_bytes(t) for t in tokens_by_hand(model, tok, prompt, settings)).decode(
        "utf-8", errors="replace"
    )


# ---- the cache against full recomputation ------------------------------------------------------

CONFIGS = [
    ("transformer", "rope", True),
    ("transformer", "rope", False),
    ("transformer", "learned", True),
    ("transformer", "sinusoidal", True),
    ("transformer", "learned", False),
    ("lstm", "rope", True),
    ("gru", "rope", True),
]


def sliding_window_logits(model, ids: list[int]) -> torch.Tensor:
    """What a rolling cache computes, written out plainly: one pass over all of ids (as long as they
    are) in which each position attends to itself and the context - 1 positions before it, with RoPE
    at the true positions. Logits (len(ids), vocab)."""
    cfg, N = model.cfg, len(ids)
    nh, hs = cfg.n_heads, cfg.d_model // cfg.n_heads
    freq = 1.0 / 10000.0 ** (torch.arange(0, hs, 2, dtype=torch.float64) / hs)
    angles = torch.outer(torch.arange(N, dtype=torch.float64), freq)
    cos, sin = angles.cos().float(), angles.sin().float()  # (N, hs/2)

    def rotate(t):  # (nh, N, hs): each (first half, second half) channel pair turned by its position's angle
        a, b = t.chunk(2, dim=-1)
        return torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)

    i = torch.arange(N)
    seen = (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - cfg.context)  # (query, key)
    x = model.tok_emb(torch.tensor(ids))  # (N, C)
    for block in model.blocks:
        q, k, v = (t.view(N, nh, hs).transpose(0, 1) for t in block.attn.qkv(block.norm1(x)).split(cfg.d_model, -1))
        scores = (rotate(q) @ rotate(k).transpose(-2, -1)) / math.sqrt(hs)  # (nh, N, N)
        y = scores.masked_fill(~seen, float("-inf")).softmax(-1) @ v  # (nh, N, hs)
        x = x + block.attn.proj(y.transpose(0, 1).reshape(N, cfg.d_model))
        x = x + block.mlp(block.norm2(x))
    return model.head(model.norm(x))


@pytest.mark.parametrize("kind,positions,fast", CONFIGS)
def test_cached_steps_equal_a_full_pass_at_every_position(kind, positions, fast):
    """Every step of the Streamer (prefill, one-token steps, window slides and re-prefills, a rolled
    cache) gives the logits of one full forward pass: for RoPE the sliding-window pass over the whole
    text so far, for learned and sinusoidal positions the pass over the last context tokens (what the
    generator holds), for an RNN the pass over the whole text."""
    model = model_of(kind, positions, context=16)
    g = torch.Generator().manual_seed(7)
    gen = Streamer(model, CHARS, fast_decode=fast)
    gen.ids = torch.randint(0, CHARS.vocab_size, (5,), generator=g).tolist()
    text = list(gen.ids)
    slides, worst = 0, 0.0
    for _ in range(60):
        before = len(gen.ids)
        logits = torch.as_tensor(gen.next_logits())
        slides += len(gen.ids) < before
        assert gen.ids == text[-16:] if kind == "transformer" else gen.ids == text
        with torch.no_grad():
            if kind == "transformer" and positions == "rope":
                full = sliding_window_logits(model, text)[None]
            else:
                full, _ = model(torch.tensor([gen.ids]))
        worst = max(worst, (logits - full[0, -1]).abs().max().item())
        token = int(torch.randint(0, CHARS.vocab_size, (1,), generator=g))
        gen.ids.append(token)
        text.append(token)
    assert worst <= 1e-4
    assert full.abs().max() > 1.0  # the logits are big enough for the comparison to bite
    assert (gen.fast is not None) == fast  # the numpy step (FastDecoder, FastRNN) ran when asked for
    if kind == "transformer":
        assert slides >= 5 and len(gen.ids) <= 17


@pytest.mark.parametrize("kind,positions,fast", CONFIGS)
def test_prefill_in_chunks_equals_a_full_pass(kind, positions, fast):
    """Chunks of several tokens go through forward(); with fast, single tokens through the numpy step."""
    model = model_of(kind, positions, context=32)
    ids = torch.randint(0, CHARS.vocab_size, (1, 32), generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        full, _ = model(ids)
        cache = model.new_cache(1)
        step = ((FastDecoder if kind == "transformer" else FastRNN)(model, cache).step_np) if fast else None
        outs, start = [], 0
        for size in (5, 1, 1, 3, 1, 7, 1, 1, 2, 10):
            if size == 1 and step is not None:
                out = torch.from_numpy(step(int(ids[0, start]))).view(1, 1, -1)
            else:
                out, _ = model(ids[:, start : start + size], cache=cache)
            outs.append(out)
            start += size
    assert start == 32 and cache.pos == 32
    assert (torch.cat(outs, dim=1) - full).abs().max().item() <= 1e-4


def test_transformer_cache_refuses_to_overflow():
    model = model_of(context=8)
    cache = model.new_cache(1)
    with torch.no_grad():
        model(torch.zeros(1, 8, dtype=torch.long), cache=cache)
        with pytest.raises(ValueError, match="exceed the model's context"):
            model(torch.zeros(1, 1, dtype=torch.long), cache=cache)


@pytest.mark.parametrize("kind", ["transformer", "lstm"])
def test_five_thousand_tokens_with_a_tiny_context(kind):
    model = model_of(kind, context=8, layers=1, d_model=16, heads=2)
    gen = Streamer(model, CHARS)
    text = gen.complete(CHARS.encode("abc"), SampleConfig(temperature=1.0, max_tokens=5000, seed=0))
    assert gen.stats.tokens == 5000 and len(text) == 5000
    if kind == "transformer":
        assert len(gen.ids) <= 9


def test_generation_leaves_the_thread_count_alone_even_when_streams_interleave():
    """Generation runs torch on one thread; interleaved streams (as compare runs them) must still
    leave the caller's thread count as it was."""
    try:
        torch.set_num_threads(2)
        model = model_of()
        a = Streamer(model, CHARS).stream(CHARS.encode("a"), SampleConfig(max_tokens=5, seed=0))
        b = Streamer(model, CHARS).stream(CHARS.encode("b"), SampleConfig(max_tokens=5, seed=0))
        next(a)
        next(b)
        assert torch.get_num_threads() == 1
        list(a)
        assert torch.get_num_threads() == 1  # b still runs
        list(b)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(1)  # as the session runs


@pytest.mark.parametrize("fast", [True, False])
def test_one_layer_rolling_cache_equals_a_full_pass_over_the_last_window(fast):
    """With one layer the keys depend on their token and position alone, so a rolled cache is exactly
    the model's own forward over the last context tokens."""
    model = model_of(layers=1, context=16)
    g = torch.Generator().manual_seed(9)
    gen = Streamer(model, CHARS, fast_decode=fast)
    gen.ids = torch.randint(0, CHARS.vocab_size, (3,), generator=g).tolist()
    worst = 0.0
    for _ in range(50):
        logits = torch.as_tensor(gen.next_logits())
        with torch.no_grad():
            full, _ = model(torch.tensor([gen.ids[-16:]]))
        worst = max(worst, (logits - full[0, -1]).abs().max().item())
        gen.ids.append(int(torch.randint(0, CHARS.vocab_size, (1,), generator=g)))
    assert gen.cache.pos > 40 and len(gen.ids) == 17  # it rolled, and keeps the window
    assert worst <= 1e-4 and full.abs().max() > 1.0


@pytest.mark.parametrize("positions", ["rope", "learned"])
def test_text_added_in_pieces_to_a_full_window(positions):
    """As chat's continue mode does: pieces of text (a prompt) added to a full window. Pieces shorter
    than the context roll in (RoPE) or re-prefill the window (absolute positions); a piece as long as
    the context starts again from its last context tokens."""
    model = model_of(positions=positions, context=16)
    g = torch.Generator().manual_seed(10)
    gen = Streamer(model, CHARS)
    text, start = [], 0  # the model's view begins at text[start] (after a restart)
    for n in (12, 1, 5, 3, 1, 20, 1, 7, 15, 2):
        piece = torch.randint(0, CHARS.vocab_size, (n,), generator=g).tolist()
        gen.ids.extend(piece)
        text.extend(piece)
        if n >= 16:
            start = len(text) - 16
        logits = torch.as_tensor(gen.next_logits())
        with torch.no_grad():
            if positions == "rope":
                want = sliding_window_logits(model, text[start:])[-1]
            else:
                want = model(torch.tensor([text[-16:]]))[0][0, -1]
        assert (logits - want).abs().max().item() <= 1e-4, f"after a piece of {n}"
        assert gen.ids == text[-16:]


@pytest.mark.parametrize("positions", ["rope", "learned"])
def test_a_long_prompt_is_cut_to_the_last_context_tokens(positions):
    model = model_of(positions=positions, context=16)
    prompt = torch.randint(0, CHARS.vocab_size, (50,), generator=torch.Generator().manual_seed(11)).tolist()
    gen = Streamer(model, CHARS)
    gen.ids = list(prompt)
    logits = torch.as_tensor(gen.next_logits())
    assert gen.ids == prompt[-16:] and gen.cache.pos == 16
    with torch.no_grad():
        torch.testing.assert_close(logits, model(torch.tensor([prompt[-16:]]))[0][0, -1], atol=1e-4, rtol=0)


def test_top_k_of_the_whole_vocabulary_stays_on_the_fast_path(monkeypatch):
    """Regression: top_k >= vocab keeps every token, yet it sent each draw through sampling_probs's
    torch ops. It draws what top_k=0 draws, without them."""
    import charlm.generate as generate

    g = torch.Generator().manual_seed(12)
    logits = [torch.randn(30, generator=g) * 2 for _ in range(100)]
    everything = [
        sample_next_token(x, SampleConfig(temperature=0.8), torch.Generator().manual_seed(i))
        for i, x in enumerate(logits)
    ]

    def refuse(*args, **kwargs):
        raise AssertionError("sampling_probs called")

    monkeypatch.setattr(generate, "sampling_probs", refuse)
    for k in (30, 200):
        assert [
            sample_next_token(x, SampleConfig(temperature=0.8, top_k=k), torch.Generator().manual_seed(i))
            for i, x in enumerate(logits)
        ] == everything


def test_a_bfloat16_model_rolls_on_the_torch_path():
    """The numpy step is float32 only; the torch step must roll too, its rope past the table in the model's dtype."""
    model = model_of(context=8).to(torch.bfloat16)
    gen = Streamer(model, CHARS)
    text = gen.complete(CHARS.encode("abc"), SampleConfig(temperature=1.0, max_tokens=30, seed=0))
    assert len(text) == 30 and gen.fast is None and gen.cache.pos == 32 and gen.cache.k.dtype == torch.bfloat16


@pytest.mark.parametrize(
    "settings",
    [
        SampleConfig(temperature=1.0, max_tokens=600),  # more than one block of uniform numbers
        SampleConfig(temperature=1.0, top_k=5, max_tokens=300, stop=["e"]),  # stopped early, mid-block
        SampleConfig(temperature=0, max_tokens=20),  # greedy: draws nothing
    ],
)
def test_stream_draws_what_one_uniform_per_token_draws(settings):
    """stream() takes its uniform numbers a block at a time (Uniforms): the same tokens as one
    torch.rand per sample_next_token call, and the generator left where those draws leave it."""
    model = model_of()
    prompt = CHARS.encode("hello")
    g = torch.Generator().manual_seed(3)
    gen = Streamer(model, CHARS)
    text = gen.complete(prompt, settings, g)
    ref, g_ref, tokens = Streamer(model, CHARS), torch.Generator().manual_seed(3), []
    ref.ids = list(prompt)
    for _ in range(gen.stats.tokens):
        tokens.append(sample_next_token(ref.next_logits(), settings, g_ref))
        ref.ids.append(tokens[-1])
    want = CHARS.decode(tokens)
    assert text == (want[: want.index("e")] if settings.stop else want)
    assert torch.equal(g.get_state(), g_ref.get_state())


@pytest.mark.parametrize(
    "logits, wanted",
    [
        ([0.0, math.nan, 1.0, 0.0], {0, 2, 3}),  # NaN has no mass
        ([0.0, math.inf, 1.0, math.inf], {1, 3}),  # the +inf ones share all of it
        ([3e38, -3e38, 0.0, 1.0], {0}),  # finite, but 3e38 / 0.8 overflowed to inf: NaN probabilities
        ([-math.inf, math.nan, -math.inf, -math.inf], {0, 1, 2, 3}),  # no token has any: every token alike
    ],
    ids=["nan", "inf", "huge", "none"],
)
@pytest.mark.parametrize(
    "settings",
    [SampleConfig(), SampleConfig(top_p=0.5), SampleConfig(top_k=2), SampleConfig(repetition_penalty=1.5)],
    ids=["plain", "top-p", "top-k", "penalty"],
)
def test_logits_that_are_not_all_numbers_still_give_a_token(logits, wanted, settings):
    """The sampler's property test: a model whose (finite) weights are huge overflows to inf or NaN logits. With top-p,
    sample_next_token raised IndexError ("unexpected ... please report it" in sample and chat); elsewhere it
    drew from NaN probabilities (any token, the last most often) with a RuntimeWarning on the terminal."""
    logits = torch.tensor(logits)
    probs = sampling_probs(logits, settings, torch.tensor([1, 2]))
    assert abs(float(probs.sum()) - 1) < 1e-6 and set(torch.nonzero(probs).flatten().tolist()) <= wanted
    generator = torch.Generator().manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        drawn = {sample_next_token(logits, settings, generator, torch.tensor([1, 2])) for _ in range(20)}
    assert drawn <= wanted and all(probs[i] > 0 for i in drawn)


def test_a_top_p_below_float32s_smallest_keeps_the_first_token(old_pt):
    """The sampler property test: a top_p of 1e-50 is valid (in (0, 1]) but 0 in float32, so no token was kept:
    IndexError ("unexpected ... please report it" in `charlm sample --top-p 1e-50`)."""
    probs = sampling_probs(torch.tensor([0.0, 1.0, 0.5]), SampleConfig(top_p=1e-50))
    assert probs.tolist() == [0.0, 1.0, 0.0]
    r = cli("sample", old_pt, "-n", "3", "--top-p", "1e-50", "--seed", "0")
    assert r.exit_code == 0, r.output
