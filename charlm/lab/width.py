"""width: memory against model width, both families. LSTMs of several widths and 2-layer Transformers of several
widths each learn a task for every size of its sweep at once and are scored at each size on held-out lines:

  recall (default)  Zoology's recall as `charlm lab recall` poses it (every key asked, a filler read in place of
                    each answer), scored at each P beside what no binding can reach (1/P) and chance
  copy (--task copy)  copy as `charlm lab capacity` poses it (every N from 1 to the longest, mixed, lines packed
                    one after another), scored at each N beside chance (1 in 10), which is also the best any
                    shortcut reaches: the symbols are drawn independently, so without the first half nothing
                    predicts the copy; the Transformer at two widths is the reference

Zoology's finding is that the state a recurrent model needs grows with the number of pairs while attention's
does not; here each width's accuracy is read against the size: where it stops answering (below HOLDS), and
whether that point moves with the width.

Each model trains until its held-out accuracy stops rising (training.Plateau), with a cap; a model stopped by its
cap is said so, and no break point is read from it as a limit (it may still have been climbing).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from charlm.config import ModelConfig
from charlm.errors import ConfigError
from charlm.lab import tasks
from charlm.lab.recall import CHANCE, measure
from charlm.lab.result import Chart, Clock, LabResult, pct, record, seeds_of
from charlm.lab.scoring import accuracy
from charlm.lab.training import PYTORCH_INIT, Plateau, fit_to_plateau, lab_train_config, lab_trainer, load_run
from charlm.models import config_params

DEFAULTS = dict(
    pairs=(2, 4, 8, 16),
    widths={"lstm": (16, 64, 256), "transformer": (16, 32, 64)},
    lr={"transformer": 3e-3, "lstm": 1e-2},  # each family's rate in `lab recall` (and in `lab copy`)
    plateau={"transformer": Plateau(250, 2000), "lstm": Plateau(250, 2500)},
    layers=2,  # the Transformer's (heads of 8 dimensions at width 16, 2 heads)
    heads=2,
    positions="learned",  # the Transformer's: recall's (one example a window, always from its start)
    batch_size=64,
    train_chars=1_000_000,
    eval_examples=200,
)
COPY = dict(  # --task copy: what differs from recall's settings (sized so that one seed is ~10 CPU-minutes)
    lengths=(2, 4, 8, 16, 32),  # N scored; every N from 1 to the longest is trained, mixed
    widths={"lstm": (16, 32, 64, 128, 256), "transformer": (32, 64)},
    plateau={"transformer": Plateau(250, 2000), "lstm": Plateau(250, 3000)},
    positions="rope",  # lab copy's: lines packed, so the symbol to copy stands at no fixed position
    batch_size=32,
    train_chars=400_000,
)
QUICK = dict(
    pairs=(2, 4),
    lengths=(2, 4, 8),
    widths={"lstm": (8, 32), "transformer": (16,)},
    plateau={"transformer": Plateau(100, 200), "lstm": Plateau(100, 200)},
    train_chars=60_000,
    eval_examples=60,
)
HOLDS = 0.9  # a width "answers" at a size when at least this share of the answers is right
COPY_CHANCE = 1 / len(tasks.SYMBOLS)


@dataclass(frozen=True)
class Sweep:
    """What width measures for one task: the size its records name, the baseline beside every score."""

    size: str  # the records' key for the size: "pairs" or "length"
    label: str  # how a reading names a size ("P", "N")
    baseline: str  # the record's key for the best score without the memory asked for
    baseline_of: object  # size -> that score
    chance: float
    chart: Chart


SWEEPS = {
    "recall": Sweep(
        "pairs",
        "P",
        "no_binding",
        tasks.recall_no_binding,
        CHANCE,
        Chart("pairs", "accuracy", "line", "P (key-value pairs)", "accuracy (mean over seeds)", xlog=True),
    ),
    "copy": Sweep(
        "length",
        "N",
        "shortcut",
        lambda n: COPY_CHANCE,  # no shortcut beats chance: the symbols are independent
        COPY_CHANCE,
        Chart("length", "accuracy", "line", "N (symbols to copy)", "accuracy (mean over seeds)", xlog=True),
    ),
}
CHART = SWEEPS["recall"].chart


def model_config(kind: str, width: int, context: int, s: dict, task: str = "recall") -> ModelConfig:
    vocab = tasks.vocab_size(task)
    if kind == "lstm":
        return ModelConfig(kind="lstm", vocab_size=vocab, n_layers=1, d_model=width, context=context)
    return ModelConfig(
        kind="transformer",
        vocab_size=vocab,
        n_layers=s["layers"],
        d_model=width,
        n_heads=s["heads"],
        context=context,
        positions=s["positions"],
        tied=False,
    )


def _task(task: str, s: dict, seed: int):
    """(sizes, context, training text, sets of held-out lines for the plateau's checks, test lines by size, score)
    for one seed."""
    if task == "recall":
        sizes = tuple(s["pairs"])
        context = tasks.example_length("recall", max(sizes)) + 1
        data = tasks.corpus("recall", sizes, s["train_chars"], seed + max(sizes), pad=context - 1, heldout=True)
        score = lambda model, tok, ex: measure(model, tok, ex)["accuracy"]  # noqa: E731
    else:
        sizes = tuple(s["lengths"])
        context = tasks.example_length("copy", max(sizes)) + 1
        trained = tuple(range(1, max(sizes) + 1))
        data = tasks.corpus("copy", trained, s["train_chars"], seed + max(sizes), heldout=True)
        score = accuracy
    check = [tasks.examples(task, n, s["eval_examples"] // 2, seed + 30_000 + n) for n in sizes]
    fresh = {n: tasks.examples(task, n, s["eval_examples"], seed + 10_000 + n) for n in sizes}
    return sizes, context, data, check, fresh, score


def run(
    out: Path, seed: int = 0, seeds: int = 1, device: str = "cpu", progress=print, task: str = "recall", **settings
) -> LabResult:
    if task not in SWEEPS:
        raise ConfigError(f"lab width measures {' or '.join(SWEEPS)}, not {task!r}: choose --task {'/'.join(SWEEPS)}")
    sweep = SWEEPS[task]
    s = {**DEFAULTS, **(COPY if task == "copy" else {}), **settings}
    clock = Clock()
    seed_list = seeds_of(seed, seeds)
    raw: dict[tuple[str, int], list[dict]] = {}
    runs = []
    for seed_ in seed_list:
        sizes, context, data, check, fresh, score = _task(task, s, seed_)
        for kind in ("transformer", "lstm"):
            rule: Plateau = s["plateau"][kind]
            for width in s["widths"][kind]:
                name = f"width-{'' if task == 'recall' else task + '-'}{kind}-w{width}-s{seed_}"
                cfg = model_config(kind, width, context, s, task)
                progress(f"training {name} ({config_params(cfg):,} parameters, at most {rule.cap} steps)")
                t0 = time.process_time()
                train_cfg = lab_train_config(
                    rule.cap, seed_, device, s["batch_size"], s["lr"][kind], constant_lr=True, beta2=0.95, warmup=0
                )
                trainer = lab_trainer(data, out / name, cfg, train_cfg, PYTORCH_INIT)
                steps, _ = fit_to_plateau(trainer, check, rule)
                ck = load_run(out / name)
                scores = {n: score(ck.model, ck.tokenizer, ex) for n, ex in fresh.items()}
                raw.setdefault((kind, width), []).append(
                    dict(scores=scores, steps=steps, capped=steps >= rule.cap, cpu=time.process_time() - t0)
                )
                runs.append(str(out / name))
    records = [
        record(
            line=f"{kind} {width}",  # one line of the chart a model
            model=kind,
            width=width,
            **{sweep.size: n},
            accuracy=statistics.fmean(r["scores"][n] for r in rows),
            lowest=min(r["scores"][n] for r in rows),
            per_seed=[round(r["scores"][n], 4) for r in rows],
            **{sweep.baseline: sweep.baseline_of(n)},
            chance=sweep.chance,
            params=config_params(model_config(kind, width, context, s, task)),
            steps_per_seed=[r["steps"] for r in rows],
            capped=sum(r["capped"] for r in rows),
            cpu_seconds=statistics.fmean(r["cpu"] for r in rows),
        )
        for (kind, width), rows in raw.items()
        for n in sizes
    ]
    other = "lengths" if task == "recall" else "pairs"  # the other task's sizes: not this run's settings
    return LabResult(
        "width",
        {
            **{k: v for k, v in s.items() if k != other},
            "task": task,
            ("pairs" if task == "recall" else "lengths"): list(sizes),
            "widths": {k: list(v) for k, v in s["widths"].items()},
            "plateau": {k: vars(v) for k, v in s["plateau"].items()},
            "seeds": seed_list,
            "device": device,
        },
        records,
        reading(records, s, seed_list, task),
        sweep.chart,
        runs=runs,
        seconds=clock(),
    )


def holds_up_to(rows: list[dict], size: str = "pairs") -> int:
    """The largest size up to which every seed answers at least HOLDS at every size (0: not even the smallest)."""
    held = 0
    for r in sorted(rows, key=lambda r: r[size]):
        if r["lowest"] < HOLDS:
            break
        held = r[size]
    return held


def reading(records: list[dict], s: dict, seeds: list[int], task: str = "recall") -> str:
    K = len(seeds)
    sweep = SWEEPS[task]
    X = sweep.label
    beside = (
        f"no binding reaches 1/P, chance {pct(CHANCE)}"
        if task == "recall"
        else f"chance {pct(COPY_CHANCE)}, which no shortcut beats: the symbols are independent"
    )
    parts = [
        f"{'Recall' if task == 'recall' else 'Copy'} accuracy against {X} for each width "
        f"(seed{'s' if K > 1 else ''} {', '.join(map(str, seeds))}; {beside}); a width 'answers' at {X} when every "
        f"seed gets ≥ {HOLDS:.0%} there."
    ]
    for kind, label in (("transformer", "Transformer (2 layers)"), ("lstm", "LSTM (1 layer)")):
        held = {}
        for width in s["widths"][kind]:
            rows = sorted(
                (r for r in records if r["model"] == kind and r["width"] == width), key=lambda r: r[sweep.size]
            )
            held[width] = holds_up_to(rows, sweep.size)
            each = ", ".join(f"{X}={r[sweep.size]} {pct(r['accuracy'])}" for r in rows)
            steps = rows[0]["steps_per_seed"]
            cap = f", at its cap ({max(steps):,} steps) in {rows[0]['capped']} of {K}" if rows[0]["capped"] else ""
            span_ = f"{min(steps):,}" if min(steps) == max(steps) else f"{min(steps):,}-{max(steps):,}"
            parts.append(
                f"{label} width {width} ({rows[0]['params']:,} parameters; {span_} steps{cap}, "
                f"{rows[0]['cpu_seconds']:.0f} CPU-s): {each}; answers up to "
                f"{X + '=' + str(held[width]) if held[width] else 'no ' + X}."
            )
        capped = [w for w in held if any(r["capped"] for r in records if r["model"] == kind and r["width"] == w)]
        widths = list(held)
        name = label.split(" ")[0]
        if set(held.values()) == {0}:
            what = f"the {name} answers at no {X} at any width here"
        elif len(held) == 1:
            what = f"the {name} answers up to {X}={held[widths[0]]} here"
        elif len(set(held.values())) == 1:
            what = (
                f"the {name}'s break does not move with width here (answers up to {X}={held[widths[0]]} at every width)"
            )
        elif all(held[a] <= held[b] for a, b in zip(widths, widths[1:])):
            what = (
                f"the {name}'s break moves to larger {X} as it widens ({', '.join(f'{w}: {held[w]}' for w in widths)})"
            )
        else:
            what = (
                f"the {name}'s break does not grow steadily with width ({', '.join(f'{w}: {held[w]}' for w in widths)})"
            )
        parts.append(what[0].upper() + what[1:] + _stopped(capped, len(held)))
    return " ".join(parts)


def _stopped(capped: list[int], widths: int) -> str:
    """Whether the breaks read are limits (every model on its plateau) or what the step budget taught (the widths
    that stopped at their cap)."""
    if not capped:
        return "; every model stopped where its held-out accuracy stopped rising."
    if len(capped) == widths:
        return "; every width stopped at its cap, so these are what this budget taught, not limits."
    one = len(capped) == 1
    return (
        f"; width{'' if one else 's'} {', '.join(map(str, capped))} stopped at the cap, so {'its' if one else 'their'}"
        " break is what this budget taught, not a limit; the others stopped where their held-out accuracy stopped"
        " rising."
    )
