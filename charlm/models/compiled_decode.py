"""The Transformer's one-token decode step as ONE compiled call (numba), with its matrices stored small enough
to stay in the CPU's L2 cache: what generation runs for each new token where numba is installed and compiles.

Why: at chat sizes (4 x 128) a token's time is the five matrix-vector products of each layer, and they are slow
because 3.2 MB of float32 weights do not fit a 2 MB L2 (the same product costs a quarter as much with its weights
in L2); the rest is ~100 tiny numpy calls of 1-3 us each (models/fast_decode.py). So this step makes one call per
token, and streams each matrix in a narrower form, widened to float32 as it is read (the arithmetic stays fp32):
  float32 model   bf16 (the top 16 bits of each float32, rounded to nearest even: torch's .to(bfloat16)), 2 bytes
  int8 run        charlm compress's int8 values and per-row scales (quantized.py), 1 byte: w = q * scale. The
                  loaded model holds them dequantized (q * scale exactly, in float32), so they are read back off
                  the weights (lossless: q = rint(w / scale), checked) rather than carried through every command.
The embedding row, norms, positions, the KV cache and all sums stay float32. bf16 storage moves a logit by ~1e-3
on a trained model (top token the same; tests/test_fast_decode.py states the tolerance); int8 computes the
dequantized model's logits to float rounding.

CompiledDecoder(model, cache).step_np(token) is FastDecoder's contract: model(token, cache=cache)'s logits for one
token, the keys and values written into the same KVCache a torch prefill fills, cache.pos advanced, a rolling
cache wrapping. Its copies of the weights are made once: current() notices a model moved to other memory, and
`version` (the sum of the parameters' in-place update counters) a model trained meanwhile.

numba is imported only when a generation first asks for this step (never at start-up), on a background thread
when its cache is cold: until the kernel is ready the Streamer steps in numpy (kernel() returns None meanwhile,
and for good if numba is missing or fails to compile). The compiled kernel is cached on disk beside this file,
or under charlm's cache directory (data.cache_dir()/numba) where that is not writable.
"""

from __future__ import annotations

import math
import os
import threading
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

from charlm.models.transformer import Transformer, rope_inv_freq

_state = {"kernel": None, "failed": False, "thread": None, "cached": None}
_lock = threading.Lock()
_known = threading.Event()  # set once the compile thread knows whether numba's disk cache holds the kernel


# Below this many bytes of float32 matrices the weights stay in L2 as they are: bf16 buys nothing (2 x 64: 15.6 us
# a token in float32, 16.3 in bf16; 4 x 64, 0.77 MB: 30.9 and 26.7; 4 x 128, 3 MB: 135 and 77) and small models
# (the tests') keep torch's logits to float rounding
BF16_ABOVE = 256 * 1024


def kernel(wait: bool = False):
    """The compiled step function, or None while it compiles (on a background thread, started by the first
    call) or when it cannot (numba missing, or a compile error: the numpy step is then used for good).
    wait: block until the compile ends (tests and benchmarks)."""
    with _lock:
        if _state["kernel"] is None and not _state["failed"] and _state["thread"] is None:
            _state["thread"] = threading.Thread(target=_compile, name="charlm-decode-compile", daemon=True)
            _state["thread"].start()
        thread = _state["thread"]
    if wait and thread is not None:
        thread.join()
    return _state["kernel"]


def settled():
    """kernel(), waiting for it where numba's disk cache holds it (a load: ~0.5 s, numba's import included), so
    that every run on a machine past its first takes the same step from its first token; None while a cold cache
    compiles (seconds, once a machine), when the numpy step stands in and hands over once it is done."""
    if kernel() is None and not _state["failed"]:
        _known.wait()
        return kernel(wait=bool(_state["cached"]))
    return _state["kernel"]


def ready() -> bool:
    """Whether the compiled step is ready (without starting its compile)."""
    return _state["kernel"] is not None


def _compile() -> None:
    try:
        try:
            here = Path(__file__).parent
            if "NUMBA_CACHE_DIR" not in os.environ and not os.access(here, os.W_OK):
                from charlm.data import cache_dir

                os.environ["NUMBA_CACHE_DIR"] = str(cache_dir() / "numba")
            from charlm.models._decode_kernel import step as fn

            try:
                _state["cached"] = os.path.exists(fn._cache._cache_file._index_path)  # numba's index of cached code
            except Exception:  # another numba's layout: say cold (the numpy step stands in meanwhile)
                _state["cached"] = False
        finally:
            _known.set()
        _warm_up(fn)  # compile (or load from the cache) for the types every call passes
        _state["kernel"] = fn
    except Exception:  # no numba, an llvmlite that does not load, a compile error: numpy's step serves
        _state["failed"] = True


def _warm_up(fn) -> None:
    """One call on a tiny model of each storage kind, so that the types are compiled (or loaded) here."""
    for dtype in (np.uint16, np.int8):
        L, C, nh, hs, slots, H, V = 1, 4, 1, 4, 2, 8, 3
        w = {
            "qkv": np.zeros((L, 3 * nh * hs, C), dtype),
            "proj": np.zeros((L, C, nh * hs), dtype),
            "fc": np.zeros((L, H, C), dtype),
            "fcp": np.zeros((L, C, H), dtype),
            "head": np.zeros((V, C), dtype),
        }
        s = {k: np.ones(v.shape[:-1], np.float32) for k, v in w.items()}
        f = np.zeros
        fn(
            0, 0, 2, f((V, C), np.float32), f(C, np.float32), f((2 * L + 1, C), np.float32), f(2 * L + 1, np.float32),
            w["qkv"], s["qkv"], w["proj"], s["proj"], w["fc"], s["fc"], w["fcp"], s["fcp"], w["head"], s["head"],
            f((L, nh, slots, hs), np.float32), f((L, nh, slots, hs), np.float32), f(hs // 2, np.float32),
            f(hs // 2, np.float32), False, f(nh, np.float32), False, 0.5, f((4, 3 * nh * hs + H + C + slots), np.float32),
            f((2 * L, C), np.float32), False, f(V, np.float32),
        )  # fmt: skip


def supports(model: nn.Module) -> bool:
    """FastDecoder.supports' conditions (a CPU float32 Transformer in eval mode) and a kernel ready to run."""
    from charlm.models.fast_decode import FastDecoder

    return FastDecoder.supports(model) and settled() is not None


def as_bf16(w: torch.Tensor) -> np.ndarray:
    """w (float32) rounded to bf16 (nearest even, as torch rounds), as its bits (uint16)."""
    return w.detach().to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def as_int8(w: torch.Tensor) -> tuple[np.ndarray, np.ndarray] | None:
    """(values int8, scales float32 per row) when w holds int8 values times a scale per row (a compress --bits 8
    run, dequantized as quantized.py does), else None."""
    a = w.detach().numpy()
    top = np.abs(a).max(axis=1)
    scales = (top / np.float32(127)).astype(np.float32)
    safe = np.where(scales > 0, scales, np.float32(1))[:, None]
    q = np.rint(a / safe)
    if np.abs(q).max(initial=0) > 127:
        return None
    # q * scale must give w back to float rounding (a float32 matrix has ~2^24 levels a row, int8 255)
    if np.abs(q * safe - a).max(initial=0) > 4e-7 * max(float(top.max(initial=0)), 1e-30):
        return None
    return q.astype(np.int8), scales


def _int8(mats: dict) -> dict | None:
    """{name: [(values, scales), ...]} when every matrix is int8 values times row scales, else None (at the first
    that is not, usually the first)."""
    packed = {}
    for k, ws in mats.items():
        packed[k] = [as_int8(w) for w in ws]
        if any(p is None for p in packed[k]):
            return None
    return packed


def weights_version(params: list) -> int:
    """The sum of the parameters' in-place update counters: it grows when an optimizer steps the model."""
    return sum(p._version for p in params)


class CompiledDecoder:
    def __init__(self, model: Transformer, cache, storage: str | None = None):
        """storage: "int8", "bf16" or "f32" (None: int8 where every matrix holds int8 values times row scales,
        else bf16 where the float32 matrices are over BF16_ABOVE bytes, else float32)."""
        cfg = self.cfg = model.cfg
        self.model, self.cache = model, cache
        self.kernel = kernel()
        self.params = list(model.parameters())  # listed once: walking the modules costs ~100 us, a token's time
        self.weight_at, self.version = model.tok_emb.weight.data_ptr(), weights_version(self.params)
        blocks = model.blocks
        mats = {
            "qkv": [b.attn.qkv.weight for b in blocks],
            "proj": [b.attn.proj.weight for b in blocks],
            "fc": [b.mlp.fc.weight for b in blocks],
            "fcp": [b.mlp.proj.weight for b in blocks],
            "head": [model.head.weight],
        }
        packed = _int8(mats) if storage in (None, "int8") else None
        if packed is None and storage == "int8":
            raise ValueError("the model's matrices are not int8 values times a scale per row")
        if packed is not None:
            self.storage = "int8"
        else:
            big = 4 * sum(w.numel() for ws in mats.values() for w in ws) > BF16_ABOVE
            self.storage = storage or ("bf16" if big else "f32")
        if packed is None:  # bf16, or float32 as it is ("f32": the tests' exact reference)
            store = as_bf16 if self.storage == "bf16" else (lambda w: w.detach().numpy())
            packed = {k: [(store(w), np.ones(w.shape[0], np.float32)) for w in ws] for k, ws in mats.items()}
        self.w = {k: (np.stack([v for v, _ in ps]), np.stack([s for _, s in ps])) for k, ps in packed.items()}
        self.w["head"] = tuple(a[0] for a in self.w["head"])  # (vocab, C), (vocab,)
        self.emb = model.tok_emb.weight.detach().numpy()  # one row a token: float32, read in place
        norms = [n for b in blocks for n in (b.norm1, b.norm2)] + [model.norm]
        self.norms = np.stack([n.weight.detach().numpy() for n in norms]).astype(np.float32)
        self.eps = np.array([n.eps if n.eps is not None else torch.finfo(torch.float32).eps for n in norms], np.float32)
        self.k, self.v = cache.k.numpy()[:, 0], cache.v.numpy()[:, 0]  # (L, nh, slots, hs): batch row 0, shared
        assert self.k.flags.c_contiguous and np.shares_memory(self.k, cache.k.numpy())
        nh, hs, C = cfg.n_heads, cfg.head_size, cfg.d_model
        H = blocks[0].mlp.fc.weight.shape[0]
        self.scratch = np.zeros((4, 3 * nh * hs + H + C + cache.slots), np.float32)
        self.logits = np.zeros(model.head.weight.shape[0], np.float32)
        self.no_trace = np.zeros((0, C), np.float32)
        self.pos_table = None
        if cfg.positions == "learned":
            self.pos_table = model.pos_emb.weight.detach().numpy()
        elif cfg.positions == "sinusoidal":
            self.pos_table = model.pos_table.numpy()
        self.zero_row = np.zeros(C, np.float32)
        self.rope = cfg.positions == "rope"
        half = hs // 2
        self.cos, self.sin = (
            (model.rope_cos.numpy(), model.rope_sin.numpy()) if self.rope else (np.zeros((1, half), np.float32),) * 2
        )
        self.past = (np.zeros((0, half), np.float32), np.zeros((0, half), np.float32), 0)
        self.alibi = cfg.positions == "alibi"
        self.slopes = model.alibi_slopes.numpy() if self.alibi else np.zeros(nh, np.float32)
        self.scale = 1.0 / math.sqrt(hs)

    supports = staticmethod(supports)

    def current(self) -> bool:
        """Whether the model is still in eval mode, in the same memory, and not updated in place since the copy."""
        m = self.model
        return (
            not m.training
            and m.tok_emb.weight.data_ptr() == self.weight_at
            and weights_version(self.params) == self.version
        )

    def step(self, token: int, trace: list | None = None) -> torch.Tensor:
        return torch.from_numpy(self.step_np(token, trace))

    def step_np(self, token: int, trace: list | None = None) -> np.ndarray:
        """Logits (vocab,) after feeding `token` at position cache.pos (a new array). trace: when given, gets the
        residual stream (C,) after each block's attention and after its MLP, in order."""
        cache = self.cache
        pos, slots = cache.pos, cache.slots
        if pos >= slots and not cache.rolling:
            raise ValueError(f"{pos + 1} positions exceed the model's context of {self.cfg.context}")
        pos_row = self.zero_row if self.pos_table is None else self.pos_table[pos]
        cos, sin = (self.cos[pos], self.sin[pos]) if pos < len(self.cos) else self._rope_past(pos)
        tr = np.zeros((2 * self.cfg.n_layers, self.cfg.d_model), np.float32) if trace is not None else self.no_trace
        w = self.w
        self.kernel(
            token, pos, slots, self.emb, pos_row, self.norms, self.eps,
            *w["qkv"], *w["proj"], *w["fc"], *w["fcp"], *w["head"],
            self.k, self.v, cos, sin, self.rope, self.slopes, self.alibi, self.scale, self.scratch,
            tr, trace is not None, self.logits,
        )  # fmt: skip
        cache.pos += 1
        if trace is not None:
            trace.extend(tr.copy())
        return self.logits.copy()

    def _rope_past(self, pos: int) -> tuple[np.ndarray, np.ndarray]:
        # past the table (a rolling RoPE cache): rope_at's angles in float64, cast to float32 after the
        # trigonometry, for the next `context` positions at once
        if self.rope:
            cos, sin, start = self.past
            if not start <= pos < start + len(cos):
                angles = np.outer(
                    np.arange(pos, pos + self.cfg.context, dtype=np.float64), rope_inv_freq(self.cfg.head_size).numpy()
                )
                self.past = cos, sin, start = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32), pos
            return cos[pos - start], sin[pos - start]
        return self.cos[0], self.sin[0]
