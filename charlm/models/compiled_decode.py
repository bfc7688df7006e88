"""The Transformer's one-token decode step as ONE compiled call (numba), with its matrices stored small enough
to stay in the CPU's L2 cache: what generation runs for each new token where numba is installed and compiles.

Why: at chat sizes (4 x 128) a token's time is the five matrix-vector products of each layer, and they are slow
because 3.2 MB of float32 weights do not fit a 2 MB L2 (the same product costs a quarter as much with its weights
in L2); the rest is ~100 tiny numpy calls of 1-3 us each (models/fast_decode.py). So this step makes one call per
token, and streams each matrix in a narrower form, widened to float32 as it is read (the arithmetic stays fp32):
  float32 model   bf16 (the top 16 bits of each float32, rounded to nearest even: torch's .to(bfloat16)), 2 bytes
  int8 run        charlm compress's int8 values and per-row scales (storage/quantized.py), 1 byte: w = q * scale. The
                  loaded model holds them dequantized (q * scale exactly, in float32), so they are read back off
                  the weights (lossless: q = rint(w / scale), checked) rather than carried through every command.
The embedding row, norms, positions, the KV cache and all sums stay float32. Which storage a model gets is
fast_decode.storage()'s rule, and the numpy step reads the same values (bf16-rounded matrices for a model over
BF16_ABOVE bytes), so handing over from one to the other mid-stream moves logits by float rounding only. bf16
moves a logit by ~1e-3 against the float32 model (top token the same; tests/test_fast_decode.py states the
tolerance); int8 computes the dequantized model's logits to float rounding.

CompiledDecoder(model, cache).step_np(token) is FastDecoder's contract: model(token, cache=cache)'s logits for one
token, the keys and values written into the same KVCache a torch prefill fills, cache.pos advanced, a rolling
cache wrapping. Its copies of the weights are made once: current() notices a model moved to other memory, and
`version` (the sum of the parameters' in-place update counters) a model trained meanwhile.

numba is imported only once a Streamer's tokens would reach LOAD_AFTER (never at start-up, never for a short
sample), on a background thread: kernel() returns None until the kernel is loaded, and for good if numba is missing
or fails to compile (the numpy step serves). A cold cache is filled by a child process, which finishes even if
this one ends first. The compiled code is cached on disk beside this file, or under charlm's cache directory
(data.cache_dir()/numba) where that is not writable.
"""

from __future__ import annotations

import importlib
import math
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

from charlm.models import fast_decode
from charlm.models.fast_decode import FastDecoder, as_int8, matrices, unchanged, weights_version
from charlm.models.transformer import QK_NORM_EPS, Transformer, rope_inv_freq

# Tokens a Streamer must be about to reach (its numpy steps so far plus the stream's max_tokens) before the kernel
# starts loading: the load costs ~0.6 s of a core (numba's import and the cached machine code; the first time on a
# machine, ~15 s of compiling in a child process), and the step saves ~0.14 ms a token at 4 x 128 (0.27 -> 0.13 ms
# with sampling), so it pays only past a few thousand tokens: a sample of a few hundred never loads it, a long one
# does (chat and compare never do: commands/chat.py says why). Tests and benchmarks call kernel(wait=True) first:
# the Streamer then takes the compiled step from its first token.
LOAD_AFTER = 2000

_state = {"kernel": None, "failed": False, "thread": None, "cached": None}
_lock = threading.Lock()


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


def ready() -> bool:
    """Whether the compiled step is ready (without starting its compile)."""
    return _state["kernel"] is not None


_SOURCE = str(Path(__file__).resolve().parents[2])  # the folder holding this charlm: the child compiles the same


def _pythonpath() -> list[str]:
    return [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]


def _compile() -> None:
    """Load the kernel from numba's disk cache; where the cache is cold, first compile it in a child process
    (start_new_session: it finishes and fills the cache even if this process ends first, e.g. a short sample,
    and compiling there leaves this process's GIL to the numpy step meanwhile)."""
    try:
        here = Path(__file__).parent
        if "NUMBA_CACHE_DIR" not in os.environ and not os.access(here, os.W_OK):
            from charlm.data import cache_dir

            os.environ["NUMBA_CACHE_DIR"] = str(cache_dir() / "numba")
        _decode_kernel = importlib.import_module("charlm.models._decode_kernel")  # numba: this process's first use
        _state["cached"] = _decode_kernel.cached()
        if not _state["cached"]:
            child = subprocess.run(
                [sys.executable, "-c", "from charlm.models._decode_kernel import warm_up; warm_up()"],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True, env={**os.environ, "PYTHONPATH": os.pathsep.join([_SOURCE, *_pythonpath()])},
            )  # fmt: skip
            if child.returncode != 0:
                raise RuntimeError("the decode kernel did not compile")
        _decode_kernel.warm_up()  # load from the cache (or compile, should the child's cache not serve this process)
        _state["kernel"] = _decode_kernel.step
    except Exception:  # no numba, an llvmlite that does not load, a compile error: numpy's step serves
        _state["failed"] = True


def supports(model: nn.Module) -> bool:
    """FastDecoder.supports' conditions (a CPU float32 Transformer in eval mode) and the kernel ready to run (this
    never starts loading it: kernel() does)."""
    return FastDecoder.supports(model) and ready()


def as_bf16(w: torch.Tensor) -> np.ndarray:
    """w (float32) rounded to bf16 (nearest even, as torch rounds), as its bits (uint16)."""
    return w.detach().to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


class CompiledDecoder:
    def __init__(self, model: Transformer, cache, storage: str | None = None):
        """storage: "int8", "bf16" or "f32" (None: fast_decode.storage(model), as the numpy step reads it)."""
        cfg = self.cfg = model.cfg
        self.model, self.cache = model, cache
        self.kernel = kernel()
        self.params = list(model.parameters())  # listed once: walking the modules costs ~100 us, a token's time
        self.weight_at, self.version = model.tok_emb.weight.data_ptr(), weights_version(self.params)
        blocks = model.blocks
        mats = matrices(model)
        self.storage = storage or fast_decode.storage(model)
        if self.storage == "int8":
            packed = {k: [as_int8(w) for w in ws] for k, ws in mats.items()}
            if any(p is None for ps in packed.values() for p in ps):
                raise ValueError("the model's matrices are not int8 values times a scale per row")
        else:  # bf16, or float32 as it is ("f32")
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
        self.qk_norm, self.qk_eps = cfg.qk_norm, float(QK_NORM_EPS)
        self.smear = model.smear.detach().numpy() if cfg.smear else None
        self.last, self.row = cache.last.numpy(), np.zeros(C, np.float32)  # the cache's last token, shared

    supports = staticmethod(supports)

    def current(self) -> bool:
        return unchanged(self)

    def step(self, token: int, trace: list | None = None) -> torch.Tensor:
        return torch.from_numpy(self.step_np(token, trace))

    def step_np(self, token: int, trace: list | None = None) -> np.ndarray:
        """Logits (vocab,) after feeding `token` at position cache.pos (a new array). trace: when given, gets the
        residual stream (C,) after each block's attention and after its MLP, in order."""
        cache = self.cache
        pos, slots = cache.pos, cache.slots
        if pos >= slots and not cache.rolling:
            raise ValueError(f"{pos + 1} positions exceed the model's context of {self.cfg.context}")
        if not 0 <= token < len(self.emb):  # the kernel does not check its indices (torch's step would raise)
            raise IndexError(f"token {token} is outside the vocabulary of {len(self.emb)}")
        pos_row = self.zero_row if self.pos_table is None else self.pos_table[pos]
        if self.smear is not None and pos > 0:  # smear: added to the token's embedding as a position's row is
            pos_row = np.add(pos_row, self.smear * self.emb[self.last[0]], out=self.row)
        self.last[0] = token
        cos, sin = (self.cos[pos], self.sin[pos]) if pos < len(self.cos) else self._rope_past(pos)
        tr = np.zeros((2 * self.cfg.n_layers, self.cfg.d_model), np.float32) if trace is not None else self.no_trace
        w = self.w
        self.kernel(
            token, pos, slots, self.emb, pos_row, self.norms, self.eps,
            *w["qkv"], *w["proj"], *w["fc"], *w["fcp"], *w["head"],
            self.k, self.v, cos, sin, self.rope, self.slopes, self.alibi, self.scale, self.qk_norm, self.qk_eps, self.scratch,
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
