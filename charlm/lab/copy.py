"""copy: delayed copy. N random symbols, a separator, the same N symbols again. A 2-layer Transformer and
an LSTM of about the same size get the same training budget at each N, for each seed; the score is the
share of the copied half they predict exactly.

Attention can copy any N within its context: a head that looks N tokens back, or an induction circuit
(a previous-token head, then a head that finds where the current symbol stood and reads the one after
it) -- both put their weight on the symbol to copy. The LSTM has to carry N symbols (N · log2 10 bits)
through its fixed state. After the sweep, the Transformer's copy head (the head that puts most weight on
that symbol) is found on one example, for the viewers to draw.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from charlm.lab import tasks
from charlm.lab.common import Chart, Clock, LabResult, family_reading, load_run, params, seeds_of, sweep, verdict
from charlm.models.probes import capture_attention

DEFAULTS = dict(
    lengths=(5, 10, 20, 40),
    steps=250,
    d_model=64,
    layers=2,
    heads=2,
    batch_size=64,
    lr=3e-3,
    train_chars=200_000,
    eval_examples=200,
)
QUICK = dict(lengths=(16,), steps=150, train_chars=60_000, eval_examples=100)
CHANCE = 1 / len(tasks.SYMBOLS)
GOOD = 0.99  # copies: every symbol but one in a hundred
NEAR_CHANCE = 0.15


def context_for(n: int) -> int:
    return 2 * n + 2  # one whole example: its newline, N symbols, the separator, N symbols (and the next newline)


def run(out: Path, seed: int = 0, seeds: int = 1, device: str = "cpu", progress=print, **settings) -> LabResult:
    s = {**DEFAULTS, **settings}
    clock = Clock()
    seed_list = seeds_of(seed, seeds)
    records, runs = sweep("copy", s["lengths"], s, context_for, out, seed_list, device, progress)
    shown = _example_to_show(records)
    example = tasks.examples("copy", shown, 1, seed + 20_000)[0].text
    ck = load_run(Path(runs[("transformer", shown, seed)]))
    layer, head, weight = copy_head(ck.model, ck.tokenizer, example, shown)
    details = {
        "example": example,
        "length": shown,
        "transformer_run": runs[("transformer", shown, seed)],
        "lstm_run": runs[("lstm", shown, seed)],
        "copy_head": {"layer": layer, "head": head, "weight": round(weight, 3)},
    }
    return LabResult(
        "copy",
        {**s, "lengths": list(s["lengths"]), "seeds": seed_list, "device": device},
        records,
        reading(records, details, s, seed_list),
        Chart("length", "accuracy", "model", "N (symbols to copy)", "accuracy (mean over seeds)"),
        runs=list(runs.values()),
        seconds=clock(),
        details=details,
    )


def _example_to_show(records: list[dict]) -> int:
    """The longest N the Transformer copies well (else the shortest): its map shows the mechanism."""
    good = [r["length"] for r in records if r["model"] == "transformer" and r["accuracy"] >= 0.9]
    return max(good) if good else min(r["length"] for r in records)


def copy_head(model, tokenizer, text: str, n: int) -> tuple[int, int, float]:
    """(layer, head, weight): the head that puts the most attention, averaged over the copied half, on the
    symbol to copy. With a newline first, position q = N + 1 + j (the separator, then the copied symbols)
    predicts symbol j, which stands at position 1 + j: N tokens back."""
    _, w = capture_attention(model, tokenizer.encode("\n" + text))  # (L, nh, T, T)
    rows = np.arange(n + 1, 2 * n + 1)
    at_offset = w[:, :, rows, rows - n].mean(axis=-1)  # (L, nh)
    layer, head = np.unravel_index(int(at_offset.argmax()), at_offset.shape)
    return int(layer), int(head), float(at_offset[layer, head])


def reading(records: list[dict], details: dict, s: dict, seeds: list[int]) -> str:
    by = {kind: [r for r in records if r["model"] == kind] for kind in ("transformer", "lstm")}
    budget = f"{s['steps']} steps of {s['batch_size']} examples per model, seed{'s' if len(seeds) > 1 else ''} " + (
        ", ".join(map(str, seeds))
    )
    parts = [
        f"Share of the copied half right (chance {CHANCE:.0%}).",
        family_reading(
            f"The Transformer ({params(by['transformer'])} parameters)",
            by["transformer"],
            "length",
            GOOD,
            NEAR_CHANCE,
        ),
        family_reading(f"The LSTM ({params(by['lstm'])})", by["lstm"], "length", GOOD, NEAR_CHANCE),
        verdict(
            records,
            "length",
            budget,
            "as expected: the LSTM must squeeze N symbols through its fixed state, attention looks them up",
        ),
    ]
    head, n = details["copy_head"], details["length"]
    where = f"layer {head['layer']} head {head['head']}"
    if head["weight"] >= 0.5:
        parts.append(
            f"At N={n}, the Transformer's {where} puts {head['weight']:.0%} of its attention on the symbol "
            "to copy, N tokens back: the offset diagonal in its map."
        )
    else:
        parts.append(
            f"At N={n} no head looks at the symbol to copy: the closest, {where}, puts only "
            f"{head['weight']:.0%} of its attention on it."
        )
    return " ".join(parts)
