"""FastDecoder, the numpy one-token step, against the torch Transformer block by block: the residual
stream after each block's attention and after its MLP, and the logits, at every position. A failure
names the first block (and half of it) where the two part."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from charlm.config import POSITIONS, ModelConfig
from charlm.generate import SampleConfig, Streamer
from charlm.models import build_model, count_params
from charlm.models.fast_decode import FastDecoder
from charlm.tokenizer import CharTokenizer

VOCAB = 40
# the tiny preset's extras (ModelConfig.qk_norm, .smear, an untied head), off and on: every path checked with and
# without them
EXTRAS = pytest.mark.parametrize("extras", [False, True], ids=["plain", "qk-norm+smear+untied"])


def model_of(positions="rope", layers=3, context=24, seed=0, extras=False):
    """Random weights large enough that logits are O(1..10), so a 1e-4 agreement means something."""
    torch.manual_seed(seed)
    cfg = ModelConfig(
        kind="transformer",
        vocab_size=VOCAB,
        n_layers=layers,
        d_model=32,
        n_heads=4,
        context=context,
        positions=positions,
        qk_norm=extras,
        smear=extras,
        tied=not extras,
    )
    model = build_model(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    return model


def torch_stages(model, ids: list[int]) -> list[tuple[str, torch.Tensor]]:
    """The torch model's residual stream at the last position of ids, after each block's attention and
    after its MLP (captured with forward hooks on model.blocks and their attention), then the logits."""
    seen = {}

    def block_hook(i):
        def hook(block, inputs, output):
            seen[i, "MLP"] = output[0, -1]
            seen[i, "attention"] = inputs[0][0, -1] + seen.pop((i, "attn out"))  # the residual after attention

        return hook

    def attn_hook(i):
        def hook(attn, inputs, output):
            seen[i, "attn out"] = output[0, -1]

        return hook

    handles = [
        h
        for i, b in enumerate(model.blocks)
        for h in (b.register_forward_hook(block_hook(i)), b.attn.register_forward_hook(attn_hook(i)))
    ]
    try:
        with torch.no_grad():
            logits, _ = model(torch.tensor([ids]))
    finally:
        for h in handles:
            h.remove()
    return [
        (f"block {i} ({part})", seen[i, part]) for i in range(len(model.blocks)) for part in ("attention", "MLP")
    ] + [("logits", logits[0, -1])]


def first_mismatch(model, ids: list[int], decoder: FastDecoder, tol: float = 1e-4) -> str | None:
    """Feed ids[-1] to the decoder (which holds ids[:-1]); name the first stage that departs from torch."""
    trace = []
    with torch.no_grad():
        logits = decoder.step(ids[-1], trace)
    fast = [torch.from_numpy(x) for x in trace] + [logits]
    reference = torch_stages(model, ids)
    assert len(fast) == len(reference)
    for (name, want), got in zip(reference, fast):
        err = (got - want).abs().max().item()
        if err > tol:
            return f"first mismatch in {name} at position {len(ids) - 1}: max |fast - torch| = {err:.2e}"
    return None


def decode_all(model, ids: list[int], prefill: int) -> str | None:
    """Prefill with torch, then every further token through the decoder, checked at each position."""
    cache = model.new_cache(1)
    with torch.no_grad():
        model(torch.tensor([ids[:prefill]]), cache=cache)
    decoder = FastDecoder(model, cache)
    for t in range(prefill, len(ids)):
        problem = first_mismatch(model, ids[: t + 1], decoder)
        if problem:
            return problem
    assert cache.pos == len(ids)
    return None


@EXTRAS
@pytest.mark.parametrize("positions", POSITIONS)
@pytest.mark.parametrize("prefill", [1, 7])
def test_fast_step_equals_torch_block_by_block_at_every_position(positions, prefill, extras):
    model = model_of(positions, extras=extras)
    ids = torch.randint(0, VOCAB, (24,), generator=torch.Generator().manual_seed(1)).tolist()
    problem = decode_all(model, ids, prefill)
    assert problem is None, problem


def test_a_fault_is_named_by_its_block_and_half():
    """The diagnosis itself: spoil block 1's MLP in the decoder's copy of the weights only, and the
    failure names block 1 (MLP), not block 0, nor the logits."""
    model = model_of()
    ids = torch.randint(0, VOCAB, (10,), generator=torch.Generator().manual_seed(2)).tolist()
    cache = model.new_cache(1)
    with torch.no_grad():
        model(torch.tensor([ids[:-1]]), cache=cache)
    decoder = FastDecoder(model, cache)
    n1, qkv, proj, n2, fc, fc_proj = decoder.layers[1]
    decoder.layers[1] = (n1, qkv, proj, n2, fc * 1.01, fc_proj)
    assert first_mismatch(model, ids, decoder).startswith("first mismatch in block 1 (MLP) at position 9")
    cache.pos -= 1  # the same step again, now with block 0's attention spoilt
    decoder.layers[1] = (n1, qkv, proj, n2, fc, fc_proj)
    n1, qkv, proj, n2, fc, fc_proj = decoder.layers[0]
    decoder.layers[0] = (n1, qkv, proj * 1.01, n2, fc, fc_proj)
    assert first_mismatch(model, ids, decoder).startswith("first mismatch in block 0 (attention) at position 9")


def test_supports_only_what_it_computes_exactly():
    model = model_of()
    with torch.no_grad():
        assert FastDecoder.supports(model)
        model.train()  # dropout: forward() would differ
        assert not FastDecoder.supports(model)
        model.eval()
        assert not FastDecoder.supports(model.to(torch.bfloat16))
    assert FastDecoder.supports(model_of())  # grad enabled: the same logits, only no graph (the step never needs one)
    lstm = build_model(ModelConfig(kind="lstm", vocab_size=VOCAB, d_model=16)).eval()
    with torch.no_grad():
        assert not FastDecoder.supports(lstm)


def test_a_decoder_knows_when_its_views_went_stale():
    """current(): the per-token check. Train mode, or a round trip to another dtype (the weights come
    back in new memory, the decoder's views stay on the old), and the decoder is no longer current."""
    model = model_of()
    decoder = FastDecoder(model, model.new_cache(1))
    assert decoder.current()
    model.train()
    assert not decoder.current()
    model.eval()
    assert decoder.current()
    model.to(torch.bfloat16).to(torch.float32)
    assert not decoder.current() and FastDecoder.supports(model) and FastDecoder(model, model.new_cache(1)).current()


def test_the_streamer_replaces_a_stale_decoder():
    """After a round trip through bfloat16 (weights rounded, in new memory) the Streamer's numpy step
    reads the model's weights as they are now, not the old memory."""
    model = model_of()
    gen = Streamer(model, tokenizer=None)
    for _ in range(2):
        gen.reset()
        gen.ids = [1, 2, 3]
        gen.next_logits()  # a prompt: torch
        gen.ids.append(4)
        logits = torch.as_tensor(gen.next_logits())  # one new token: the numpy step
        with torch.no_grad():
            want = model(torch.tensor([[1, 2, 3, 4]]))[0][0, -1]
        assert gen.fast is not None and (logits - want).abs().max().item() <= 1e-4
        model.to(torch.bfloat16).to(torch.float32)


def test_refuses_to_run_past_the_context():
    model = model_of(context=8)
    cache = model.new_cache(1)
    with torch.no_grad():
        model(torch.zeros(1, 8, dtype=torch.long), cache=cache)
        with pytest.raises(ValueError, match="9 positions exceed the model's context of 8"):
            FastDecoder(model, cache).step(0)


def follows_torch_past_the_context(model, make_decoder, made_before_the_prompt: bool = False) -> None:
    """A rolling cache that wraps four times (context 8, 40 tokens): a one-token step's logits and its cache's
    contents (ring order included) as torch's one-token steps give them, at every position. The decoder is made
    on its cache before or after torch feeds it the prompt."""
    ids = torch.randint(0, VOCAB, (40,), generator=torch.Generator().manual_seed(3)).tolist()
    fast_cache, torch_cache = model.new_cache(1, rolling=True), model.new_cache(1, rolling=True)
    decoder = make_decoder(model, fast_cache) if made_before_the_prompt else None
    with torch.no_grad():
        for cache in (fast_cache, torch_cache):
            model(torch.tensor([ids[:5]]), cache=cache)
        decoder = decoder or make_decoder(model, fast_cache)
        for t in range(5, 40):
            want = model(torch.tensor([[ids[t]]]), cache=torch_cache)[0][0, -1]
            got = decoder.step(ids[t])
            assert (got - want).abs().max().item() <= 1e-4, f"position {t}"
    assert fast_cache.pos == torch_cache.pos == 40
    torch.testing.assert_close(fast_cache.k, torch_cache.k, atol=1e-5, rtol=0)
    torch.testing.assert_close(fast_cache.v, torch_cache.v, atol=1e-5, rtol=0)


@EXTRAS
@pytest.mark.parametrize("positions", ["rope", "alibi"])  # the relative ones: their cache rolls
def test_rolling_cache_fast_equals_torch_far_past_the_context(positions, extras):
    """Three contexts' worth of tokens after the cache fills: the same logits and the same cache
    contents (ring order included) as torch's one-token steps, at every position."""
    model = model_of(positions, context=8, extras=extras)
    follows_torch_past_the_context(model, FastDecoder, made_before_the_prompt=True)


# ---- the RNN's numpy step (FastRNN) ---------------------------------------------------------------------


@pytest.mark.parametrize("table", [True, False], ids=["input table", "no table"])
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_the_numpy_rnn_step_follows_torch_state_by_state(kind, table, monkeypatch):
    """FastRNN against torch's nn.LSTM / nn.GRU, one token at a time after a prompt torch fed: each layer's h
    (and the LSTM's c) after every step, then the logits. A failure names the first step, layer and quantity
    where the two part. The state is the cache's own, so torch may take over again and agree. Both ways of the
    first layer's input part: its row of the per-token table, and (a vocabulary too large for one) W_ih e."""
    from charlm.models import fast_rnn
    from charlm.models.fast_rnn import FastRNN

    if not table:
        monkeypatch.setattr(fast_rnn, "TABLE_BYTES", 0)

    torch.manual_seed(0)
    model = build_model(ModelConfig(kind=kind, vocab_size=VOCAB, n_layers=2, d_model=24, context=16)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.6)  # logits O(1..10), and gates well away from saturation only in part
    ours, theirs = model.new_cache(1), model.new_cache(1)
    ids = torch.randint(0, VOCAB, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    with torch.no_grad():
        model.decode(ids[:5], ours), model.decode(ids[:5], theirs)  # a prompt, fed by torch
        fast = FastRNN(model, ours)
        assert (fast.table is not None) == table
        names = ["h", "c"] if kind == "lstm" else ["h"]
        for t, token in enumerate(ids[5:30]):
            trace: list = []
            got = fast.step_np(token, trace)
            want = model.decode([token], theirs)
            state = theirs.state if kind == "lstm" else (theirs.state,)
            for i, value in enumerate(trace):
                layer, which = divmod(i, len(names))
                gap = (torch.from_numpy(value) - state[which][layer, 0]).abs().max().item()
                assert gap <= 1e-5, f"step {t}: layer {layer}'s {names[which]} departs from torch by {gap:.2g}"
            gap = (torch.from_numpy(got) - want).abs().max().item()
            assert gap <= 1e-4, f"step {t}: the logits depart from torch by {gap:.2g}"
        assert want.abs().max() > 1.0 and ours.pos == theirs.pos == 30
        for token in ids[30:]:  # torch again on the state numpy left: still the same
            a, b = model.decode([token], ours), model.decode([token], theirs)
        assert (a - b).abs().max().item() <= 1e-4


def test_the_streamer_steps_an_lstm_in_numpy():
    """generate's Streamer runs the numpy step for an RNN's single new tokens, on the prompt's torch state."""
    from charlm.models.fast_rnn import FastRNN

    model = build_model(ModelConfig(kind="lstm", vocab_size=VOCAB, n_layers=2, d_model=16, context=16)).eval()
    gen = Streamer(model, tokenizer=None)
    gen.ids = [1, 2, 3]
    gen.next_logits()  # a prompt: torch
    gen.ids.append(4)
    logits = gen.next_logits()  # one new token: numpy
    with torch.no_grad():
        want = model(torch.tensor([[1, 2, 3, 4]]))[0][0, -1]
    assert isinstance(gen.fast, FastRNN) and (torch.as_tensor(logits) - want).abs().max().item() <= 1e-5


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_the_rnn_steps_input_table_is_remade_when_the_weights_change_in_place(kind):
    """The input table is a copy of layer 0's W_ih applied to every token: after an in-place update of those
    weights (as an optimizer step or load_state_dict makes), the Streamer's next numpy step is a new one, and its
    logits are the model's own."""
    from charlm.models.fast_rnn import FastRNN

    torch.manual_seed(0)
    model = build_model(ModelConfig(kind=kind, vocab_size=VOCAB, n_layers=2, d_model=16, context=16)).eval()
    gen, theirs = Streamer(model, tokenizer=None), model.new_cache(1)
    gen.ids = [1, 2, 3]
    gen.next_logits()  # a prompt: torch
    gen.ids.append(4)
    gen.next_logits()  # one new token: numpy, with its table
    first = gen.fast
    assert isinstance(first, FastRNN) and first.table is not None and first.current()
    with torch.no_grad():
        model.decode([1, 2, 3], theirs), model.decode([4], theirs)  # torch's state after the same tokens
        model.rnn.weight_ih_l0.mul_(-2.0)  # in place: the same memory, other values
        want = model.decode([5], theirs)  # the next step with the new weights
    assert not first.current()
    gen.ids.append(5)
    logits = gen.next_logits()
    assert gen.fast is not first and (torch.as_tensor(logits) - want).abs().max().item() <= 1e-5


# ---- the compiled step (CompiledDecoder: numba, matrices stored as bf16 or int8) ------------------------------


@pytest.fixture(scope="module")
def compiled():
    """The compiled kernel, compiled (or loaded from numba's cache) once for the test session."""
    from charlm.models import compiled_decode

    assert compiled_decode.kernel(wait=True) is not None, "numba is a dependency: the compiled step should build"
    return compiled_decode


def rounded_to_bf16(model):
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    return model


def as_int8_run(model):
    """The model as `charlm compress --bits 8` leaves it once loaded: every matrix storage/quantized.py's int8 values
    times their row scales (quantized.dequantized's arithmetic)."""
    from charlm.storage.quantized import quantize

    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                q = quantize(p.numpy(), 8)
                p.copy_(torch.from_numpy(q["values"]).float() * torch.from_numpy(q["scales"])[:, None])
    return model


def compiled_all(compiled, model, ids, prefill, storage, tol=1e-4, found=None):
    cache = model.new_cache(1)
    with torch.no_grad():
        model(torch.tensor([ids[:prefill]]), cache=cache)
    decoder = compiled.CompiledDecoder(model, cache, storage=storage)
    assert decoder.storage == (storage or found)
    for t in range(prefill, len(ids)):
        problem = first_mismatch(model, ids[: t + 1], decoder, tol)
        if problem:
            return problem
    assert cache.pos == len(ids)
    return None


IDS = torch.randint(0, VOCAB, (24,), generator=torch.Generator().manual_seed(1)).tolist()


@EXTRAS
@pytest.mark.parametrize("positions", POSITIONS)
def test_compiled_step_equals_torch_block_by_block(compiled, positions, extras):
    """The kernel's arithmetic, with the weights as they are (float32 storage): torch's recompute of the whole
    prefix at every position, block by block, to 1e-4 on logits of O(1..10)."""
    problem = compiled_all(compiled, model_of(positions, extras=extras), IDS, 3, "f32")
    assert problem is None, problem


@pytest.mark.parametrize("positions", POSITIONS)
def test_bf16_storage_is_exact_on_weights_bf16_can_hold(compiled, positions):
    """The widening of bf16 values: on a model whose weights are already bf16 numbers, the bf16 step computes
    torch's float32 logits to 1e-4."""
    problem = compiled_all(compiled, rounded_to_bf16(model_of(positions)), IDS, 5, "bf16")
    assert problem is None, problem


def test_bf16_storage_moves_logits_by_bf16_rounding_only(compiled):
    """On float32 weights, storing matrices as bf16 (8 significant bits) moves each logit by what that rounding
    explains (here |logit| up to ~2 and gaps ~0.01, bounded by 0.05: bf16 keeps 8 significant bits), and keeps the top
    token at every position (the trained model of benchmarks/RESULTS.md: 300/300, mean KL 1.5e-5)."""
    model = model_of("rope", context=40)
    ids = torch.randint(0, VOCAB, (40,), generator=torch.Generator().manual_seed(4)).tolist()
    cache = model.new_cache(1)
    with torch.no_grad():
        model(torch.tensor([ids[:1]]), cache=cache)
        decoder = compiled.CompiledDecoder(model, cache, storage="bf16")
        want = model(torch.tensor([ids]))[0][0]
    got = torch.stack([decoder.step(t) for t in ids[1:]])
    gap = (got - want[1:]).abs().max().item()
    assert want.abs().max() > 1.0 and gap <= 0.05, gap
    assert (got.argmax(-1) == want[1:].argmax(-1)).all()


@pytest.mark.parametrize("positions", ["rope", "learned"])
def test_an_int8_run_computes_its_dequantized_model(compiled, positions):
    """charlm compress --bits 8: the step reads the int8 values and row scales back off the dequantized weights
    and computes the dequantized model's logits to float rounding."""
    problem = compiled_all(compiled, as_int8_run(model_of(positions)), IDS, 2, None, found="int8")
    assert problem is None, problem
    problem = compiled_all(compiled, as_int8_run(model_of(positions)), IDS, 2, "int8")
    assert problem is None, problem


def test_int8_is_found_only_where_every_matrix_holds_it(compiled):
    model = as_int8_run(model_of())
    with torch.no_grad():
        model.blocks[1].mlp.fc.weight[0, 0] += 1e-3  # one weight off its row's grid
    assert compiled.CompiledDecoder(model, model.new_cache(1)).storage == "f32"  # small: float32 as it is
    with pytest.raises(ValueError, match="not int8"):
        compiled.CompiledDecoder(model, model.new_cache(1), storage="int8")


def test_matrices_past_l2_size_are_read_as_bf16_by_both_steps(compiled):
    """Storage by size: float32 up to BF16_ABOVE bytes of matrices (the tests' models), bf16 past it, in the numpy
    step as in the compiled one, which compute the same logits there (to float rounding: a hand-over mid-stream
    keeps a seed's text) and torch's to bf16 rounding."""
    from charlm.models.fast_decode import BF16_ABOVE

    small = model_of()
    torch.manual_seed(0)
    big = build_model(ModelConfig(kind="transformer", vocab_size=VOCAB, n_layers=2, d_model=128, n_heads=4)).eval()
    with torch.no_grad():
        for p in big.parameters():
            p.normal_(0.0, 0.1)
    assert 4 * count_params(small) < BF16_ABOVE < 4 * count_params(big)
    assert compiled.CompiledDecoder(small, small.new_cache(1)).storage == FastDecoder(small, small.new_cache(1)).storage
    assert FastDecoder(small, small.new_cache(1)).storage == "f32"
    caches = [big.new_cache(1) for _ in range(3)]
    with torch.no_grad():
        for cache in caches:
            big(torch.tensor([IDS[:3]]), cache=cache)
        numpy_step, compiled_step = FastDecoder(big, caches[0]), compiled.CompiledDecoder(big, caches[1])
        assert numpy_step.storage == compiled_step.storage == "bf16"
        for t in IDS[3:]:
            a, b, want = numpy_step.step(t), compiled_step.step(t), big(torch.tensor([[t]]), cache=caches[2])[0][0, -1]
            assert (a - b).abs().max().item() <= 1e-4
            assert 1e-5 < (a - want).abs().max().item() <= 0.05  # bf16's rounding, seen and bounded
    torch.testing.assert_close(caches[0].k, caches[1].k, atol=1e-5, rtol=0)


def test_a_pruned_model_steps_compiled(compiled):
    """Heads dropped by charlm compress (n_heads * head_size < d_model)."""
    model = model_of("rope")
    cfg, state, _ = type(model).prune(model.cfg, model.state_dict(), np.arange(12.0).reshape(3, 4), 1)
    pruned = build_model(cfg).eval()
    pruned.load_state_dict(state)
    assert cfg.n_heads * cfg.head_size < cfg.d_model
    problem = compiled_all(compiled, pruned, IDS, 4, "f32")
    assert problem is None, problem


@EXTRAS
@pytest.mark.parametrize("positions", ["rope", "alibi"])
def test_compiled_rolling_cache_equals_torch_far_past_the_context(compiled, positions, extras):
    """A rolling cache that wraps four times: logits and cache contents (ring order) as torch's one-token steps."""
    model = rounded_to_bf16(model_of(positions, context=8, extras=extras))
    follows_torch_past_the_context(model, compiled.CompiledDecoder)


def test_compiled_refuses_to_run_past_the_context(compiled):
    model = model_of(context=8)
    cache = model.new_cache(1)
    with torch.no_grad():
        model(torch.zeros(1, 8, dtype=torch.long), cache=cache)
        with pytest.raises(ValueError, match="9 positions exceed the model's context of 8"):
            compiled.CompiledDecoder(model, cache).step(0)
    with pytest.raises(IndexError, match="outside the vocabulary of 40"):  # never read past the embedding
        compiled.CompiledDecoder(model, model.new_cache(1)).step(VOCAB)


def streamed_logits(gen, prompt, more):
    """The Streamer's logits after the prompt (torch) and then after each further token (the one-token step)."""
    gen.reset()
    gen.ids = list(prompt)
    out = [torch.as_tensor(gen.next_logits())]
    for t in more:
        gen.ids.append(t)
        out.append(torch.as_tensor(gen.next_logits()))
    return torch.stack(out)


def test_the_streamer_steps_compiled_and_notices_training(compiled):
    """The Streamer takes the compiled step once it is ready; a model updated in place (an optimizer step between
    two training previews) makes it copy the weights again."""
    model = rounded_to_bf16(model_of())
    gen = Streamer(model, tokenizer=None)
    streamed_logits(gen, [1, 2, 3], [4])
    assert isinstance(gen.fast, compiled.CompiledDecoder) and gen.fast.current()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.5)  # bf16 numbers still
        want = model(torch.tensor([[1, 2, 3, 4, 5]]))[0][0, -1]
    assert not gen.fast.current()
    got = streamed_logits(gen, [1, 2, 3], [4, 5])[-1]
    assert isinstance(gen.fast, compiled.CompiledDecoder) and (got - want).abs().max().item() <= 1e-4


def test_numpy_stands_in_while_the_kernel_compiles_then_hands_over(compiled, monkeypatch):
    model = rounded_to_bf16(model_of())
    monkeypatch.setitem(compiled._state, "kernel", None)  # as if compiling: a thread is running
    gen = Streamer(model, tokenizer=None)
    numpy_part = streamed_logits(gen, [1, 2], [3, 4])
    assert type(gen.fast) is FastDecoder
    monkeypatch.undo()  # compiled now
    gen.ids.append(5)
    last = torch.as_tensor(gen.next_logits())
    assert isinstance(gen.fast, compiled.CompiledDecoder)
    with torch.no_grad():
        want = model(torch.tensor([[1, 2, 3, 4, 5]]))[0][0]
    assert (torch.cat([numpy_part, last[None]]) - want[1:]).abs().max().item() <= 1e-4


def test_the_kernel_loads_only_for_long_generations(compiled, monkeypatch):
    """A short sample never imports numba: the load starts with the stream that would bring the Streamer's tokens
    to LOAD_AFTER, and the compiled step takes over once it is loaded."""
    model = model_of()
    ready = compiled._state["kernel"]
    monkeypatch.setattr(compiled, "_state", {"kernel": None, "failed": False, "thread": None, "cached": None})
    monkeypatch.setattr(compiled, "LOAD_AFTER", 8)
    monkeypatch.setattr(compiled, "_compile", lambda: compiled._state.update(kernel=ready))
    gen = Streamer(model, tokenizer=CharTokenizer.train(["".join(chr(c) for c in range(65, 65 + VOCAB))]))
    for _ in gen.stream([1, 2], SampleConfig(max_tokens=5, seed=0)):
        pass
    assert compiled._state["thread"] is None and type(gen.fast) is FastDecoder and gen._numpy_steps == 4
    pieces = gen.stream([3], SampleConfig(max_tokens=4, seed=0))  # 4 + 4 = LOAD_AFTER: loads at the start
    next(pieces)
    assert compiled._state["thread"] is not None
    compiled.kernel(wait=True)
    for _ in pieces:
        pass
    assert isinstance(gen.fast, compiled.CompiledDecoder)


def test_without_numba_the_numpy_step_serves(compiled, monkeypatch):
    """numba missing (or failing to compile): no error, kernel() says None, and the Streamer's text is the
    numpy step's."""
    import sys

    model = model_of()
    expected = Streamer(model, tokenizer=None, compiled=False)
    want = streamed_logits(expected, [1, 2], [3, 4, 5])
    monkeypatch.setattr(compiled, "_state", {"kernel": None, "failed": False, "thread": None, "cached": None})
    monkeypatch.setitem(sys.modules, "charlm.models._decode_kernel", None)  # import fails as without numba
    assert compiled.kernel(wait=True) is None and compiled._state["failed"]
    gen = Streamer(model, tokenizer=None)
    got = streamed_logits(gen, [1, 2], [3, 4, 5])
    assert type(gen.fast) is FastDecoder and torch.equal(got, want)


def test_a_failed_compile_leaves_the_numpy_step(compiled, monkeypatch):
    """A cold cache whose compile fails (here the child process exits 1): kernel() says None for good, quietly,
    and the Streamer steps in numpy."""
    import sys

    from charlm.models import _decode_kernel

    monkeypatch.setattr(compiled, "_state", {"kernel": None, "failed": False, "thread": None, "cached": None})
    monkeypatch.setattr(_decode_kernel, "cached", lambda: False)
    monkeypatch.setattr(sys, "executable", "/bin/false")
    assert compiled.kernel(wait=True) is None and compiled._state["failed"] and compiled._state["cached"] is False
    gen = Streamer(model_of(), tokenizer=None)
    streamed_logits(gen, [1, 2], [3])
    assert type(gen.fast) is FastDecoder
