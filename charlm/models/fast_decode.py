"""The Transformer's one-token decode step again, in numpy: what generation runs for each new token
when it can (batch 1, CPU, float32, eval mode, no grad).

Why a second implementation: at chat sizes a token costs ~100 tiny ops, and torch spends 5-10 µs
dispatching each one against ~1 µs for numpy, so this step is ~3x faster (benchmarks/RESULTS.md).
The arithmetic is Transformer.forward's (rope as one matrix, RMSNorm's scalar in Python floats);
tests compare the two block by block at every position.

FastDecoder(model, cache).step(token) -> logits (vocab,) is model(token, cache=cache) for one token:
it reads the weights through zero-copy views (never stale copies), writes its keys and values into
the same KVCache a torch prefill fills, and advances cache.pos. A rolling cache wraps around.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn as nn

from charlm.models.transformer import KVCache, Transformer, rope_inv_freq


class FastDecoder:
    def __init__(self, model: Transformer, cache: KVCache):
        self.cfg, self.cache = model.cfg, cache
        self.tok_emb, self.head, self.norm = _np(model.tok_emb.weight), _np(model.head.weight), _norm_args(model.norm)
        self.k, self.v = _np(cache.k)[:, 0], _np(cache.v)[:, 0]  # (L, nh, slots, hs): batch row 0
        self.layers = [
            (
                _norm_args(b.norm1),
                _np(b.attn.qkv.weight),
                _np(b.attn.proj.weight),
                _norm_args(b.norm2),
                _np(b.mlp.fc.weight),
                _np(b.mlp.proj.weight),
            )
            for b in model.blocks
        ]
        self.pos_table = self.rope = None
        if model.cfg.positions == "learned":
            self.pos_table = _np(model.pos_emb.weight)
        elif model.cfg.positions == "sinusoidal":
            self.pos_table = _np(model.pos_table)
        else:
            self.rope = _rope_matrix(_np(model.rope_cos), _np(model.rope_sin))
            self.inv_freq = rope_inv_freq(model.cfg.d_model // model.cfg.n_heads).numpy()

    @staticmethod
    def supports(model: nn.Module) -> bool:
        """The conditions under which step() computes what forward() would."""
        w = model.tok_emb.weight
        return (
            isinstance(model, Transformer)
            and not model.training
            and not torch.is_grad_enabled()
            and w.device.type == "cpu"
            and w.dtype == torch.float32
        )

    def step(self, token: int, trace: list | None = None) -> torch.Tensor:
        """Logits (vocab,) after feeding `token` at position cache.pos. trace: when given, gets the
        residual stream (C,) after each block's attention and after its MLP, in order."""
        pos = self.cache.pos
        if not self.cache.fits(1):
            raise ValueError(f"{pos + 1} positions exceed the model's context of {self.cfg.context}")
        nh, hs = self.cfg.n_heads, self.cfg.d_model // self.cfg.n_heads
        slot, n_keys = pos % self.cache.slots, min(pos + 1, self.cache.slots)  # rolling: overwrite the oldest
        x = self.tok_emb[token]  # (C,)
        if self.pos_table is not None:  # learned or sinusoidal positions
            x = x + self.pos_table[pos]
        rope = None
        if self.rope is not None:  # apply_rope at this position as one matrix (hs, hs): x @ rope
            rope, rope_at, rope_values = self.rope
            np.put(rope, rope_at, rope_values[pos] if pos < len(rope_values) else self._rope_values_at(pos))
        for l, (n1, qkv, proj, n2, fc, fc_proj) in enumerate(self.layers):
            qkv_x = np.dot(qkv, _rms_norm(x, *n1)).reshape(3, nh, hs)  # q, k, v: each (nh, hs)
            q, k = qkv_x[:2] if rope is None else np.matmul(qkv_x[:2], rope)
            self.k[l, :, slot], self.v[l, :, slot] = k, qkv_x[2]
            keys, values = self.k[l, :, :n_keys], self.v[l, :, :n_keys]  # (nh, T, hs), once rolled in ring order
            att = np.matmul(keys, q[:, :, None])[:, :, 0] * (1.0 / math.sqrt(hs))  # (nh, T)
            att -= att.max(axis=-1, keepdims=True)  # softmax, in place
            np.exp(att, out=att)
            att /= att.sum(axis=-1, keepdims=True)
            y = np.matmul(att[:, None, :], values).reshape(-1)  # (nh, 1, T) @ (nh, T, hs) -> (C,)
            x = x + np.dot(proj, y)
            if trace is not None:
                trace.append(x)
            h = np.dot(fc, _rms_norm(x, *n2))
            np.maximum(h, 0.0, out=h)  # ReLU², as MLP.forward
            x = x + np.dot(fc_proj, h * h)
            if trace is not None:
                trace.append(x)
        self.cache.pos += 1
        return torch.from_numpy(np.dot(self.head, _rms_norm(x, *self.norm)))  # (vocab,)

    def _rope_values_at(self, pos: int) -> np.ndarray:
        # past the table (a rolling cache): rope_at's angles, in numpy (a few µs where torch takes ~50)
        angles = pos * self.inv_freq
        return _rope_values(np.cos(angles), np.sin(angles))


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().numpy()  # shares memory with the tensor


def _norm_args(norm: nn.RMSNorm) -> tuple[np.ndarray, float]:
    eps = norm.eps if norm.eps is not None else torch.finfo(torch.float32).eps  # nn.RMSNorm's default
    return _np(norm.weight), float(eps)


def _rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    # nn.RMSNorm on one vector; the scalar part in Python floats, which cost far less than numpy scalars
    return x * (weight * (1.0 / math.sqrt(float(np.dot(x, x)) / x.shape[0] + eps)))


def _rope_matrix(cos: np.ndarray, sin: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """apply_rope as a matrix R (hs, hs), x @ R: one op per layer instead of nine. With h = hs / 2,
    output i < h is x_i cos_i - x_(h+i) sin_i, output h + i is x_i sin_i + x_(h+i) cos_i. Returns R,
    the flat indices of its non-zero entries and their values at every position (context, 2 hs):
    np.put(R, where, values[pos]) sets R for position pos."""
    h = cos.shape[1]
    i = np.arange(h)
    where = np.concatenate([i * 2 * h + i, (h + i) * 2 * h + h + i, (h + i) * 2 * h + i, i * 2 * h + h + i])
    return np.zeros((2 * h, 2 * h), dtype=np.float32), where, _rope_values(cos, sin)


def _rope_values(cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    # cast to float32 after the trigonometry, as rope_at does
    return np.concatenate([cos, cos, -sin, sin], axis=-1).astype(np.float32)
