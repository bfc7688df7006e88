"""Quantized weights (charlm compress): the int8/int4 format a checkpoint stores them in, quantize() that
makes it, the checks a stored entry passes before anything is allocated, and dequantized() that turns the
loaded entries back into float weights. checkpoint.py reads and writes them; compress.py decides what to
quantize.

A quantized matrix is stored as {"bits": 8 or 4, "values": ..., "scales": ...} in Saved.quantized, under its
state-dict name, instead of as a float tensor in Saved.model:
  int8: values int8 (rows, cols), scales float32 (rows,): one scale per output channel, w = q * scale
  int4: values uint8 (rows, groups * 16), scales float16 (rows, groups), groups = ceil(cols / 32): a scale
        per group of 32 along a row, two codes a byte (the first in the low nibble), code = q + 8, w = q *
        scale; the codes past the row's end (its last group's padding) are 8 (zero) and never read
Quantizing rounds to the nearest step (|w - q * scale| <= scale / 2); commands compute in float after loading.
Checks, before anything is allocated: the shapes and dtypes above by arithmetic from the config's shapes,
every value stored, every scale a finite number in [0, MAX_SCALE[bits]].
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from charlm.errors import CheckpointError
from charlm.storage.safe_pickle import STORAGES, TensorInfo

INT4_GROUP = 32
QMAX = {8: 127, 4: 7}  # symmetric: q in [-QMAX, QMAX]
MAX_WEIGHT = 2.0**16  # no trained weight comes near: a larger scale is a damaged or crafted file
MAX_SCALE = {bits: MAX_WEIGHT / q for bits, q in QMAX.items()}
_QUANT_DTYPES = {8: ("CharStorage", "FloatStorage"), 4: ("ByteStorage", "HalfStorage")}  # values, scales


def quantized_shapes(bits: int, rows: int, cols: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The shapes of (values, scales) that hold a (rows, cols) matrix at `bits`."""
    if bits == 8:
        return (rows, cols), (rows,)
    groups = -(-cols // INT4_GROUP)
    return (rows, groups * INT4_GROUP // 2), (rows, groups)


def quantize(w: np.ndarray, bits: int) -> dict:
    """A float matrix (rows, cols) as Saved.quantized stores it, in numpy: {"bits", "values", "scales"}. Each
    scale is the largest magnitude of its row (int8) or group (int4) over QMAX, rounded up to its stored type."""
    w = np.asarray(w, dtype=np.float32)
    rows, cols = w.shape
    q = QMAX[bits]
    if bits == 8:
        scales = (np.abs(w).max(axis=1) / q).astype(np.float32)
        fit = scales.astype(np.float64)
        values = np.rint(w / np.where(fit > 0, fit, 1)[:, None]).clip(-q, q).astype(np.int8)
        return {"bits": 8, "values": values, "scales": scales}
    groups = -(-cols // INT4_GROUP)
    padded = np.zeros((rows, groups * INT4_GROUP), np.float32)
    padded[:, :cols] = w
    g = padded.reshape(rows, groups, INT4_GROUP)
    top = np.abs(g).max(axis=2).astype(np.float64)
    scales = (top / q).astype(np.float16)
    low = scales.astype(np.float64) * q < top  # float16 rounded it down: the group's largest would not fit
    scales[low] = np.nextafter(scales[low], np.float16(np.inf))
    fit = scales.astype(np.float64)
    codes = (np.rint(g / np.where(fit > 0, fit, 1)[..., None]).clip(-q, q) + 8).astype(np.uint8)
    codes = codes.reshape(rows, groups * INT4_GROUP)
    return {"bits": 4, "values": codes[:, 0::2] | (codes[:, 1::2] << 4), "scales": scales}


def check_quantized(e: dict, p: Path, read_values, name: str, want: tuple, bad: str) -> None:
    """One entry e of Saved.quantized (`name`'s) against the matrix `want` the config needs, on the header's
    TensorInfo and the stored bytes (read_values(TensorInfo) -> bytes; numpy, no torch)."""
    if not (
        isinstance(e, dict)
        and e.keys() == {"bits", "values", "scales"}
        and type(e["bits"]) is int
        and e["bits"] in QMAX
        and len(want) == 2
    ):
        raise CheckpointError(f"{bad}: {name} is not a quantized matrix (bits 8 or 4, values, scales))")
    bits = e["bits"]
    stored = {}
    for part, shape, dtype in zip(("values", "scales"), quantized_shapes(bits, *want), _QUANT_DTYPES[bits]):
        t = e[part]
        if not isinstance(t, TensorInfo) or t.dtype != dtype:
            kind = dtype[: -len("Storage")].lower()
            raise CheckpointError(f"{bad}: {name}'s int{bits} {part} should be a tensor of {kind} values)")
        if t.shape != shape:
            raise CheckpointError(f"{bad}: {name}'s int{bits} {part} are {t.shape}, its shape {want} needs {shape})")
        if not t.holds_its_values():
            raise CheckpointError(f"{bad}: {name}'s {part} do not hold their {math.prod(t.shape):,} values)")
        stored[part] = read_values(t)
        if len(stored[part]) != t.storage_numel * STORAGES[dtype]:
            raise CheckpointError(f"{p} is not a readable charlm checkpoint ({name}'s {part} are not all there)")
    scales = np.frombuffer(stored["scales"], dtype="<f4" if bits == 8 else "<f2")
    if not (np.isfinite(scales).all() and (scales >= 0).all() and (scales <= MAX_SCALE[bits]).all()):
        raise CheckpointError(
            f"{p} holds damaged weights: {name}'s int{bits} scales should be finite numbers between 0 and "
            f"{MAX_SCALE[bits]:g}; compress again or use another checkpoint"
        )


def dequantized(p: Path, header: dict, loaded: dict, shapes: dict) -> dict:
    """The float32 matrices of Saved.quantized, after checking that what was loaded is what the header described."""
    import torch

    out = {}
    for name, e in header.items():
        got = loaded.get(name) if isinstance(loaded, dict) else None
        if not (
            isinstance(got, dict)
            and getattr(got.get("values"), "shape", None) == e["values"].shape
            and getattr(got.get("scales"), "shape", None) == e["scales"].shape
        ):
            raise CheckpointError(f"{p} is not a readable charlm checkpoint (its tensors do not match its header)")
        values, scales = got["values"], got["scales"].float()
        if e["bits"] == 8:
            out[name] = values.float() * scales[:, None]
            continue
        rows, groups = scales.shape
        codes = torch.stack((values & 15, values >> 4), dim=-1).reshape(rows, groups, INT4_GROUP)
        out[name] = ((codes.float() - 8) * scales[..., None]).reshape(rows, -1)[:, : shapes[name][1]].contiguous()
    return out
