"""A GPT-style decoder: token embedding (+ a share of the previous token's: ModelConfig.smear) (+ positions),
N pre-norm blocks of causal self-attention and an MLP, a final norm and an output head tied to the
embedding (or its own: ModelConfig.tied).

Positions (ModelConfig.positions): learned or sinusoidal vectors added to the embeddings (absolute);
rope turns queries and keys by their position, so a score depends on the distance between two tokens;
alibi adds -slope * distance to each head's scores (Press et al. 2022, a slope per head); nope gives
no position at all (the causal mask alone lets a model count what came before).

forward(idx, targets=None, cache=None, attn=None) -> (logits, loss)
  cache: a KVCache; the new tokens are appended to it and attend to everything it keeps.
  attn:  a list; when given, every layer appends its attention weights (B, n_heads, T, T_keys).
"""

from __future__ import annotations

import math
from contextlib import contextmanager

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from charlm.config import ModelConfig
from charlm.errors import ConfigError
from charlm.models import Part


class KVCache:
    """Keys and values of every layer, pre-allocated for `slots` positions (the model's context).

    `pos` is how many positions have been fed, `last` the token fed last in each row (a smear model's next
    position reads its embedding). The model writes layer by layer and advances `pos` once per forward call,
    after the last layer. A rolling cache (relative positions: RoPE, ALiBi) goes on
    past its slots, one token at a time: each new position overwrites the oldest (a ring buffer), so it
    always holds the last `slots` positions. RoPE keys are stored already rotated to their position and
    ALiBi's bias is computed from each slot's distance, so a query sees every kept key at its true
    distance, never more than the context the model was trained on.
    """

    def __init__(
        self,
        n_layers: int,
        batch_size: int,
        n_heads: int,
        head_dim: int,
        slots: int,
        device,
        dtype,
        rolling: bool = False,
    ):
        shape = (n_layers, batch_size, n_heads, slots, head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.last = torch.zeros(batch_size, dtype=torch.long, device=device)
        self.slots, self.rolling = slots, rolling
        self.pos = 0

    def fits(self, T: int) -> bool:
        """Whether T more positions can be fed in one call."""
        return self.pos + T <= self.slots or (self.rolling and T == 1)

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store this layer's new k, v (B, nh, T, hs); return all keys and values kept. Once a rolling
        cache is full they come in ring order, not time order: attention of one query sums over them."""
        end = self.pos + k.size(2)
        if end > self.slots:  # rolling, one token
            self.k[layer, :, :, self.pos % self.slots] = k[:, :, 0]
            self.v[layer, :, :, self.pos % self.slots] = v[:, :, 0]
            return self.k[layer], self.v[layer]
        self.k[layer, :, :, self.pos : end] = k
        self.v[layer, :, :, self.pos : end] = v
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]

    def reset(self) -> None:
        self.pos = 0


def rope_tables(head_dim: int, max_len: int, base: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(max_len, dtype=torch.float32), inv_freq)  # (T, hs/2)
    return angles.cos(), angles.sin()


def rope_inv_freq(head_dim: int, base: float = 10000.0) -> torch.Tensor:
    # rope_tables' frequencies in float64: past the table (a rolling cache) positions grow without bound,
    # and a float32 angle pos * freq would lose its fraction
    return 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))


def rope_at(head_dim: int, start: int, T: int) -> tuple[torch.Tensor, torch.Tensor]:
    """rope_tables' rows start .. start + T - 1 for positions past the table."""
    angles = torch.outer(torch.arange(start, start + T, dtype=torch.float64), rope_inv_freq(head_dim))
    return angles.cos().float(), angles.sin().float()


QK_NORM_EPS = torch.finfo(torch.float32).eps  # nn.RMSNorm's default in float32, whatever dtype attention runs in


class _UnitRMS(torch.autograd.Function):
    """x / sqrt(mean(x²) + eps) over the last dim (F.rms_norm without a weight), with its gradient written out:
    r (g - y mean(g y)). ~0.6x the time of F.rms_norm's forward and backward on a CPU (RESULTS.md, "The tiny
    preset, round six")."""

    @staticmethod
    def forward(ctx, x):
        r = torch.rsqrt(x.square().mean(-1, keepdim=True) + QK_NORM_EPS)
        y = x * r
        ctx.save_for_backward(y, r)
        return y

    @staticmethod
    def backward(ctx, g):
        y, r = ctx.saved_tensors
        return r * (g - y * (g * y).mean(-1, keepdim=True))


class _ReluSquare(torch.autograd.Function):
    """relu(x)² with its gradient written out, 2 relu(x) g: two passes over the MLP's widest activation each way,
    where autograd's relu, then square, make three forward and four backward (RESULTS.md, "The tiny preset, round seven")."""

    @staticmethod
    def forward(ctx, x):
        y = torch.relu(x)
        ctx.save_for_backward(y)
        return y * y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return g.mul(y).mul_(2)


def relu_squared(x: torch.Tensor) -> torch.Tensor:
    """The MLP's activation, ReLU² (fast_decode.py and _decode_kernel.py repeat it in numpy and numba: change all)."""
    return _ReluSquare.apply(x)


def qk_normed(x: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Each head's vector (last dim) scaled to unit RMS (ModelConfig.qk_norm), computed in float32; returned in
    dtype (default: x's)."""
    return _UnitRMS.apply(x.float()).to(dtype or x.dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # rotate pairs (first half, second half) of each head's channels by a position-dependent angle
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """ALiBi's slope per head (Press et al. 2022): the geometric series 2^(-8/n), 2^(-16/n), ... for n a
    power of two; otherwise that of the power of two below n, then every other slope of the one above."""

    def series(n):
        return [2.0 ** (-8.0 * (i + 1) / n) for i in range(n)]

    below = 2 ** int(math.log2(n_heads))
    slopes = series(below) + series(2 * below)[0::2][: n_heads - below]
    return torch.tensor(slopes, dtype=torch.float32)


def alibi_bias(slopes: torch.Tensor, start: int, T: int, keys: int, slots: int | None = None) -> torch.Tensor:
    """The additive attention mask (nh, T, keys) of T queries at positions start.. over `keys` keys:
    -slope * distance, and -inf for a key after its query. slots: a rolled cache (one query, keys in
    ring order), where the slot s holds the position that is (start - s) mod slots before the query."""
    at = slopes.device
    if slots is not None:
        distance = ((start - torch.arange(slots, device=at)) % slots)[None, :]  # (1, slots)
    else:
        distance = torch.arange(start, start + T, device=at)[:, None] - torch.arange(keys, device=at)[None, :]
    bias = -(slopes[:, None, None] * distance.float())  # (nh, T, keys)
    return bias.masked_fill(distance < 0, float("-inf"))


def sinusoidal_table(d_model: int, max_len: int) -> torch.Tensor:
    pos = torch.arange(max_len, dtype=torch.float32)[:, None]
    div = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
    table = torch.zeros(max_len, d_model)
    table[:, 0::2] = torch.sin(pos * div)
    table[:, 1::2] = torch.cos(pos * div)[:, : d_model // 2]
    return table


# PyTorch's CPU flash attention is far slower in bf16 than in fp32, backwards most (forward + backward at the
# tiny preset's sizes 3.6x on an AVX512-BF16/AMX Xeon, and the tiny step 1.35x faster in fp32): under CPU
# autocast, attention runs in fp32 while the matrix products stay in bf16. (On AVX2-only CPUs --precision auto
# runs no autocast.) benchmarks/bench_attention.py; RESULTS.md, "Speed, round five".
CPU_ATTENTION_FP32 = True


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.n_heads, self.head_size, self.qk_norm = cfg.n_heads, cfg.head_size, cfg.qk_norm
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.attn_width, bias=False)
        self.proj = nn.Linear(cfg.attn_width, cfg.d_model, bias=False)
        self.dropout = cfg.dropout
        self.resid_drop = nn.Dropout(cfg.dropout)

    def forward(self, x, rope, bias, cache: KVCache | None, attn: list | None):
        B, T, _ = x.size()
        A = self.n_heads * self.head_size  # d_model, unless heads were dropped (charlm compress)
        q, k, v = self.qkv(x).split(A, dim=2)
        q = q.view(B, T, self.n_heads, self.head_size).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_heads, self.head_size).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.n_heads, self.head_size).transpose(1, 2)  # (B, nh, T, hs)
        if self.qk_norm:  # the norm's output stays fp32 where attention runs in fp32: no cast down and up again
            dtype = torch.float32 if self._fp32_attention(x) else None
            q, k = qk_normed(q, dtype), qk_normed(k, dtype)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        if cache is not None:
            k, v = cache.update(self.layer, k, v)  # (B, nh, past + T, hs)
        past = k.size(2) - T  # keys before these queries
        if attn is None:
            y = self._sdpa(q, k, v, past, bias)
        else:
            y, weights = self._explicit(q, k, v, past, bias)
            attn.append(weights)
        y = y.transpose(1, 2).contiguous().view(B, T, A)
        return self.resid_drop(self.proj(y))

    @staticmethod
    def _fp32_attention(x) -> bool:
        return x.device.type == "cpu" and torch.is_autocast_enabled("cpu") and CPU_ATTENTION_FP32

    def _sdpa(self, q, k, v, past, bias):
        if self._fp32_attention(q):
            with torch.autocast("cpu", enabled=False):  # autocast would cast fp32 inputs back to bf16
                return self._sdpa_call(q.float(), k.float(), v.float(), past, bias)  # proj casts the output back
        return self._sdpa_call(q, k, v, past, bias)

    def _sdpa_call(self, q, k, v, past, bias):
        p = self.dropout if self.training else 0.0
        T = q.size(2)
        if bias is not None:  # ALiBi: the distances and the causal mask in one float mask (nh, T, keys)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=bias.to(q.dtype), dropout_p=p)
        if past == 0:
            return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        if T == 1:  # one new token sees every cached one: no mask needed
            return F.scaled_dot_product_attention(q, k, v, dropout_p=p)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask(T, past, q.device), dropout_p=p)

    def _explicit(self, q, k, v, past, bias):
        # the same attention, written out so its weights can be shown: softmax(QK^T / sqrt(d) + mask)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))  # (B, nh, T, past + T)
        if bias is not None:
            scores = scores + bias.to(scores.dtype)
        else:
            scores = scores.masked_fill(~causal_mask(q.size(2), past, q.device), float("-inf"))
        weights = F.softmax(scores, dim=-1)
        return weights @ v, weights


def causal_mask(T: int, past: int, device) -> torch.Tensor:
    """(T, past + T) bool: query i (at position past + i) may look at keys 0..past + i."""
    return torch.ones(T, past + T, dtype=torch.bool, device=device).tril(diagonal=past)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, cfg.mlp_ratio * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.mlp_ratio * cfg.d_model, cfg.d_model, bias=False)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x):
        return self.drop(self.proj(relu_squared(self.fc(x))))  # ReLU²: cheap, and learns fast


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.norm1 = nn.RMSNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg, layer)
        self.norm2 = nn.RMSNorm(cfg.d_model)
        self.mlp = MLP(cfg)

    def forward(self, x, rope, bias, cache, attn):
        x = x + self.attn(self.norm1(x), rope, bias, cache, attn)
        return x + self.mlp(self.norm2(x))


class Transformer(nn.Module):
    PART = "head"
    ACTIVATION_BYTES = 192  # fp32, measured as peak RSS on CPU (150-180); SDPA stores no (context²) weights

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        if cfg.positions == "learned":
            self.pos_emb = nn.Embedding(cfg.context, cfg.d_model)
        elif cfg.positions == "sinusoidal":
            self.register_buffer("pos_table", sinusoidal_table(cfg.d_model, cfg.context), persistent=False)
        elif cfg.positions == "rope":
            cos, sin = rope_tables(cfg.head_size, cfg.context)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        elif cfg.positions == "alibi":
            self.register_buffer("alibi_slopes", alibi_slopes(cfg.n_heads), persistent=False)
        # nope: nothing
        if cfg.smear:  # how much of the previous token's embedding each position adds to its own, per channel
            self.smear = nn.Parameter(torch.zeros(cfg.d_model))
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.norm = nn.RMSNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tied:
            self.head.weight = self.tok_emb.weight  # the output head reads the embedding table
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):  # GPT-2: scale down what each residual branch adds
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layers))

    @property
    def capabilities(self) -> frozenset:
        # attention maps, head statistics and knock-outs (models/inspect.py); heads pruned, unless ALiBi's
        # slopes (a function of each head's place among n_heads) would change under the others
        can = {"attention", "knock_out"}
        return frozenset(can | ({"prune"} if self.cfg.positions != "alibi" else set()))

    @staticmethod
    def parts(cfg: ModelConfig) -> int:
        return cfg.n_heads

    def trace(self, idx: torch.Tensor) -> list[torch.Tensor]:
        """Every layer's attention weights (B, n_heads, T, T) on idx, from the explicit-softmax path."""
        attn: list[torch.Tensor] = []
        self(idx, attn=attn)
        return attn

    @contextmanager
    def knock_out(self, part: Part, mode: str = "zero"):
        """Inside: the part's heads add nothing (zero: their slice of the input of the layer's output
        projection held at 0; mean: at its mean over the batch's positions)."""
        if part.kind != "head":
            raise ValueError(f"a Transformer's parts are heads, not {part.kind}s")
        hs = self.cfg.head_size
        cols = [c for h in (part.which or range(self.cfg.n_heads)) for c in range(h * hs, (h + 1) * hs)]

        def hook(module, args):
            y = args[0].clone()
            y[..., cols] = 0 if mode == "zero" else y[..., cols].mean(dim=(0, 1), keepdim=True)
            return (y,)

        handle = self.blocks[part.layer].attn.proj.register_forward_pre_hook(hook)
        try:
            yield
        finally:
            handle.remove()

    @torch.no_grad()
    def importance(self, idx: torch.Tensor) -> np.ndarray:
        """(layers, heads): nats per token lost on idx (B, T + 1) when each head alone is knocked out."""
        from charlm.models.inspect import knockouts, nats

        base = nats(self(idx[:, :-1])[0], idx)
        out = np.zeros((self.cfg.n_layers, self.cfg.n_heads))
        for part, lost in knockouts(self, idx):
            out[part.layer, part.which[0]] = lost - base
        return out

    @staticmethod
    def prune(cfg: ModelConfig, state: dict, importance: np.ndarray, k: int) -> tuple[ModelConfig, dict, list]:
        """Without the k least important heads of each layer, sliced out of qkv and proj: (config, state dict,
        [(layer, head), ...]). The config says so (n_heads, head_dim)."""
        from dataclasses import replace

        H, hs = cfg.n_heads, cfg.head_size
        A = H * hs
        if k and cfg.positions == "alibi":  # each head's slope is set by its place among n_heads: others would shift
            raise ConfigError("cannot prune an ALiBi model's heads (its slopes follow the number of heads)")
        state, dropped = dict(state), []
        for layer in range(cfg.n_layers):
            gone = sorted(int(h) for h in np.argsort(importance[layer], kind="stable")[:k])
            kept = [h for h in range(H) if h not in gone]
            dropped += [(layer, h) for h in gone]
            cols = torch.tensor([h * hs + i for h in kept for i in range(hs)], dtype=torch.long)
            qkv, proj = f"blocks.{layer}.attn.qkv.weight", f"blocks.{layer}.attn.proj.weight"
            state[qkv] = torch.cat([state[qkv][part * A + cols] for part in range(3)])  # q, k, v rows of kept heads
            state[proj] = state[proj][:, cols].contiguous()
        return replace(cfg, n_heads=H - k, head_dim=hs), state, dropped

    @property
    def window(self) -> int:
        return self.cfg.context

    @property
    def rolling_cache(self) -> bool:
        # relative positions: cached keys keep their meaning as it rolls (a NoPE model reads position from
        # how many tokens its window holds, so it starts again from the last context tokens, as absolute ones)
        return self.cfg.positions in ("rope", "alibi")

    def hidden_matrices(self) -> list[nn.Parameter]:
        return [p for b in self.blocks for p in b.parameters() if p.dim() == 2]

    def decode(self, ids: list[int], cache: KVCache) -> torch.Tensor:
        """Logits (vocab,) for the token after ids, fed into cache. (On a CPU, generation runs one token
        through models/fast_decode.py instead, where FastDecoder.supports it.)"""
        idx = torch.tensor([ids], dtype=torch.long, device=self.tok_emb.weight.device)
        return self(idx, cache=cache)[0][0, -1]

    @staticmethod
    def _init_weights(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def new_cache(self, batch_size: int = 1, device=None, dtype=None, rolling: bool = False) -> KVCache:
        p = self.tok_emb.weight
        c = self.cfg
        if rolling and not self.rolling_cache:
            raise ValueError(f"a rolling cache needs relative positions (rope, alibi), not {c.positions}")
        return KVCache(
            c.n_layers,
            batch_size,
            c.n_heads,
            c.head_size,
            c.context,
            device or p.device,
            dtype or p.dtype,
            rolling,
        )

    def forward(self, idx, targets=None, cache: KVCache | None = None, attn: list | None = None):
        B, T = idx.size()
        start = cache.pos if cache is not None else 0
        if not (cache.fits(T) if cache is not None else T <= self.cfg.context):
            raise ValueError(f"{start + T} positions exceed the model's context of {self.cfg.context}")
        x = self.tok_emb(idx)  # (B, T, C)
        if self.cfg.smear:  # the first position's previous token is the cache's last one (none at the start)
            first = self.tok_emb(cache.last)[:, None] if start > 0 else torch.zeros_like(x[:, :1])
            x = x + self.smear * torch.cat((first, x[:, :-1]), 1)
        rope = bias = None
        positions, rolled = self.cfg.positions, start + T > self.cfg.context  # rolled: a rolling cache, past its slots
        if positions == "learned":
            x = x + self.pos_emb(torch.arange(start, start + T, device=idx.device))
        elif positions == "sinusoidal":
            x = x + self.pos_table[start : start + T]
        elif positions == "rope" and not rolled:
            rope = (self.rope_cos[start : start + T], self.rope_sin[start : start + T])
        elif positions == "rope":  # past the table
            rope = tuple(t.to(self.rope_cos) for t in rope_at(self.cfg.head_size, start, T))
        elif positions == "alibi":
            bias = alibi_bias(self.alibi_slopes, start, T, start + T, self.cfg.context if rolled else None)
        x = self.drop(x)
        for block in self.blocks:
            x = block(x, rope, bias, cache, attn)
        if cache is not None:
            cache.last.copy_(idx[:, -1])
            cache.pos += T
        logits = self.head(self.norm(x))  # (B, T, vocab)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.reshape(-1), ignore_index=-1)
        return logits, loss
