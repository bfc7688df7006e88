"""The sweep copy and recall share: one model per family and seed learns every size of a task at once, each family
at its own best learning rate and steps, and is scored at every size tested.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from charlm.lab import tasks
from charlm.lab.result import Clock, record, spread
from charlm.lab.scoring import accuracy
from charlm.lab.training import PYTORCH_INIT, lab_model, lab_train_config, load_run, train_model
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
) -> tuple[list[dict], dict]:
    """Train a Transformer (settings s) and an LSTM of about its size, each family at its own learning rate, steps
    and schedule (s["lr"][family], s["steps"][family], s["decay"][family]: the best of the same sweep for each,
    benchmarks/lab_tune.py),
    one model per family and seed that learns every size of `trained` at once (lines of each size mixed:
    padded with newlines to `pad` characters, one line a window, or packed one after another), and score it
    at every size of `tested` (a record names it `key`) on held-out lines (tasks.examples: never a training line). beside(size): the
    baselines a record shows beside its accuracy. Returns (one record per family and tested size, over the
    seeds; run directory by (family, seed))."""
    scores: dict[tuple[str, int], list[float]] = {}
    seconds: dict[str, list[float]] = {}
    configs, runs = {}, {}
    clock = Clock()
    for k, kind in enumerate(FAMILIES, 1):
        cfg = configs[kind] = lab_model(task, s, context, kind)
        steps, lr = s["steps"][kind], s["lr"][kind]
        for seed in seeds:
            name = f"{task}-{kind}-s{seed}"
            progress(
                f"training {name} ({k}/{len(FAMILIES)}, seed {seed}, {config_params(cfg):,} parameters, {steps} steps)"
            )
            t0 = clock()
            data = tasks.corpus(task, tuple(trained), s["train_chars"], seed + max(trained), pad=pad, heldout=True)
            # the reference's optimizer: AdamW, betas (0.9, 0.95), from the first step a constant rate or (decay)
            # a cosine decay to a tenth of it
            train_cfg = lab_train_config(
                steps, seed, device, s["batch_size"], lr, constant_lr=not s["decay"][kind], beta2=0.95, warmup=0
            )
            ck = load_run(train_model(data, out / name, cfg, train_cfg, PYTORCH_INIT))
            for n in tested:
                examples = tasks.examples(task, n, s["eval_examples"], seed + 10_000 + n)
                scores.setdefault((kind, n), []).append(accuracy(ck.model, ck.tokenizer, examples))
            seconds.setdefault(kind, []).append(clock() - t0)
            runs[(kind, seed)] = str(out / name)
    records = []
    for n in tested:
        for kind in FAMILIES:
            values = spread(scores[(kind, n)])
            records.append(
                record(
                    model=kind,
                    **{key: n},
                    **({"trained": n in trained} if set(tested) - set(trained) else {}),
                    accuracy=values.pop("accuracy"),
                    **beside(n),
                    **values,
                    params=config_params(configs[kind]),
                    train_seconds=statistics.fmean(seconds[kind]),
                )
            )
    return records, runs
