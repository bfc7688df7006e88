"""positions: the same Transformer with each kind of position information (config.POSITIONS), trained
with the same budget on the copy task (N symbols, a separator, the same N again), then scored in
bits/char on fresh text in windows of the training context and of 2× and 4× it.

Beyond the training context the model is rebuilt with a larger context and given the same weights:
RoPE's and the sinusoidal table's entries for the new positions are computed, not learned. A learned
position table has no rows for them, so there is nothing to evaluate (shown as n/a).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from charlm.config import POSITIONS, ModelConfig
from charlm.lab import tasks
from charlm.lab.common import (
    Chart,
    Clock,
    LabResult,
    lab_train_config,
    load_run,
    record,
    train_model,
)
from charlm.models import build_model

DEFAULTS = dict(
    length=10,
    context=32,
    windows=(1, 2, 4),
    steps=500,
    d_model=32,
    layers=1,
    heads=2,
    batch_size=16,
    lr=1e-2,
    train_chars=100_000,
    eval_chars=8192,
)
QUICK = dict(windows=(1, 2), steps=150, train_chars=30_000, eval_chars=2048)


@torch.no_grad()
def window_bits(model, ids: np.ndarray, window: int) -> float:
    """Bits per char (one char per token) over non-overlapping windows of `window` tokens, every target
    scored with only the tokens of its own window before it."""
    n = (len(ids) - 1) // window
    x = torch.from_numpy(np.asarray(ids[: n * window + 1], dtype=np.int64))
    inputs = x[:-1].view(n, window)
    targets = x[1:].view(n, window)
    logits, _ = model(inputs)
    return float(F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1))) / math.log(2)


def widened(model, context: int):
    """The same weights in a model built for a longer context; None when the positions cannot stretch."""
    if model.cfg.positions == "learned":
        return None
    cfg = ModelConfig.from_dict({**model.cfg.to_dict(), "context": context})
    wide = build_model(cfg)
    wide.load_state_dict(model.state_dict())  # position buffers are not saved: rebuilt for the new length
    return wide.eval()


def run(out: Path, seed: int = 0, device: str = "cpu", progress=print, **settings) -> LabResult:
    s = {**DEFAULTS, **settings}
    clock = Clock()
    text = tasks.corpus("copy", s["length"], s["train_chars"], seed).text  # every character a target
    fresh = tasks.corpus("copy", s["length"], s["eval_chars"], seed + 10_000).text
    records, runs = [], []
    for k, pos in enumerate(POSITIONS, 1):
        cfg = ModelConfig(
            kind="transformer",
            vocab_size=tasks.vocab_size("copy"),
            n_layers=s["layers"],
            d_model=s["d_model"],
            n_heads=s["heads"],
            context=s["context"],
            positions=pos,
        )
        name = f"positions-{pos}-c{s['context']}"
        progress(f"training {name} ({k}/{len(POSITIONS)}, {s['steps']} steps)")
        run_dir = train_model(
            text, out / name, cfg, lab_train_config(s["steps"], seed, device, s["batch_size"], s["lr"], "muon")
        )
        runs.append(str(run_dir))
        ck = load_run(run_dir)
        ids = np.asarray(ck.tokenizer.encode(fresh), dtype=np.int64)
        for m in s["windows"]:
            window = m * s["context"]
            model = ck.model if m == 1 else widened(ck.model, window)
            bits = window_bits(model, ids, window) if model is not None else None
            records.append(
                record(
                    positions=pos, window=window, bits_per_char=bits, val_bits_per_char=_rounded(ck.saved.best_val_bpc)
                )
            )
    return LabResult(
        "positions",
        {**s, "windows": list(s["windows"]), "seed": seed, "device": device, "variants": list(POSITIONS)},
        records,
        reading(records, s),
        Chart("window", "bits_per_char", "positions", "window (tokens)", "bits/char", xlog=True),
        runs=runs,
        seconds=clock(),
    )


def _label(p: str) -> str:
    return {"rope": "RoPE"}.get(p, p.capitalize())


def reading(records: list[dict], s: dict) -> str:
    C = s["context"]
    at = {(r["positions"], r["window"]): r["bits_per_char"] for r in records}
    inside = {p: at[(p, C)] for p in POSITIONS}
    order = sorted(POSITIONS, key=lambda p: inside[p])
    # the floor: the first half of each example is random (log2 of the symbols), the copied half is free
    floor = math.log2(len(tasks.SYMBOLS)) * s["length"] / (2 * s["length"] + 2)
    parts = [
        f"Within the training context ({C} tokens) the order is "
        + ", ".join(f"{p} {inside[p]:.3f}" for p in order)
        + f" bits/char (a perfect copier scores about {floor:.2f}: the first half of each line is random)."
    ]
    unigram = math.log2(len(tasks.SYMBOLS))
    idle = [p for p in POSITIONS if inside[p] > floor + 0.75 * (unigram - floor)]
    if idle:
        parts.append(
            f"{', '.join(idle).capitalize()} {'has' if len(idle) == 1 else 'have'} barely started to copy with this budget "
            f"(guessing every symbol costs {unigram:.2f}), so the longer windows test little there."
        )
    beyond = sorted({r["window"] for r in records if r["window"] > C})
    for p in POSITIONS if beyond else ():
        if at[(p, beyond[0])] is None:
            parts.append(f"{_label(p)} positions cannot be evaluated beyond {C} tokens: the table has no rows there.")
            continue
        steps = ", ".join(f"{at[(p, w)]:.3f} at {w} ({at[(p, w)] - inside[p]:+.3f})" for w in beyond)
        parts.append(f"{_label(p)}: {steps}.")
    if beyond and "rope" in POSITIONS and "rope" not in idle:  # (an idle model has nothing to carry over)
        w = beyond[-1]
        if at[("rope", w)] <= inside["rope"] + 0.1:
            parts.append(
                "RoPE encodes only the distance between two tokens, and copying needs only a distance, "
                f"so it carries over to {w} tokens, as expected."
            )
        else:
            parts.append(
                f"Contrary to the usual claim that RoPE extrapolates, it does not hold at {w} tokens: it encodes "
                f"only distances, but a longer window brings keys more than {C} tokens back, distances the "
                "model never saw in training, and they draw attention away from the symbol to copy."
            )
    return " ".join(parts)


def _rounded(bpc: float | None) -> float | None:
    return None if bpc is None else round(bpc, 4)  # None: the run was never evaluated
