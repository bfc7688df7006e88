"""Models: the shared contract, causality, cached == full decoding, attention capture, learning, and
config validation. Everything is tiny and runs on the CPU."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import saved_model

from charlm.config import POSITIONS, ModelConfig, TrainConfig
from charlm.errors import ConfigError
from charlm.models import build_model, count_params, param_shapes
from charlm.models.rnn import RNN
from charlm.models.transformer import Transformer
from charlm.presets import preset
from charlm.settings import parse_duration
from charlm.storage.checkpoint import LAST
from charlm.tokenizer import CharTokenizer

V, B, T = 23, 2, 12

KINDS = [
    ("transformer", "rope"),
    ("transformer", "learned"),
    ("transformer", "sinusoidal"),
    ("transformer", "alibi"),
    ("transformer", "nope"),
    ("lstm", None),
    ("gru", None),
]
IDS = [f"{k}-{p}" if p else k for k, p in KINDS]


def tiny(kind: str = "transformer", positions: str | None = "rope", **kw) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = ModelConfig(
        kind=kind, vocab_size=V, n_layers=2, d_model=32, n_heads=4, context=16, positions=positions or "rope", **kw
    )
    return build_model(cfg).eval()


def tokens(b: int = B, t: int = T, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, V, (b, t), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("kind,positions", KINDS, ids=IDS)
@pytest.mark.parametrize("layers,d_model,heads,vocab,context", [(1, 8, 1, 2, 2), (3, 48, 6, 97, 33)])
def test_param_shapes_by_arithmetic_are_the_built_models(kind, positions, layers, d_model, heads, vocab, context):
    """The shapes a checkpoint is checked against before anything is allocated, against torch's own modules."""
    cfg = ModelConfig(kind, vocab, layers, d_model, heads, context, positions=positions or "rope", mlp_ratio=3)
    assert param_shapes(cfg) == {name: tuple(t.shape) for name, t in build_model(cfg).state_dict().items()}


def test_an_untied_head_is_its_own_tensor_and_counted(tmp_path):
    """ModelConfig.tied=False (the lab's recall and copy models): the head is a matrix of its own, in the
    shapes a checkpoint is checked against, in the count, and through a save and load (fast decode included)."""
    from charlm.models import config_params
    from charlm.storage import checkpoint

    tied = ModelConfig("transformer", V, 2, 16, 2, T)
    cfg = ModelConfig("transformer", V, 2, 16, 2, T, tied=False)
    model = build_model(cfg)
    assert model.head.weight.data_ptr() != model.tok_emb.weight.data_ptr()
    assert param_shapes(cfg) == {name: tuple(t.shape) for name, t in model.state_dict().items()}
    assert config_params(cfg) == count_params(model) == config_params(tied) + V * 16
    saved = saved_model(model, "".join(chr(97 + i) for i in range(V)), run_name="u")
    checkpoint.save(saved, tmp_path / "u" / LAST)
    back = checkpoint.load(tmp_path / "u" / LAST).model
    assert not back.cfg.tied and torch.equal(back.head.weight, model.head.weight)
    x = tokens()
    assert torch.equal(back(x)[0], model.eval()(x)[0])


def test_every_family_is_registered_everywhere():
    from charlm.config import FAMILIES
    from charlm.models import family, shapes
    from charlm.presets import PRESET_TABLE

    assert set(FAMILIES) == set(shapes.SHAPES) == set(PRESET_TABLE)
    for kind in FAMILIES:
        assert family(kind).ACTIVATION_BYTES > 0 and family(kind).capabilities


@pytest.mark.parametrize("kind,positions", KINDS, ids=IDS)
def test_the_family_interface(kind, positions):
    """What code outside models/ may ask of a model, instead of testing its class."""
    model = tiny(kind, positions)
    can = {"attention", "knock_out"} | ({"prune"} if positions != "alibi" else set())  # ALiBi's heads: no pruning
    assert model.capabilities == (can if kind == "transformer" else {"gates", "knock_out", "prune"})
    assert (model.window is None) == (kind != "transformer")
    assert model.rolling_cache == (positions in ("rope", "alibi") and kind == "transformer")  # relative ones
    hidden = {id(p) for p in model.hidden_matrices()}
    inside = {id(p) for n, p in model.named_parameters() if p.dim() == 2 and not n.startswith(("tok_emb", "pos_emb"))}
    assert hidden and hidden == inside - {id(model.head.weight)}  # not the embeddings, not the output head
    ids = tokens(1, 5)[0].tolist()
    with torch.no_grad():
        want = model(torch.tensor([ids]))[0][0, -1]
        cache = model.new_cache(1)
        got = model.decode(ids[:3], cache)
        got = model.decode(ids[3:4], cache)
        got = model.decode(ids[4:], cache)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind,positions", KINDS, ids=IDS)
def test_forward_shapes_and_loss(kind, positions):
    model = tiny(kind, positions)
    x = tokens()
    logits, loss = model(x)
    assert logits.shape == (B, T, V) and loss is None
    logits, loss = model(x, tokens(seed=2))
    assert loss.shape == () and math.isfinite(loss.item())
    # an untrained model predicts close to uniform: its loss on random targets is near ln(V)
    assert abs(loss.item() - math.log(V)) < 0.5


def test_transformer_head_is_tied_and_counted_once():
    model = tiny()
    assert model.head.weight is model.tok_emb.weight
    distinct = {id(p): p.numel() for p in model.parameters()}
    assert count_params(model) == sum(distinct.values())
    assert count_params(model) < sum(p.numel() for p in model.state_dict().values())  # head listed twice there


@pytest.mark.parametrize("kind,positions", KINDS, ids=IDS)
def test_causality_later_tokens_never_change_earlier_logits(kind, positions):
    model = tiny(kind, positions)
    x = tokens()
    base, _ = model(x)
    for t in (0, 5, T - 1):
        changed = x.clone()
        changed[:, t] = (changed[:, t] + 1 + torch.arange(B)) % V
        out, _ = model(changed)
        assert torch.allclose(out[:, :t], base[:, :t], atol=1e-6, rtol=0), f"position < {t} saw token {t}"
        assert not torch.allclose(out[:, t], base[:, t]), "the changed token itself must matter"


@pytest.mark.parametrize("kind,positions", KINDS, ids=IDS)
def test_cached_decoding_equals_full_forward(kind, positions):
    """Prefill 5 tokens, then one at a time, then a chunk of 3 on top of a filled cache."""
    model = tiny(kind, positions)
    x = tokens(t=14)
    full, _ = model(x)
    cache = model.new_cache(B)
    pieces = [x[:, :5]] + [x[:, i : i + 1] for i in range(5, 11)] + [x[:, 11:14]]
    out = []
    with torch.no_grad():
        for piece in pieces:
            logits, _ = model(piece, cache=cache)
            out.append(logits)
    assert cache.pos == 14
    torch.testing.assert_close(torch.cat(out, dim=1), full, atol=1e-4, rtol=0)


@pytest.mark.parametrize("positions", POSITIONS)
def test_qk_norm_cached_decoding_equals_full_forward(positions):
    """ModelConfig.qk_norm: the cache holds normalised (and turned) keys; one token at a time as one pass."""
    model = tiny("transformer", positions, qk_norm=True)
    x = tokens(t=14)
    full, _ = model(x)
    cache = model.new_cache(B)
    with torch.no_grad():
        out = [model(x[:, :5], cache=cache)[0]] + [model(x[:, i : i + 1], cache=cache)[0] for i in range(5, 14)]
    torch.testing.assert_close(torch.cat(out, dim=1), full, atol=1e-4, rtol=0)


def smeared(positions: str) -> torch.nn.Module:
    model = tiny("transformer", positions, smear=True)
    with torch.no_grad():
        model.smear.normal_(0.0, 1.0)  # it starts at zero: a test of a zero smear would test nothing
    return model


def test_smear_adds_a_share_of_the_previous_tokens_embedding():
    """ModelConfig.smear against its definition, written out: what the blocks get is e(x_t) + smear * e(x_(t-1)),
    and e(x_0) alone at the first position."""
    model = smeared("rope")
    x = tokens(t=9)
    seen = {}
    model.drop.register_forward_hook(lambda m, args, out: seen.update(x=out))
    model(x)
    e, s = model.tok_emb.weight, model.smear
    want = torch.stack([torch.stack([e[row[0]]] + [e[row[t]] + s * e[row[t - 1]] for t in range(1, 9)]) for row in x])
    torch.testing.assert_close(seen["x"], want.detach())


@pytest.mark.parametrize("positions", POSITIONS)
def test_smear_cached_decoding_equals_full_forward(positions):
    """The cache keeps the last token fed: a piece's first position reads its embedding (one token at a time, and a
    chunk on top of a filled cache, as one pass)."""
    model = smeared(positions)
    x = tokens(t=14)
    full, _ = model(x)
    cache = model.new_cache(B)
    pieces = [x[:, :5]] + [x[:, i : i + 1] for i in range(5, 11)] + [x[:, 11:14]]
    with torch.no_grad():
        out = [model(piece, cache=cache)[0] for piece in pieces]
    torch.testing.assert_close(torch.cat(out, dim=1), full, atol=1e-4, rtol=0)
    assert cache.last.tolist() == x[:, -1].tolist()


def test_qk_norm_makes_attention_blind_to_the_scale_of_queries_and_keys():
    """What QK-norm is (each head's q and k at unit RMS): scaling one head's query rows or key rows of qkv by any
    positive number changes no logit; without it, the same scaling does."""

    def scaled_logits(qk_norm: bool) -> tuple[torch.Tensor, torch.Tensor]:
        model = tiny("transformer", "rope", qk_norm=qk_norm)
        x = tokens()
        with torch.no_grad():
            for p in model.parameters():  # q and k far above the norm's epsilon
                p.normal_(0.0, 0.3)
            before, _ = model(x)
            w = model.blocks[0].attn.qkv.weight  # rows: q (4 heads × 8), k, v
            w[0:8] *= 7.0  # head 0's query
            w[32 + 8 : 32 + 16] *= 0.2  # head 1's key
            after, _ = model(x)
        return before, after

    before, after = scaled_logits(qk_norm=True)
    torch.testing.assert_close(after, before, atol=2e-5, rtol=0)
    before, after = scaled_logits(qk_norm=False)
    assert (after - before).abs().max() > 1e-3


@pytest.mark.parametrize("positions", POSITIONS)
def test_transformer_refuses_to_run_past_its_context(positions):
    model = tiny("transformer", positions)
    with pytest.raises(ValueError, match="exceed the model's context of 16"):
        model(tokens(t=17))
    cache = model.new_cache(B)
    model(tokens(t=16), cache=cache)
    with pytest.raises(ValueError, match="17 positions"):
        model(tokens(t=1), cache=cache)


def test_rolling_cache_keeps_the_last_context_positions():
    """Past its context a rolling cache takes one token at a time, each overwriting the oldest; one
    query attends to every kept key whatever their order in the ring (checked against a full pass in
    test_generate, test_positions). Only RoPE and ALiBi roll: absolute positions end at the context."""
    model = tiny()
    x = tokens(t=20)
    cache = model.new_cache(B, rolling=True)
    with torch.no_grad():
        model(x[:, :16], cache=cache)
        oldest, kept = cache.k[:, :, :, :3].clone(), cache.k[:, :, :, 3:].clone()
        for t in range(16, 19):
            model(x[:, t : t + 1], cache=cache)
        assert cache.pos == 19
        assert torch.equal(cache.k[:, :, :, 3:], kept)  # positions 0..2 overwritten, the rest untouched
        assert (cache.k[:, :, :, :3] - oldest).abs().amax(dim=-1).min() > 0  # every one of them rewritten
        with pytest.raises(ValueError, match="21 positions exceed the model's context of 16"):
            model(x[:, 18:20], cache=cache)  # two at once past the end: never needed, refused
    with pytest.raises(ValueError, match="a rolling cache needs relative positions"):
        tiny("transformer", "learned").new_cache(1, rolling=True)


@pytest.mark.parametrize("positions", POSITIONS)
def test_attention_capture(positions):
    model = tiny("transformer", positions)
    x = tokens()
    plain, _ = model(x)
    attn: list[torch.Tensor] = []
    captured, _ = model(x, attn=attn)
    torch.testing.assert_close(captured, plain, atol=1e-5, rtol=0)  # capturing changes nothing
    assert len(attn) == 2  # one per layer
    for w in attn:
        assert w.shape == (B, 4, T, T)
        torch.testing.assert_close(w.sum(-1), torch.ones(B, 4, T))
        above = torch.ones(T, T, dtype=torch.bool).triu(1)
        assert (w[..., above] == 0).all(), "a query attended to a later key"
        assert (w[..., ~above] > 0).all()  # softmax: every allowed key gets some weight
    # with a cache: the new query's row covers every cached key
    cache = model.new_cache(B)
    model(x[:, :-1], cache=cache)
    step_attn: list[torch.Tensor] = []
    last, _ = model(x[:, -1:], cache=cache, attn=step_attn)
    torch.testing.assert_close(last[:, 0], plain[:, -1], atol=1e-4, rtol=0)
    for w, full in zip(step_attn, attn):
        assert w.shape == (B, 4, 1, T)
        torch.testing.assert_close(w[:, :, 0], full[:, :, -1], atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", ["transformer", "lstm", "gru"])
def test_tiny_model_learns_a_repetitive_text(kind):
    """A few dozen AdamW steps take the loss well below ln(vocab), the loss of a uniform guess."""
    text = "the quick brown fox jumps over the lazy dog. " * 40
    tok = CharTokenizer.train([text])
    data = torch.tensor(tok.encode(text))
    torch.manual_seed(0)
    model = build_model(
        ModelConfig(kind=kind, vocab_size=tok.vocab_size, n_layers=1, d_model=32, n_heads=2, context=32)
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(0)
    model.train()
    for _ in range(40):
        ix = torch.randint(len(data) - 33, (16,), generator=gen)
        w = torch.stack([data[i : i + 33] for i in ix])
        _, loss = model(w[:, :-1], w[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.25 * math.log(tok.vocab_size), (
        f"{kind}: loss {loss.item():.3f} vs ln(V) {math.log(tok.vocab_size):.3f}"
    )


def test_dropout_is_off_in_eval_mode():
    model = tiny(dropout=0.5)
    x = tokens()
    a, _ = model(x)
    b, _ = model(x)
    assert torch.equal(a, b)
    model.train()
    c, _ = model(x)
    assert not torch.allclose(a, c)


# ---- config validation: messages a user can act on -----------------------------------------------

BAD_MODEL = [
    (dict(d_model=100, n_heads=3), "--d-model 100 is not divisible by --heads 3"),
    (dict(n_heads=0), "--heads must be between 1 and 16384"),
    (dict(n_layers=0), "--layers must be between 1 and 64"),
    (dict(d_model=0), "--d-model must be between 1 and 16384"),
    (dict(context=1), "--context must be between 2 and 65536"),
    (dict(dropout=1.5), r"--dropout must be in \[0, 1\)"),
    (dict(dropout=float("nan")), r"--dropout must be in \[0, 1\)"),
    (dict(kind="mamba"), "unknown --model 'mamba'"),
    (dict(positions="xpos"), "unknown --positions 'xpos'"),
    (dict(vocab_size=1), "vocabulary size must be between 2 and 10\\^7"),
]


@pytest.mark.parametrize("change,message", BAD_MODEL, ids=lambda v: str(v)[:40])
def test_model_config_messages(change, message):
    cfg = ModelConfig(**{**dict(vocab_size=10, d_model=32, n_heads=2), **change})
    with pytest.raises(ConfigError, match=message):
        cfg.validate()
    with pytest.raises(ConfigError, match=message):
        build_model(cfg)  # building validates too


def test_rope_needs_an_even_head_size():
    with pytest.raises(ConfigError, match=r"rope needs an even head size, but --d-model 6 / --heads 2 = 3"):
        ModelConfig(vocab_size=10, d_model=6, n_heads=2).validate()
    ModelConfig(vocab_size=10, d_model=6, n_heads=2, positions="learned").validate()  # fine without rope


def test_rnn_ignores_transformer_only_settings():
    cfg = ModelConfig(kind="lstm", vocab_size=10, d_model=33, n_heads=4).validate()  # 33 % 4: irrelevant here
    assert isinstance(build_model(cfg), RNN)
    assert isinstance(build_model(ModelConfig(vocab_size=10, d_model=32, n_heads=4)), Transformer)


BAD_TRAIN = [
    (dict(steps=0), "--steps must be between 1 and 10\\^12, got 0"),
    (dict(lr=-1), "--lr must be a positive learning rate below 10, got -1"),
    (dict(lr=0), "--lr must be a positive"),
    (dict(batch_size=0), "--batch-size must be at least 1"),
    (dict(max_time=0), "--max-time must be positive"),
    (dict(tokenizer="word"), "unknown --tokenizer 'word'"),
    (dict(tokenizer="bpe", bpe_vocab=100), "--vocab-size must be between 257"),
    (dict(eval_interval=0), "--eval-interval must be between 1 and 10\\^12"),
    (dict(eval_iters=0), "--eval-iters must be between 1 and 1000000"),
    (dict(device="tpu"), "unknown --device 'tpu'"),
    (dict(weight_decay=-0.1), "--weight-decay must be at least 0"),
    (dict(warmup=-1), "--warmup must be between 0 and 10\\^12"),
    (dict(val_fraction=1.0), r"val fraction must be in \(0, 1\)"),
]


@pytest.mark.parametrize("change,message", BAD_TRAIN, ids=lambda v: str(v)[:40])
def test_train_config_messages(change, message):
    with pytest.raises(ConfigError, match=message):
        TrainConfig(**change).validate()


def test_configs_round_trip_through_dicts():
    m = ModelConfig(kind="gru", vocab_size=65, n_layers=2, d_model=48, dropout=0.1)
    assert ModelConfig.from_dict(m.to_dict()) == m
    t = TrainConfig(steps=7, max_time=3.5, lr=1e-3)
    assert TrainConfig.from_dict({**t.to_dict(), "from_a_newer_version": 1}) == t  # unknown keys ignored


@pytest.mark.parametrize(
    "text,seconds", [("90s", 90), ("10m", 600), ("1.5h", 5400), ("120", 120), ("250ms", 0.25), ("2min", 120)]
)
def test_parse_duration(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["abc", "", "-5s", "10 parsecs", "0s", "inf"])
def test_parse_duration_refuses_nonsense(text):
    with pytest.raises(ConfigError, match="duration"):
        parse_duration(text)


def test_presets_exist_for_every_family_and_validate():
    for kind in ("transformer", "lstm", "gru"):
        for name in ("tiny", "small", "medium"):
            model, train = preset(kind, name)
            ModelConfig(kind=kind, vocab_size=65, **model).validate()
            TrainConfig(**train).validate()
    with pytest.raises(ConfigError, match="unknown preset 'huge': choose one of tiny, small, medium"):
        preset("transformer", "huge")


@pytest.mark.parametrize("kind", ["transformer", "lstm", "gru"])
def test_the_parameter_count_without_a_model_is_the_real_count(kind):
    from charlm.models import config_params, count_params

    for layers, d_model, vocab in [(1, 32, 65), (4, 256, 100), (2, 512, 1024)]:
        cfg = ModelConfig(kind=kind, vocab_size=vocab, n_layers=layers, d_model=d_model, n_heads=4, context=64)
        assert config_params(cfg) == count_params(build_model(cfg)), cfg


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_relu_squareds_gradient_is_autograds(dtype):
    """transformer.relu_squared's hand-written backward against autograd through F.relu then square, with exact
    zeros among the inputs (where relu's gradient is decided)."""
    from charlm.models.transformer import relu_squared

    x = (torch.randn(4, 6, 48) * 3).to(dtype)
    x[0, 0, :8] = 0.0
    g = torch.randn(4, 6, 48).to(dtype)
    mine, ref = x.clone().requires_grad_(), x.clone().requires_grad_()
    (relu_squared(mine) * g).sum().backward()
    (torch.nn.functional.relu(ref).square() * g).sum().backward()
    torch.testing.assert_close(relu_squared(x), torch.nn.functional.relu(x).square(), rtol=0, atol=0)
    torch.testing.assert_close(mine.grad, ref.grad)


def test_qk_norms_gradient_is_f_rms_norms():
    """transformer.qk_normed's hand-written backward against torch's own F.rms_norm (values and gradients), on a
    strided view like attention's heads."""
    from charlm.models.transformer import QK_NORM_EPS, qk_normed

    x = torch.randn(3, 10, 24).view(3, 10, 3, 8).transpose(1, 2) * 5
    g = torch.randn(3, 3, 10, 8)
    mine, ref = x.clone().requires_grad_(), x.clone().requires_grad_()
    (qk_normed(mine) * g).sum().backward()
    (torch.nn.functional.rms_norm(ref, (8,), eps=QK_NORM_EPS) * g).sum().backward()
    torch.testing.assert_close(qk_normed(x), torch.nn.functional.rms_norm(x, (8,), eps=QK_NORM_EPS))
    torch.testing.assert_close(mine.grad, ref.grad)
