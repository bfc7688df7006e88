"""capacity: how much crosses an LSTM's fixed state, at one training budget. One-layer LSTMs of several
hidden sizes learn the copy task (N random symbols, a separator, the same N again) for every N from 1 to
the longest, mixed, with the same budget; each is then scored at every N of a grid on held-out lines.

N symbols are N · log2 10 bits that must cross the separator inside the state: H cell values and H
outputs. From the accuracy a at each N, N · I(a) bits at least crossed, where I(a) is what one copied
symbol carries when it is right with probability a and wrong evenly otherwise (scoring.bits_per_symbol):
by Fano's inequality a mean accuracy a needs at least that much information, so it is a lower bound on
what crossed, not a measure of all of it. The most over N is given beside the state's size in numbers. It
is what this budget taught, not what the state could hold in principle (float32 numbers hold far more),
and a longer budget may move it.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from charlm.config import ModelConfig
from charlm.lab import tasks
from charlm.lab.result import Chart, Clock, LabResult, record, seeds_of, spread
from charlm.lab.scoring import accuracy, bits_per_symbol
from charlm.lab.training import lab_train_config, load_run, train_model
from charlm.models import config_params

DEFAULTS = dict(
    hidden=(16, 32, 64, 128),
    longest=48,
    grid=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48),
    steps=1000,
    batch_size=64,
    lr=1e-2,
    train_chars=400_000,
    eval_examples=200,
)
QUICK = dict(hidden=(8, 64), longest=16, grid=(1, 2, 4, 8, 16), steps=300, train_chars=60_000, eval_examples=100)
CHANCE = 1 / len(tasks.SYMBOLS)
COPIES = 0.9  # "copies N": at least this share of the copied half right

CHART = Chart(
    "length", "accuracy", "hidden", "N (symbols to copy)", "accuracy (mean over seeds)", xlog=True
)  # how its records are drawn


def run(out: Path, seed: int = 0, seeds: int = 1, device: str = "cpu", progress=print, **settings) -> LabResult:
    s = {**DEFAULTS, **settings}
    clock = Clock()
    seed_list = seeds_of(seed, seeds)
    K = len(tasks.SYMBOLS)
    scores: dict[tuple[int, int], list[float]] = {}
    runs = []
    for k, H in enumerate(s["hidden"], 1):
        cfg = ModelConfig(
            kind="lstm", vocab_size=tasks.vocab_size("copy"), n_layers=1, d_model=H, context=2 * s["longest"] + 2
        )
        for seed_ in seed_list:
            name = f"capacity-lstm-h{H}-s{seed_}"
            progress(f"training {name} ({k}/{len(s['hidden'])}, seed {seed_}, {config_params(cfg):,} parameters)")
            data = tasks.corpus("copy", tuple(range(1, s["longest"] + 1)), s["train_chars"], seed_ + H, heldout=True)
            cfg_train = lab_train_config(s["steps"], seed_, device, s["batch_size"], s["lr"])
            run_dir = train_model(data, out / name, cfg, cfg_train)
            runs.append(str(run_dir))
            ck = load_run(run_dir)
            for n in s["grid"]:
                fresh = tasks.examples("copy", n, s["eval_examples"], seed_ + 10_000 + n)
                scores.setdefault((H, n), []).append(accuracy(ck.model, ck.tokenizer, fresh))
    records = [
        record(
            hidden=H,
            length=n,
            **spread(scores[(H, n)]),
            bits_needed=n * math.log2(K),
            bits_copied=statistics.fmean(n * bits_per_symbol(a, K) for a in scores[(H, n)]),
        )
        for H in s["hidden"]
        for n in s["grid"]
    ]
    summary = [summarise(H, [r for r in records if r["hidden"] == H], seed_list) for H in s["hidden"]]
    return LabResult(
        "capacity",
        {**s, "hidden": list(s["hidden"]), "grid": list(s["grid"]), "seeds": seed_list, "device": device},
        records,
        reading(summary, s, seed_list),
        CHART,
        runs=runs,
        seconds=clock(),
        details={"summary": summary},
    )


def summarise(H: int, records: list[dict], seeds: list[int]) -> dict:
    """One LSTM size: the longest N it copies (every N up to it, every seed), the first N it fails, and the
    most bits that at least crossed its state (the mean over seeds at each N, the best N)."""
    copies = 0
    for r in records:  # the grid in order
        if min(r.get("per_seed") or [r["accuracy"]]) < COPIES:
            break
        copies = r["length"]
    failed = next((r["length"] for r in records if r["length"] > copies), None)
    best = max(records, key=lambda r: r["bits_copied"])
    return record(
        hidden=H,
        state_units=2 * H,  # c and h
        copies_up_to=copies,
        fails_at=failed,
        bits_copied=best["bits_copied"],
        at_length=best["length"],
        bits_per_unit=best["bits_copied"] / (2 * H),
    )


def reading(summary: list[dict], s: dict, seeds: list[int]) -> str:
    K = len(tasks.SYMBOLS)
    parts = [
        f"Copying N symbols takes N · log2 {K} = {math.log2(K):.2f} N bits through the state.",
    ]
    for r in summary:
        held = f"copies every N up to {r['copies_up_to']}" if r["copies_up_to"] else "copies no N"
        fails = f", fails (< {COPIES:.0%}) from N={r['fails_at']}" if r["fails_at"] else ""
        parts.append(
            f"{r['hidden']} units: {held}{fails}; at least {r['bits_copied']:.1f} bits crossed a state of "
            f"{r['state_units']} numbers (at N={r['at_length']}; {r['bits_per_unit']:.2f} a number), at this budget."
        )
    pairs = list(zip(summary, summary[1:]))
    later = [(a, b) for a, b in pairs if (a["fails_at"] or math.inf) < (b["fails_at"] or math.inf)]
    more = [(a, b) for a, b in pairs if a["bits_copied"] < b["bits_copied"]]
    if len(later) == len(pairs) and len(more) == len(pairs):
        parts.append(
            "At this budget the N where copying fails grows with the state, and so do the bits that at least "
            "crossed it: a wider state copied longer lines."
        )
    else:
        flat = [f"{a['hidden']} → {b['hidden']} units" for a, b in pairs if (a, b) not in later or (a, b) not in more]
        parts.append(
            f"The failure point or the bits do not grow at every step in size ({', '.join(flat)}): at this "
            "budget the state's size alone does not order them (or both copy every N tried)."
        )
    parts.append(
        f"Budget: {s['steps']} steps of {s['batch_size']} examples per LSTM (N from 1 to {s['longest']}, mixed), "
        f"seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}; chance is {CHANCE:.0%}."
    )
    return " ".join(parts)
