"""The compiled one-token step of models/compiled_decode.py (numba, imported by it on first use only).

One function for the whole step: embedding (+ positions), every block (RMSNorm, q/k/v, RoPE, attention over the
KV cache with ALiBi's bias, the output projection, RMSNorm, the ReLU² MLP), the final norm and the head. Each
matrix is (layers, rows, cols), its values uint16 (bf16 bits) or int8, times a float32 scale per row; a value
is widened to float32 as it is read (_f32), and every sum is float32. Transformer.forward's arithmetic, in its
order except that the query is scaled before the dot products, as models/fast_decode.py does.
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

# reassociation and contraction let LLVM vectorise the sums; no "nnan"/"ninf": nothing infinite is ever made,
# and the step must not assume it
FAST = {"nsz", "arcp", "contract", "afn", "reassoc"}


@intrinsic
def _f32(typingctx, v):
    """A stored value as float32: int8 converted, uint16 taken as the top half of a float32 (bf16), float32 as
    it is (the tests' exact reference storage)."""
    if not (v == types.float32 or isinstance(v, types.Integer) and v.bitwidth in (8, 16)):
        return None

    def codegen(context, builder, signature, args):
        (x,) = args
        if v == types.float32:
            return x
        if v.bitwidth == 8:
            return builder.sitofp(x, ir.FloatType())
        wide = builder.shl(builder.zext(x, ir.IntType(32)), ir.Constant(ir.IntType(32), 16))
        return builder.bitcast(wide, ir.FloatType())

    return types.float32(v), codegen


@njit(fastmath=FAST, cache=True, nogil=True, error_model="numpy", inline="always")
def _matvec(W, s, x, out):
    # out = (W * s[:, None]) @ x, four rows at a time (each x[j] loaded once for four sums): W is read once, in order
    n = x.shape[0]
    rows = W.shape[0]
    i = 0
    while i + 4 <= rows:
        a0 = a1 = a2 = a3 = np.float32(0.0)
        for j in range(n):
            xj = x[j]
            a0 += _f32(W[i, j]) * xj
            a1 += _f32(W[i + 1, j]) * xj
            a2 += _f32(W[i + 2, j]) * xj
            a3 += _f32(W[i + 3, j]) * xj
        out[i], out[i + 1], out[i + 2], out[i + 3] = a0 * s[i], a1 * s[i + 1], a2 * s[i + 2], a3 * s[i + 3]
        i += 4
    for r in range(i, rows):
        acc = np.float32(0.0)
        for j in range(n):
            acc += _f32(W[r, j]) * x[j]
        out[r] = acc * s[r]


@njit(fastmath=FAST, cache=True, nogil=True, error_model="numpy", inline="always")
def _inv_rms(x, eps):
    # 1 / sqrt(mean(x²) + eps), RMSNorm's scale
    n = x.shape[0]
    ss = np.float32(0.0)
    for j in range(n):
        ss += x[j] * x[j]
    return np.float32(1.0) / np.float32(math.sqrt(ss / np.float32(n) + eps))


@njit(fastmath=FAST, cache=True, nogil=True, error_model="numpy", inline="always")
def _rmsnorm(x, w, eps, out):
    r = _inv_rms(x, eps)
    for j in range(x.shape[0]):
        out[j] = x[j] * r * w[j]


@njit(fastmath=FAST, cache=True, nogil=True, error_model="numpy", inline="always")
def _unit_rms(v, eps):
    # transformer.qk_normed on one head's channels (hs,) in place
    r = _inv_rms(v, eps)
    for i in range(v.shape[0]):
        v[i] *= r


@njit(fastmath=FAST, cache=True, nogil=True, error_model="numpy", inline="always")
def _rope(v, cos, sin):
    # apply_rope on one head's channels (hs,) in place: pairs (i, half + i) turned by the position's angle
    half = cos.shape[0]
    for i in range(half):
        a, b = v[i], v[half + i]
        v[i] = a * cos[i] - b * sin[i]
        v[half + i] = a * sin[i] + b * cos[i]


@njit(fastmath=FAST, cache=True, nogil=True, error_model="numpy")
def step(
    token, pos, slots, emb, pos_row, norms, eps,
    qkv, qkv_s, proj, proj_s, fc, fc_s, fcp, fcp_s, head, head_s,
    K, V, cos, sin, use_rope, slopes, use_alibi, scale, use_qk_norm, qk_eps, scratch, trace, do_trace, logits,
):  # fmt: skip
    """Logits (vocab,) into `logits` for `token` at position pos; its keys and values into slot pos % slots of
    K, V (layers, heads, slots, hs). scratch: (4, 3A + H + C + slots) float32; trace: (2 layers, C) residuals."""
    L, nh, _, hs = K.shape
    C = emb.shape[1]
    A = nh * hs
    H = fc.shape[1]
    x = scratch[0, :C]
    y = scratch[0, C : C + A]
    xn = scratch[1, :C]
    out = scratch[1, C : 2 * C]
    q = scratch[2, : 3 * A]
    h = scratch[3, :H]
    att = scratch[3, H : H + slots]
    slot = pos % slots
    n_keys = min(pos + 1, slots)
    for j in range(C):
        x[j] = emb[token, j] + pos_row[j]
    for l in range(L):
        _rmsnorm(x, norms[2 * l], eps[2 * l], xn)
        _matvec(qkv[l], qkv_s[l], xn, q)  # q, k, v: (3, nh, hs)
        for hd in range(nh):
            qh = q[hd * hs : (hd + 1) * hs]
            kh = q[A + hd * hs : A + (hd + 1) * hs]
            if use_qk_norm:
                _unit_rms(qh, qk_eps)
                _unit_rms(kh, qk_eps)
            if use_rope:
                _rope(qh, cos, sin)
                _rope(kh, cos, sin)
            for i in range(hs):
                K[l, hd, slot, i] = kh[i]
                V[l, hd, slot, i] = q[2 * A + hd * hs + i]
            for i in range(hs):
                qh[i] *= scale
            top = np.float32(-3.0e38)
            for t in range(n_keys):  # keys in ring order once a rolling cache wrapped: the sum does not mind
                acc = np.float32(0.0)
                for i in range(hs):
                    acc += qh[i] * K[l, hd, t, i]
                if use_alibi:
                    acc += -(slopes[hd] * np.float32((pos - t) % slots))
                att[t] = acc
                top = max(top, acc)
            total = np.float32(0.0)
            for t in range(n_keys):
                e = np.float32(math.exp(att[t] - top))
                att[t] = e
                total += e
            inv = np.float32(1.0) / total
            yh = y[hd * hs : (hd + 1) * hs]
            for i in range(hs):
                yh[i] = 0.0
            for t in range(n_keys):
                a = att[t] * inv
                for i in range(hs):
                    yh[i] += a * V[l, hd, t, i]
        _matvec(proj[l], proj_s[l], y, out)
        for j in range(C):
            x[j] += out[j]
        if do_trace:
            trace[2 * l, :] = x
        _rmsnorm(x, norms[2 * l + 1], eps[2 * l + 1], xn)
        _matvec(fc[l], fc_s[l], xn, h)
        for j in range(H):
            r = max(h[j], np.float32(0.0))  # ReLU², as MLP.forward
            h[j] = r * r
        _matvec(fcp[l], fcp_s[l], h, out)
        for j in range(C):
            x[j] += out[j]
        if do_trace:
            trace[2 * l + 1, :] = x
    _rmsnorm(x, norms[2 * L], eps[2 * L], xn)
    _matvec(head, head_s, xn, logits)


def cached() -> bool:
    """Whether numba's disk cache holds step compiled from its current source (an older source's index reads as
    empty) for this CPU (its index key's codegen tuple: target, CPU name, features)."""
    try:
        here = step.targetctx.codegen().magic_tuple()
        return any(key[1] == here for key in step._cache._cache_file._load_index())
    except Exception:  # another numba's layout: say cold
        return False


def warm_up() -> None:
    """One call of step for each stored type (bf16 bits, int8, float32: models under BF16_ABOVE) on a tiny model,
    so that each is compiled and written to numba's disk cache, or loaded from it."""
    L, C, nh, hs, slots, H, V = 1, 4, 1, 4, 2, 8, 3
    f = np.zeros
    for dtype in (np.uint16, np.int8, np.float32):
        w = [f((L, 3 * nh * hs, C), dtype), f((L, C, nh * hs), dtype), f((L, H, C), dtype), f((L, C, H), dtype)]
        args = [a for m in w for a in (m, np.ones(m.shape[:-1], np.float32))]
        step(
            0, 0, slots, f((V, C), np.float32), f(C, np.float32), f((2 * L + 1, C), np.float32),
            np.ones(2 * L + 1, np.float32), *args, f((V, C), dtype), np.ones(V, np.float32),
            f((L, nh, slots, hs), np.float32), f((L, nh, slots, hs), np.float32), f(hs // 2, np.float32),
            f(hs // 2, np.float32), False, f(nh, np.float32), False, 0.5, False, 1e-6, f((4, 3 * nh * hs + H + C + slots), np.float32),
            f((2 * L, C), np.float32), False, f(V, np.float32),
        )  # fmt: skip
