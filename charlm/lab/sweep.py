"""The sweep copy and recall share: one model per family and seed learns every size of a task at once, each family
at its own best learning rate and steps, and is scored at every size tested.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from charlm.lab import tasks
from charlm.lab.result import record, spread
from charlm.lab.scoring import accuracy
from charlm.lab.training import (
    PYTORCH_INIT,
    Plateau,
    fit_to_plateau,
    lab_model,
    lab_train_config,
    lab_trainer,
    load_run,
)
from charlm.models import config_params

FAMILIES = ("transformer", "lstm")


def sweep(
    task: str,
    key: str,
    trained: tuple[int, ...],
    tested: tuple[int, ...],
    s: dict,
    context: int,
    out: Path,
    seeds: list[int],
    device: str,
    progress,
    pad: int | None = None,
    beside=lambda size: {},
    measure=None,
) -> tuple[list[dict], dict]:
    """Train a Transformer (settings s) and an LSTM of about its size, each family at its own learning rate, steps
    and schedule (s["lr"][family], s["steps"][family], s["decay"][family]: the best of the same sweep for each,
    benchmarks/lab_tune.py),
    one model per family and seed that learns every size of `trained` at once (lines of each size mixed:
    padded with newlines to `pad` characters, one line a window, or packed one after another), and score it
    at every size of `tested` (a record names it `key`) on held-out lines (tasks.examples: never a training line). beside(size): the
    baselines a record shows beside its accuracy. s["plateau"] (a training.Plateau for each family), where given:
    each family trains until its held-out accuracy stops rising, s["steps"] its cap. measure(model, tokenizer,
    examples) -> {"accuracy": ..., other scores}: what is scored (default: the accuracy alone); a record holds
    the accuracy over seeds (result.spread) and each other score's mean and lowest. Returns (one record per family and tested size, over the
    seeds; run directory by (family, seed))."""
    measure = measure or (lambda model, tokenizer, examples: {"accuracy": accuracy(model, tokenizer, examples)})
    scores: dict[tuple[str, int], list[dict]] = {}
    seconds: dict[str, list[float]] = {}
    used: dict[str, list[int]] = {}
    configs, runs = {}, {}
    for k, kind in enumerate(FAMILIES, 1):
        cfg = configs[kind] = lab_model(task, s, context, kind)
        steps, lr = s["steps"][kind], s["lr"][kind]
        rule: Plateau | None = (s.get("plateau") or {}).get(kind)
        for seed in seeds:
            name = f"{task}-{kind}-s{seed}"
            budget = f"until it stops rising, at most {steps} steps" if rule else f"{steps} steps"
            progress(f"training {name} ({k}/{len(FAMILIES)}, seed {seed}, {config_params(cfg):,} parameters, {budget})")
            t0 = time.process_time()  # CPU-seconds of this process: the lab runs one thread
            data = tasks.corpus(task, tuple(trained), s["train_chars"], seed + max(trained), pad=pad, heldout=True)
            # the reference's optimizer: AdamW, betas (0.9, 0.95), from the first step a constant rate or (decay)
            # a cosine decay to a tenth of it
            train_cfg = lab_train_config(
                steps, seed, device, s["batch_size"], lr, constant_lr=not s["decay"][kind], beta2=0.95, warmup=0
            )
            trainer = lab_trainer(data, out / name, cfg, train_cfg, PYTORCH_INIT)
            if rule:  # held-out lines of their own, never the test lines
                check = [tasks.examples(task, n, s["eval_examples"] // 2, seed + 30_000 + n) for n in trained]
                used.setdefault(kind, []).append(fit_to_plateau(trainer, check, rule)[0])
            else:
                trainer.fit()
                used.setdefault(kind, []).append(steps)
            ck = load_run(out / name)
            for n in tested:
                examples = tasks.examples(task, n, s["eval_examples"], seed + 10_000 + n)
                scores.setdefault((kind, n), []).append(measure(ck.model, ck.tokenizer, examples))
            seconds.setdefault(kind, []).append(time.process_time() - t0)
            runs[(kind, seed)] = str(out / name)
    records = []
    for n in tested:
        for kind in FAMILIES:
            each = scores[(kind, n)]
            values = spread([m["accuracy"] for m in each])
            others = {}
            for key_ in each[0]:
                if key_ != "accuracy":
                    others[key_] = statistics.fmean(m[key_] for m in each)
                    others[f"{key_}_lowest"] = min(m[key_] for m in each)
            records.append(
                record(
                    model=kind,
                    **{key: n},
                    **({"trained": n in trained} if set(tested) - set(trained) else {}),
                    accuracy=values.pop("accuracy"),
                    **beside(n),
                    **values,
                    **others,
                    params=config_params(configs[kind]),
                    steps=statistics.fmean(used[kind]),
                    steps_per_seed=used[kind],
                    cpu_seconds=statistics.fmean(seconds[kind]),
                )
            )
    return records, runs
