"""The Transformer's one-token decode step again, in numpy: what generation runs for each new token
when it can (batch 1, CPU, float32, eval mode).

Why a second implementation: at chat sizes a token costs ~100 tiny ops, and torch spends 5-10 µs
dispatching each one against ~1 µs for numpy: streaming at nanoGPT size runs ~7x faster than with
torch's one-token step (benchmarks/HISTORY.md, "Generation").
The arithmetic is Transformer.forward's (rope as one matrix, ALiBi's bias as a view of one table, RMSNorm's
scalar in Python floats);
tests compare the two block by block at every position.

FastDecoder(model, cache).step(token) -> logits (vocab,) is model(token, cache=cache) for one token
(step_np: the same as a numpy array, for a caller that stays in numpy): it reads the weights through
zero-copy views (never stale copies), writes its keys and values into the same KVCache a torch
prefill fills, and advances cache.pos. A rolling cache wraps around.

Which weights: a model over BF16_ABOVE bytes of float32 matrices is read with its matrices rounded to bf16 (float32
copies here; bf16 in models/compiled_decode.py, which takes over from this step once it has compiled), so that the
two steps compute the same logits to float rounding and a hand-over mid-stream leaves a seed's text as it is. An
int8 run (charlm compress --bits 8) is read as loaded, its matrices int8 values times row scales (storage()).
Smaller models are read through zero-copy views, as they are.

Past the five matrix-vector products (which stream the weights about as fast as BLAS goes), a token's
time is the number of numpy calls, 1-3 µs each: so the step makes ~20 per layer, writes into scratch
buffers made once (`out=`), reads the cache through views made once, and calls ndarray methods and
ufuncs directly (np.dot and arr.max(...) pass through Python wrappers first).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn as nn

from charlm.models.transformer import QK_NORM_EPS, KVCache, Transformer, rope_inv_freq

# Below this many bytes of float32 matrices a model's weights stay in L2 as they are: bf16 storage buys nothing
# (compiled step, 2 x 64: 15.6 us a token in float32, 16.3 in bf16; 4 x 64, 0.77 MB: 30.9 and 26.7; 4 x 128, 3 MB:
# 135 and 77), and small models (the tests') keep torch's logits to float rounding
BF16_ABOVE = 256 * 1024


def matrices(model: Transformer) -> dict[str, list[torch.Tensor]]:
    """The matrices a one-token step multiplies by, by kind, a list over the layers (the head's: one)."""
    blocks = model.blocks
    return {
        "qkv": [b.attn.qkv.weight for b in blocks],
        "proj": [b.attn.proj.weight for b in blocks],
        "fc": [b.mlp.fc.weight for b in blocks],
        "fcp": [b.mlp.proj.weight for b in blocks],
        "head": [model.head.weight],
    }


def as_int8(w: torch.Tensor) -> tuple[np.ndarray, np.ndarray] | None:
    """(values int8, scales float32 per row) when w holds int8 values times a scale per row (a compress --bits 8
    run, dequantized as storage/quantized.py does: q * scale in float32), else None."""
    a = w.detach().numpy()
    top = np.abs(a).max(axis=1)
    scales = (top / np.float32(127)).astype(np.float32)
    safe = np.where(scales > 0, scales, np.float32(1))[:, None]
    q = np.rint(a / safe)
    if np.abs(q).max(initial=0) > 127:
        return None
    # q * scale must give w back to float rounding (a float32 row has ~2^24 levels, an int8 one 255)
    if np.abs(q * safe - a).max(initial=0) > 4e-7 * max(float(top.max(initial=0)), 1e-30):
        return None
    return q.astype(np.int8), scales


def storage(model: Transformer) -> str:
    """How generation reads the model's matrices: "int8" (every one int8 values times row scales), "bf16" (over
    BF16_ABOVE bytes of float32), else "f32" (as they are)."""
    mats = [w for ws in matrices(model).values() for w in ws]
    if all(as_int8(w) is not None for w in mats):  # (stops at the first that is not: a float model's first)
        return "int8"
    return "bf16" if 4 * sum(w.numel() for w in mats) > BF16_ABOVE else "f32"


def weights_version(params: list) -> int:
    """The sum of the parameters' in-place update counters: it grows when an optimizer steps the model."""
    return sum(p._version for p in params)


def unchanged(decoder) -> bool:
    """Whether a decoder's copies and views still stand for its model: still in eval mode, its embedding in the
    same memory (a move to another dtype or device and back leaves views on the old), and no in-place update
    since they were made (decoder.params listed once, decoder.version then): the cheap check before a step."""
    m = decoder.model
    return (
        not m.training
        and m.tok_emb.weight.data_ptr() == decoder.weight_at
        and weights_version(decoder.params) == decoder.version
    )


class FastDecoder:
    def __init__(self, model: Transformer, cache: KVCache):
        cfg = self.cfg = model.cfg
        self.model, self.cache = model, cache
        self.weight_at = model.tok_emb.weight.data_ptr()
        self.params = list(model.parameters())  # listed once: walking the modules costs ~100 us, a token's time
        self.storage, self.version = storage(model), weights_version(self.params)
        nh, C, slots = cfg.n_heads, cfg.d_model, cache.slots
        hs = cfg.head_size
        A = nh * hs  # attention's width: C, unless heads were dropped (charlm compress)
        mat = _np if self.storage != "bf16" else _bf16_np
        self.tok_emb, self.head, self.norm = _np(model.tok_emb.weight), mat(model.head.weight), _norm_args(model.norm)
        self.k, self.v = _np(cache.k)[:, 0], _np(cache.v)[:, 0]  # (L, nh, slots, hs): batch row 0
        self.layers = [
            (
                _norm_args(b.norm1),
                mat(b.attn.qkv.weight),
                mat(b.attn.proj.weight),
                _norm_args(b.norm2),
                mat(b.mlp.fc.weight),
                mat(b.mlp.proj.weight),
            )
            for b in model.blocks
        ]
        # each layer's keys and values (nh, slots, hs), and the same seen slot-major (slots, nh, hs) so
        # that a new key or value is one row: k_at[slot] = k
        k_at, v_at = self.k.transpose(0, 2, 1, 3), self.v.transpose(0, 2, 1, 3)
        self.kv = [(self.k[l], self.v[l], k_at[l], v_at[l]) for l in range(cfg.n_layers)]

        # scratch the step writes into, and views of it that never change
        f32 = np.float32
        self.x, self.xn, self.w, self.out = (np.empty(C, f32) for _ in range(4))  # residual, normed, scratch
        self.qkv = np.empty(3 * A, f32)
        self.qk = self.qkv.reshape(3 * nh, hs)[: 2 * nh]  # q and k: (2 nh, hs)
        self.v_new = self.qkv.reshape(3 * nh, hs)[2 * nh :]  # (nh, hs)
        self.q = np.empty((nh, hs, 1), f32)  # the query times 1 / sqrt(hs), a column per head
        self.att = np.empty((nh, slots, 1), f32)  # attention weights over the slots, a column per head
        self.m = np.empty((nh, 1), f32)  # a max or a sum per head
        self.y = np.empty(A, f32)  # attention's output, the heads side by side
        self.att_rows, self.y_rows = self.att.transpose(0, 2, 1), self.y.reshape(nh, 1, hs)  # views for att @ values
        self.h = np.empty(model.blocks[0].mlp.fc.weight.shape[0], f32)  # the MLP's hidden layer
        self.scale = 1.0 / math.sqrt(hs)
        self.qk_norm = (np.empty((2 * nh, 1), f32), 1.0 / hs, float(QK_NORM_EPS)) if cfg.qk_norm else None
        self.smear = _np(model.smear) if cfg.smear else None
        self.last = cache.last.numpy()  # the cache's last token, shared: written here as the torch step writes it
        self.pos_table = self.rope = self.alibi = None
        if cfg.positions == "learned":
            self.pos_table = _np(model.pos_emb.weight)
        elif cfg.positions == "sinusoidal":
            self.pos_table = _np(model.pos_table)
        elif cfg.positions == "alibi":
            # alibi_bias by slot, as one table (nh, 2 slots): column j is -slope * ((-j) mod slots), so that at
            # position pos the columns from (-pos) mod slots on give slot s its distance (pos - s) mod slots
            d = torch.arange(2 * slots) % slots
            self.alibi = _np(-(model.alibi_slopes[:, None] * ((-d) % slots).float()))
        elif cfg.positions == "rope":
            self.rope = _rope_matrix(_np(model.rope_cos), _np(model.rope_sin))
            self.qk_rot = np.empty_like(self.qk)  # q and k rotated
            self.inv_freq = rope_inv_freq(hs).numpy()
            self.past_table, self.past_start = self.rope[2][:0], 0  # rope values past the table, made as needed

    @staticmethod
    def supports(model: nn.Module) -> bool:
        """The conditions under which step() computes the logits forward() would (their values: the
        step never builds a graph, grad mode or not)."""
        if not isinstance(model, Transformer) or model.training:
            return False
        w = model.tok_emb.weight
        return w.dtype == torch.float32 and w.is_cpu

    def current(self) -> bool:
        return unchanged(self)

    def step(self, token: int, trace: list | None = None) -> torch.Tensor:
        """Logits (vocab,) after feeding `token` at position cache.pos. trace: when given, gets the
        residual stream (C,) after each block's attention and after its MLP, in order."""
        return torch.from_numpy(self.step_np(token, trace))

    def step_np(self, token: int, trace: list | None = None) -> np.ndarray:
        """step(), its logits as a numpy array (float32)."""
        cache = self.cache
        pos, slots, nh = cache.pos, cache.slots, self.cfg.n_heads
        if pos >= slots and not cache.rolling:
            raise ValueError(f"{pos + 1} positions exceed the model's context of {self.cfg.context}")
        slot, n_keys = pos % slots, pos + 1  # rolling: overwrite the oldest
        x, xn, w, out, h, q, att, y = self.x, self.xn, self.w, self.out, self.h, self.q, self.att, self.y
        inv_c = 1.0 / x.shape[0]  # RMSNorm's mean, its scalars in Python floats (far cheaper than numpy's)
        a, q_rows, m = att[:, :, 0], q[:, :, 0], self.m  # (nh, slots), (nh, hs), (nh, 1)
        if self.pos_table is None:
            x[:] = self.tok_emb[token]  # (C,)
        else:  # learned or sinusoidal positions
            np.add(self.tok_emb[token], self.pos_table[pos], out=x)
        if self.smear is not None and pos > 0:  # smear: a share of the previous token's embedding
            x += np.multiply(self.smear, self.tok_emb[self.last[0]], out=w)
        self.last[0] = token
        qk = self.qk
        if self.rope is not None:  # apply_rope at this position as one matrix (hs, hs): x @ rope
            rope, rope_at, rope_values = self.rope
            rope.reshape(-1)[rope_at] = rope_values[pos] if pos < len(rope_values) else self._rope_values_past(pos)
            qk = self.qk_rot
        for ((w1, eps1), qkv, proj, (w2, eps2), fc, fc_proj), (keys, values, k_at, v_at) in zip(self.layers, self.kv):
            np.multiply(w1, 1.0 / math.sqrt(float(x.dot(x)) * inv_c + eps1), out=w)  # norm1: weight / rms(x)
            qkv.dot(np.multiply(x, w, out=xn), out=self.qkv)  # q, k, v: each (nh, hs)
            if self.qk_norm is not None:  # qk_normed: each head's q and k scaled to unit RMS
                r, inv_hs, qk_eps = self.qk_norm
                np.einsum("ij,ij->i", self.qk, self.qk, out=r[:, 0])
                np.sqrt(np.add(np.multiply(r, inv_hs, out=r), qk_eps, out=r), out=r)
                np.divide(self.qk, r, out=self.qk)
            if self.rope is not None:
                self.qk.dot(rope, out=qk)
            np.multiply(qk[:nh], self.scale, out=q_rows)
            k_at[slot], v_at[slot] = qk[nh:], self.v_new
            np.matmul(keys, q, out=att)  # (nh, slots, hs) @ (nh, hs, 1): keys in ring order once rolled
            if self.alibi is not None:
                o = (-pos) % slots
                np.add(a, self.alibi[:, o : o + slots], out=a)
            if n_keys < slots:
                a[:, n_keys:] = -np.inf  # slots not filled yet (zeros, or a reset cache's old keys)
            np.subtract(a, np.maximum.reduce(a, 1, None, m, True), out=a)  # softmax over the slots, in place
            np.exp(a, out=a)
            np.divide(a, np.add.reduce(a, 1, None, m, True), out=a)
            np.matmul(self.att_rows, values, out=self.y_rows)  # (nh, 1, slots) @ (nh, slots, hs)
            x += proj.dot(y, out=out)
            if trace is not None:
                trace.append(x.copy())
            np.multiply(w2, 1.0 / math.sqrt(float(x.dot(x)) * inv_c + eps2), out=w)  # norm2
            fc.dot(np.multiply(x, w, out=xn), out=h)
            np.maximum(h, 0.0, out=h)  # ReLU², as MLP.forward
            np.multiply(h, h, out=h)
            x += fc_proj.dot(h, out=out)
            if trace is not None:
                trace.append(x.copy())
        cache.pos += 1
        w_f, eps = self.norm
        np.multiply(w_f, 1.0 / math.sqrt(float(x.dot(x)) * inv_c + eps), out=w)
        return self.head.dot(np.multiply(x, w, out=xn))  # (vocab,)

    def _rope_values_past(self, pos: int) -> np.ndarray:
        # past the table (a rolling cache): rope_at's angles, in float64 as rope_at computes them, for the
        # next `context` positions at once (per position, the trigonometry cost ~10 µs a token)
        if not self.past_start <= pos < self.past_start + len(self.past_table):
            angles = np.outer(np.arange(pos, pos + self.cfg.context, dtype=np.float64), self.inv_freq)
            self.past_table, self.past_start = _rope_values(np.cos(angles), np.sin(angles)), pos
        return self.past_table[pos - self.past_start]


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().numpy()  # shares memory with the tensor


def _bf16_np(t: torch.Tensor) -> np.ndarray:
    return t.detach().to(torch.bfloat16).float().numpy()  # a copy, rounded as the compiled step stores it


def _norm_args(norm: nn.RMSNorm) -> tuple[np.ndarray, float]:
    eps = norm.eps if norm.eps is not None else torch.finfo(torch.float32).eps  # nn.RMSNorm's default
    return _np(norm.weight), float(eps)


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
