"""recall: multi-query associative recall as Zoology poses it (MQAR, Arora et al. 2023). A line holds P key-value
pairs (keys and values from disjoint alphabets of 26, none twice), a '|', then every key once in a random order,
each followed by its value; the model reads a filler in place of each value (tasks.recall_example), so no
answer is ever an input and no answer tells it which values are left. Content-addressed memory: attention can
match the key asked against the earlier keys and read the value after it (a previous-token head, then a
matching head: two layers); an LSTM has to hold the pairs in its state.

A score means something only beside what no binding can reach: a model that knows the values of the line but
not which stands beside the key asked is right 1 time in P (tasks.recall_no_binding). Every accuracy is
printed beside that and beside chance (1 in 26), and beside the share of answers that are a value of the line
at all (what it learned without binding).

Each family learns every P of the sweep at once (lines of each P, one a window, padded to the longest), each at
its own learning rate (benchmarks/lab_tune.py), trained until its held-out accuracy stops rising (a check every
few hundred steps on held-out lines of its own; training.Plateau), with a cap; the table gives the steps and
CPU-seconds each used. It is then scored at each P on other held-out lines, for each seed.
"""

from __future__ import annotations

from pathlib import Path

from charlm.lab import tasks
from charlm.lab.result import Chart, Clock, LabResult, params, pct, per_seed, seeds_of, span
from charlm.lab.scoring import answers
from charlm.lab.sweep import sweep
from charlm.lab.training import Plateau

DEFAULTS = dict(
    pairs=(2, 4, 8, 16),
    # each family's learning rate from benchmarks/lab_tune.py (seed 3, constant rates), and each trained until
    # its held-out accuracy stops rising: checked every 250 steps, stopped when three checks in a row are not
    # a point above the best before them, at most `steps`
    steps={"transformer": 3000, "lstm": 8000},
    plateau={"transformer": Plateau(250, 3000), "lstm": Plateau(250, 8000)},
    lr={"transformer": 3e-3, "lstm": 1e-2},
    decay={"transformer": False, "lstm": False},  # constant rates: a pause changes nothing; a late circuit can form
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
    plateau={"transformer": Plateau(200, 600), "lstm": Plateau(200, 600)},
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


def measure(model, tokenizer, examples: list[tasks.Example]) -> dict:
    """The share of answers right, and the share that are a value of the line at all (right or not)."""
    said = answers(model, tokenizer, examples)
    right = shown = total = 0
    for e, a in zip(examples, said):
        truth = [e.text[t] for t in e.targets]
        right += sum(x == y for x, y in zip(a, truth))
        shown += sum(x in truth for x in a)
        total += len(truth)
    return {"accuracy": right / total, "shown": shown / total}


def run(out: Path, seed: int = 0, seeds: int = 1, device: str = "cpu", progress=print, **settings) -> LabResult:
    s = {**DEFAULTS, **settings}
    clock = Clock()
    seed_list = seeds_of(seed, seeds)
    P = tuple(s["pairs"])
    context = tasks.example_length("recall", max(P)) + 1  # one whole line: its newline, the pairs, the questions
    records, runs = sweep(
        "recall",
        "pairs",
        P,
        P,
        s,
        context,
        out,
        seed_list,
        device,
        progress,
        pad=context - 1,
        beside=baselines,
        measure=measure,
    )
    return LabResult(
        "recall",
        {**s, "pairs": list(P), "seeds": seed_list, "device": device, "plateau": plateau_settings(s)},
        records,
        reading(records, s, seed_list),
        CHART,
        runs=list(runs.values()),
        seconds=clock(),
    )


def plateau_settings(s: dict) -> dict:
    return {kind: vars(rule) for kind, rule in (s.get("plateau") or {}).items()}


def budget(records: list[dict], s: dict, kind: str) -> str:
    """What a family was trained with: the rule, the steps each seed took and the CPU-seconds."""
    r = records[0]
    steps = r["steps_per_seed"]
    rule = (s.get("plateau") or {}).get(kind)
    each = f"{min(steps):,}-{max(steps):,}" if min(steps) != max(steps) else f"{steps[0]:,}"
    if rule is None:
        return f"lr {s['lr'][kind]:g}, {each} steps, {r['cpu_seconds']:.0f} CPU-s a seed"
    cap = rule["cap"] if isinstance(rule, dict) else rule.cap  # (a dict: a result read back from --json)
    capped = sum(n >= cap for n in steps)
    stop = (
        f"at the cap ({cap:,}) in {capped} of {len(steps)} seeds: no plateau claimed"
        if capped
        else "every seed stopped where its held-out accuracy stopped rising"
    )
    return f"lr {s['lr'][kind]:g}, {each} steps ({stop}), {r['cpu_seconds']:.0f} CPU-s a seed"


def family_reading(label: str, records: list[dict], s: dict, kind: str, seeds: list[int]) -> str:
    """One family, P by P: every seed's accuracy against the no-binding baseline, then what that says: a seed
    more than BINDS above the baseline at a P binds pairs there (no strategy without binding can score that)."""
    K = len(seeds)
    records = sorted(records, key=lambda r: r["pairs"])
    each = [f"P={r['pairs']} {span(per_seed(r))} (no binding {pct(r['no_binding'])})" for r in records]
    above = {  # P -> the seeds whose model scored more than BINDS above the baseline there
        r["pairs"]: [seed for seed, v in zip(seeds, per_seed(r)) if v >= r["no_binding"] + BINDS] for r in records
    }
    spent = budget(records, s, kind)
    shown = min(r.get("shown_lowest", r.get("shown", 1.0)) for r in records)
    all_seeds = f"{K} of {K} seeds" if K > 1 else "the one seed"
    if all(len(found) == K for found in above.values()):
        verdict = f"above what no binding can reach at every P, in {all_seeds}: it looks the pairs up ({spent})"
    elif not any(above.values()):
        verdict = (
            f"no more than {BINDS * 100:.0f} points above what no binding can reach at any P"
            f"{' in any seed' if K > 1 else ''}: no sign that it binds a single pair ({spent})"
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
            f"within {BINDS * 100:.0f} points of it everywhere else ({spent})"
        )
    good = [r["pairs"] for r in records if min(per_seed(r)) >= GOOD]
    top = f"; ≥ {GOOD:.0%} at P={', '.join(map(str, good))} in {all_seeds}" if good else ""
    values = (
        "; it answers with a value of the line every time"
        if shown >= 0.9995
        else f"; it answers with a value of the line at least {pct(shown)} of the time"
    )
    return f"{label}: {'; '.join(each)} — {verdict}{top}{values}."


def reading(records: list[dict], s: dict, seeds: list[int]) -> str:
    by = {kind: [r for r in records if r["model"] == kind] for kind in ("transformer", "lstm")}
    K = len(seeds)
    return " ".join(
        [
            f"Share of the answers right, {'the lowest-highest over seeds ' + ', '.join(map(str, seeds)) if K > 1 else 'seed ' + str(seeds[0])}, "
            f"beside the best that answering without binding a key to its value can do (1 in P: any value of the "
            f"line) and chance ({pct(CHANCE)}); every key is asked and no answer is read back.",
            family_reading(
                f"The Transformer ({params(by['transformer'])} parameters)", by["transformer"], s, "transformer", seeds
            ),
            family_reading(f"The LSTM ({params(by['lstm'])})", by["lstm"], s, "lstm", seeds),
            f"Each model learned P = {', '.join(map(str, s['pairs']))} at once, {s['batch_size']} lines a step.",
        ]
    )
