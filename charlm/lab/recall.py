"""recall: multi-query associative recall, posed as Zoology's MQAR (Arora et al. 2023). A line holds P
key-value pairs (keys and values from disjoint alphabets of 26, none twice), then a random half of the keys,
each after a '?' in a random order, and the model must answer each one's value. Content-addressed memory:
attention can match the key asked against the earlier keys and read the value after it (a previous-token
head, then a matching head: two layers); an LSTM has to hold the pairs in its state.

A score means something only beside what no binding can reach: the values of a line are distinct, so a
model that knows every value shown and every answer given, but not which value stands beside the key
asked, answers the j-th question right with probability 1 / (P - j) at best (tasks.recall_no_binding;
answering by elimination). Every accuracy is printed beside that and beside chance (1 in 26).

Each family learns every P of the sweep at once (lines of each P, one a window, padded to the longest) and
is scored at each P on held-out lines: a Transformer and an LSTM of about its size, each at its own best
learning rate and steps from the same sweep (benchmarks/lab_tune.py), for each seed.
"""

from __future__ import annotations

from pathlib import Path

from charlm.lab import tasks
from charlm.lab.result import Chart, Clock, LabResult, params, pct, per_seed, seeds_of, span
from charlm.lab.sweep import sweep

DEFAULTS = dict(
    pairs=(2, 4, 8, 16),
    # each family's best learning rate in benchmarks/lab_tune.py (seed 3; lr 1e-3, 3e-3, 1e-2 x 500, 1000 steps),
    # and for both 1,500 steps: beyond the grid's best (1,000), as the step where the lookup circuit forms
    # varies with the seed (in seed 3 at no lr by step 500)
    steps={"transformer": 1500, "lstm": 1500},
    lr={"transformer": 3e-3, "lstm": 1e-2},
    decay={"transformer": False, "lstm": False},  # constant rates: a circuit that forms late still has the rate
    positions="learned",  # the Transformer's: one example a window, always from its start
    d_model=64,
    layers=2,
    heads=2,
    batch_size=64,
    train_chars=2_000_000,
    eval_examples=300,
)
QUICK = dict(
    pairs=(2, 4, 8),
    steps={"transformer": 600, "lstm": 600},
    train_chars=150_000,
    eval_examples=200,
)
CHANCE = 1 / len(tasks.VALUES)
GOOD = 0.95
BINDS = 0.1  # "binds pairs": at least this far above the no-binding baseline in every seed

CHART = Chart(
    "pairs", ("accuracy", "no_binding"), "model", "P (key-value pairs)", "accuracy (mean over seeds)"
)  # how its records are drawn


def baselines(pairs: int) -> dict:
    return {"no_binding": tasks.recall_no_binding(pairs), "chance": CHANCE}


def run(out: Path, seed: int = 0, seeds: int = 1, device: str = "cpu", progress=print, **settings) -> LabResult:
    s = {**DEFAULTS, **settings}
    clock = Clock()
    seed_list = seeds_of(seed, seeds)
    P = tuple(s["pairs"])
    context = tasks.example_length("recall", max(P)) + 1  # one whole line: its newline, the pairs, the questions
    records, runs = sweep(
        "recall", "pairs", P, P, s, context, out, seed_list, device, progress, pad=context - 1, beside=baselines
    )
    return LabResult(
        "recall",
        {**s, "pairs": list(P), "seeds": seed_list, "device": device},
        records,
        reading(records, s, seed_list),
        CHART,
        runs=list(runs.values()),
        seconds=clock(),
    )


def family_reading(label: str, records: list[dict], s: dict, kind: str, seeds: list[int]) -> str:
    """One family, P by P: every seed's accuracy against the no-binding baseline, then what that says: a seed
    more than BINDS above the baseline at a P binds pairs there (no strategy without binding can score that)."""
    K = len(seeds)
    records = sorted(records, key=lambda r: r["pairs"])
    each = [f"P={r['pairs']} {span(per_seed(r))} (no binding {pct(r['no_binding'])})" for r in records]
    above = {  # P -> the seeds whose model scored more than BINDS above the baseline there
        r["pairs"]: [seed for seed, v in zip(seeds, per_seed(r)) if v >= r["no_binding"] + BINDS] for r in records
    }
    budget = f"lr {s['lr'][kind]:g}, {s['steps'][kind]} steps"
    all_seeds = f"{K} of {K} seeds" if K > 1 else "the one seed"
    if all(len(found) == K for found in above.values()):
        verdict = f"above what no binding can reach at every P, in {all_seeds}: it looks the pairs up"
    elif not any(above.values()):
        verdict = (
            f"no more than {BINDS * 100:.0f} points above what no binding can reach at any P"
            f"{' in any seed' if K > 1 else ''}: no sign that it binds a single pair ({budget})"
        )
    else:
        where = "; ".join(
            f"P={P} in {len(found)} of {K} seed{'s' if K > 1 else ''}"
            + (f" ({', '.join(map(str, found))})" if len(found) < K else "")
            for P, found in above.items()
            if found
        )
        verdict = (
            f"more than {BINDS * 100:.0f} points above what no binding can reach, so binding some pairs, at {where}; "
            f"within {BINDS * 100:.0f} points of it everywhere else ({budget})"
        )
    good = [r["pairs"] for r in records if min(per_seed(r)) >= GOOD]
    top = f"; ≥ {GOOD:.0%} at P={', '.join(map(str, good))} in {all_seeds}" if good else ""
    return f"{label}: {'; '.join(each)} — {verdict}{top}."


def reading(records: list[dict], s: dict, seeds: list[int]) -> str:
    by = {kind: [r for r in records if r["model"] == kind] for kind in ("transformer", "lstm")}
    K = len(seeds)
    return " ".join(
        [
            f"Share of the answers right, {'the lowest-highest over seeds ' + ', '.join(map(str, seeds)) if K > 1 else 'seed ' + str(seeds[0])}, "
            f"beside the best that answering without binding a key to its value can do (by elimination among "
            f"the values not yet answered) and chance ({pct(CHANCE)}).",
            family_reading(
                f"The Transformer ({params(by['transformer'])} parameters)", by["transformer"], s, "transformer", seeds
            ),
            family_reading(f"The LSTM ({params(by['lstm'])})", by["lstm"], s, "lstm", seeds),
            f"Each model learned P = {', '.join(map(str, s['pairs']))} at once, {s['batch_size']} lines a step.",
        ]
    )
