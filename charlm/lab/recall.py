"""recall: multi-query associative recall. P key-value pairs (distinct keys), then every key once more
after a '?', in a new order; the model must answer each one's value. Content-addressed memory: attention
can match the key against the earlier keys and read the value after it (an induction-style circuit: a
previous-token head, then a matching head: two layers); an LSTM must hold all P pairs in its state.

As in Zoology (Arora et al. 2023), each model learns every P of the sweep at once -- examples of each P, one
a row, padded to the longest -- and is scored at each P on fresh examples: a Transformer and a same-size
LSTM, the same budget, for each seed. Trained on one P alone, the Transformer needs far longer to form its
lookup circuit as P grows (at P=16, none in 1,500 steps); the small P of the mixture let it form early, and
the same circuit then answers 16 pairs (benchmarks/RESULTS.md, Lab).

Every key being asked leaves a shortcut: the last answers can be found by elimination (the values not yet
given). A model that learned only that sits near 45% at P=8; the lookup circuit takes it to 100%.
"""

from __future__ import annotations

from pathlib import Path

from charlm.lab import tasks
from charlm.lab.common import Chart, Clock, LabResult, family_reading, params, seeds_of, sweep, verdict

DEFAULTS = dict(
    pairs=(2, 4, 8, 16),
    steps=1500,
    d_model=64,
    layers=2,
    heads=2,
    batch_size=64,
    lr=3e-3,
    train_chars=3_000_000,
    eval_examples=300,
)
QUICK = dict(pairs=(2, 4), steps=700, train_chars=150_000, eval_examples=200)
CHANCE = 1 / len(tasks.VALUES)
GOOD = 0.95
NEAR_CHANCE = 0.2


def context_for(pairs: int) -> int:
    return 5 * pairs + 1  # one whole example: its newline, 2P characters of pairs, 3P of questions


def run(out: Path, seed: int = 0, seeds: int = 1, device: str = "cpu", progress=print, **settings) -> LabResult:
    s = {**DEFAULTS, **settings}
    clock = Clock()
    seed_list = seeds_of(seed, seeds)
    records, runs = sweep("recall", s["pairs"], s, context_for, out, seed_list, device, progress, mixed=True)
    return LabResult(
        "recall",
        {**s, "pairs": list(s["pairs"]), "seeds": seed_list, "device": device},
        records,
        reading(records, s, seed_list),
        Chart("pairs", "accuracy", "model", "P (key-value pairs)", "accuracy (mean over seeds)"),
        runs=list(dict.fromkeys(runs.values())),  # one model learned every P
        seconds=clock(),
    )


def reading(records: list[dict], s: dict, seeds: list[int]) -> str:
    by = {kind: [r for r in records if r["model"] == kind] for kind in ("transformer", "lstm")}
    budget = (
        f"{s['steps']} steps of {s['batch_size']} examples per model, each model learning P = "
        f"{', '.join(map(str, s['pairs']))} at once, seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}"
    )
    return " ".join(
        [
            f"Share of the answers right (guessing gives {CHANCE:.0%}).",
            family_reading(
                f"The Transformer ({params(by['transformer'])} parameters)",
                by["transformer"],
                "pairs",
                GOOD,
                NEAR_CHANCE,
            ),
            family_reading(f"The LSTM ({params(by['lstm'])})", by["lstm"], "pairs", GOOD, NEAR_CHANCE),
            verdict(
                records,
                "pairs",
                budget,
                "as expected of content-addressed lookup: the LSTM's state must hold every pair",
            ),
        ]
    )
