"""width: Zoology's recall against model width, both families. LSTMs of several widths and 2-layer Transformers of
several widths each learn recall for every P of the sweep at once (as `charlm lab recall` poses it: every key
asked, a filler read in place of each answer) and are scored at each P on held-out lines. Zoology's finding is
that the state a recurrent model needs grows with the number of pairs while attention's does not; here each
width's accuracy is read against P: where it stops answering (below HOLDS), and whether that point moves with
the width.

Each model trains until its held-out accuracy stops rising (training.Plateau), with a cap; a model stopped by its
cap is said so, and no break point is read from it as a limit (it may still have been climbing).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from charlm.config import ModelConfig
from charlm.lab import tasks
from charlm.lab.recall import CHANCE, measure
from charlm.lab.result import Chart, Clock, LabResult, pct, record, seeds_of
from charlm.lab.training import PYTORCH_INIT, Plateau, fit_to_plateau, lab_train_config, lab_trainer, load_run
from charlm.models import config_params

DEFAULTS = dict(
    pairs=(2, 4, 8, 16),
    widths={"lstm": (16, 64, 256), "transformer": (16, 32, 64)},
    lr={"transformer": 3e-3, "lstm": 1e-2},  # each family's rate in `lab recall`
    plateau={"transformer": Plateau(250, 2000), "lstm": Plateau(250, 2500)},
    layers=2,  # the Transformer's (heads of 8 dimensions at width 16, 2 heads)
    heads=2,
    batch_size=64,
    train_chars=1_000_000,
    eval_examples=200,
)
QUICK = dict(
    pairs=(2, 4),
    widths={"lstm": (8, 32), "transformer": (16,)},
    plateau={"transformer": Plateau(100, 200), "lstm": Plateau(100, 200)},
    train_chars=60_000,
    eval_examples=60,
)
HOLDS = 0.9  # a width "answers" at P when at least this share of the answers is right

CHART = Chart("pairs", "accuracy", "line", "P (key-value pairs)", "accuracy (mean over seeds)", xlog=True)


def model_config(kind: str, width: int, context: int, s: dict) -> ModelConfig:
    vocab = tasks.vocab_size("recall")
    if kind == "lstm":
        return ModelConfig(kind="lstm", vocab_size=vocab, n_layers=1, d_model=width, context=context)
    return ModelConfig(
        kind="transformer",
        vocab_size=vocab,
        n_layers=s["layers"],
        d_model=width,
        n_heads=s["heads"],
        context=context,
        positions="learned",
        tied=False,
    )


def run(out: Path, seed: int = 0, seeds: int = 1, device: str = "cpu", progress=print, **settings) -> LabResult:
    s = {**DEFAULTS, **settings}
    clock = Clock()
    seed_list = seeds_of(seed, seeds)
    P = tuple(s["pairs"])
    context = tasks.example_length("recall", max(P)) + 1
    raw: dict[tuple[str, int], list[dict]] = {}
    runs = []
    for seed_ in seed_list:
        data = tasks.corpus("recall", P, s["train_chars"], seed_ + max(P), pad=context - 1, heldout=True)
        check = [tasks.examples("recall", p, s["eval_examples"] // 2, seed_ + 30_000 + p) for p in P]
        fresh = {p: tasks.examples("recall", p, s["eval_examples"], seed_ + 10_000 + p) for p in P}
        for kind in ("transformer", "lstm"):
            rule: Plateau = s["plateau"][kind]
            for width in s["widths"][kind]:
                name = f"width-{kind}-w{width}-s{seed_}"
                cfg = model_config(kind, width, context, s)
                progress(f"training {name} ({config_params(cfg):,} parameters, at most {rule.cap} steps)")
                t0 = time.process_time()
                train_cfg = lab_train_config(
                    rule.cap, seed_, device, s["batch_size"], s["lr"][kind], constant_lr=True, beta2=0.95, warmup=0
                )
                trainer = lab_trainer(data, out / name, cfg, train_cfg, PYTORCH_INIT)
                steps, _ = fit_to_plateau(trainer, check, rule)
                ck = load_run(out / name)
                scores = {p: measure(ck.model, ck.tokenizer, ex)["accuracy"] for p, ex in fresh.items()}
                raw.setdefault((kind, width), []).append(
                    dict(scores=scores, steps=steps, capped=steps >= rule.cap, cpu=time.process_time() - t0)
                )
                runs.append(str(out / name))
    records = [
        record(
            line=f"{kind} {width}",  # one line of the chart a model
            model=kind,
            width=width,
            pairs=p,
            accuracy=statistics.fmean(r["scores"][p] for r in rows),
            lowest=min(r["scores"][p] for r in rows),
            per_seed=[round(r["scores"][p], 4) for r in rows],
            no_binding=1 / p,
            chance=CHANCE,
            params=config_params(model_config(kind, width, context, s)),
            steps_per_seed=[r["steps"] for r in rows],
            capped=sum(r["capped"] for r in rows),
            cpu_seconds=statistics.fmean(r["cpu"] for r in rows),
        )
        for (kind, width), rows in raw.items()
        for p in P
    ]
    return LabResult(
        "width",
        {
            **s,
            "pairs": list(P),
            "widths": {k: list(v) for k, v in s["widths"].items()},
            "plateau": {k: vars(v) for k, v in s["plateau"].items()},
            "seeds": seed_list,
            "device": device,
        },
        records,
        reading(records, s, seed_list),
        CHART,
        runs=runs,
        seconds=clock(),
    )


def holds_up_to(rows: list[dict]) -> int:
    """The largest P up to which every seed answers at least HOLDS at every P (0: not even the smallest)."""
    held = 0
    for r in sorted(rows, key=lambda r: r["pairs"]):
        if r["lowest"] < HOLDS:
            break
        held = r["pairs"]
    return held


def reading(records: list[dict], s: dict, seeds: list[int]) -> str:
    K = len(seeds)
    parts = [
        f"Recall accuracy against P for each width (seed{'s' if K > 1 else ''} {', '.join(map(str, seeds))}; "
        f"no binding reaches 1/P, chance {pct(CHANCE)}); a width 'answers' at P when every seed gets "
        f"≥ {HOLDS:.0%} there."
    ]
    for kind, label in (("transformer", "Transformer (2 layers)"), ("lstm", "LSTM (1 layer)")):
        held = {}
        for width in s["widths"][kind]:
            rows = [r for r in records if r["model"] == kind and r["width"] == width]
            held[width] = holds_up_to(rows)
            each = ", ".join(f"P={r['pairs']} {pct(r['accuracy'])}" for r in sorted(rows, key=lambda r: r["pairs"]))
            steps = rows[0]["steps_per_seed"]
            cap = f", at its cap ({max(steps):,} steps) in {rows[0]['capped']} of {K}" if rows[0]["capped"] else ""
            span_ = f"{min(steps):,}" if min(steps) == max(steps) else f"{min(steps):,}-{max(steps):,}"
            parts.append(
                f"{label} width {width} ({rows[0]['params']:,} parameters; {span_} steps{cap}, "
                f"{rows[0]['cpu_seconds']:.0f} CPU-s): {each}; answers up to "
                f"{'P=' + str(held[width]) if held[width] else 'no P'}."
            )
        capped = any(r["capped"] for r in records if r["model"] == kind)
        widths = list(held)
        name = label.split(" ")[0]
        if set(held.values()) == {0}:
            what = f"the {name} answers at no P at any width here"
        elif len(set(held.values())) == 1:
            what = (
                f"the {name}'s break does not move with width here (answers up to P={held[widths[0]]} at every width)"
            )
        elif all(held[a] <= held[b] for a, b in zip(widths, widths[1:])):
            what = f"the {name}'s break moves to larger P as it widens ({', '.join(f'{w}: {held[w]}' for w in widths)})"
        else:
            what = (
                f"the {name}'s break does not grow steadily with width ({', '.join(f'{w}: {held[w]}' for w in widths)})"
            )
        parts.append(
            what[0].upper()
            + what[1:]
            + (
                "; some widths stopped at their cap, so these are what this budget taught, not limits."
                if capped
                else "; every model stopped where its held-out accuracy stopped rising."
            )
        )
    return " ".join(parts)
