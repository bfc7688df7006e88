"""The same tuning effort for each family: the learning-rate × steps grid behind the defaults of `charlm lab
copy` and `charlm lab recall`. For each task, family and learning rate one model trains with the lab's own
recipe (charlm.lab.training: model, trainer; tasks: held-out lines; a constant rate, so the model at step s of
the longest run is the model a run of s steps gives; --decay: a cosine decay, one run per step count) and is
scored at every step count of the grid. Each family's default learning rate is its best cell's (the highest
mean accuracy over the sizes). The grid runs past the budgets where either family still sits on a baseline:
recall's (Zoology's format) to 8,000 steps, where `charlm lab recall` caps the LSTM (each family then trains
until its held-out accuracy stops rising: training.Plateau); copy's to 2,000.
benchmarks/RESULTS.md ("Lab") has the table.

    python benchmarks/lab_tune.py recall --seed 3 --steps 500,1000,2000,4000,8000
    python benchmarks/lab_tune.py copy --seed 3 --lrs 1e-3,3e-3,1e-2 --steps 500,1000,2000
    python benchmarks/lab_tune.py copy --seed 101 --lrs 3e-3,1e-2 --steps 1500 --decay

Prints one line per (family, lr, steps): CPU seconds so far and the accuracy at each size. One thread, float32.
"""

import argparse
import tempfile
import time
from pathlib import Path

import torch

from charlm.lab import copy, recall, tasks
from charlm.lab.scoring import accuracy
from charlm.lab.sweep import FAMILIES
from charlm.lab.training import PYTORCH_INIT, lab_model, lab_train_config, lab_trainer

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("task", choices=("copy", "recall"))
ap.add_argument("--seed", type=int, default=3, help="a seed the lab's figures are not quoted on")
ap.add_argument("--lrs", default="1e-3,3e-3,1e-2")
ap.add_argument("--steps", help="step counts scored [default: recall 500,...,8000; copy 500,1000,2000]")
ap.add_argument("--families", default=",".join(FAMILIES))
ap.add_argument("--decay", action="store_true", help="a cosine decay to a tenth of the rate (one run per step count)")
ap.add_argument("--positions", help="the Transformer's positions (default: the task's)")
a = ap.parse_args()

torch.set_num_threads(1)
module = {"copy": copy, "recall": recall}[a.task]
s = {**module.DEFAULTS, **({"positions": a.positions} if a.positions else {})}
if a.task == "copy":
    lo, hi = s["trained"]
    trained, tested = tuple(range(lo, hi + 1)), tuple(n for n in s["lengths"] if n <= hi)
    context, pad = copy.context_for(max(s["lengths"])), None
else:
    trained = tested = tuple(s["pairs"])
    context = tasks.example_length("recall", max(trained)) + 1
    pad = context - 1
grid = [int(x) for x in (a.steps or ("500,1000,2000,4000,8000" if a.task == "recall" else "500,1000,2000")).split(",")]
data = tasks.corpus(a.task, trained, s["train_chars"], a.seed + max(trained), pad=pad, heldout=True)
fresh = {n: tasks.examples(a.task, n, s["eval_examples"], a.seed + 10_000 + n) for n in tested}


def score(trainer) -> dict:
    trainer.model.eval()
    acc = {n: accuracy(trainer.model, trainer.tokenizer, ex) for n, ex in fresh.items()}
    trainer.model.train()
    return acc


def show(kind, lr, steps, cpu, acc) -> None:
    mean = sum(acc.values()) / len(acc)
    each = " ".join(f"{n}:{v:.3f}" for n, v in acc.items())
    schedule = "decay" if a.decay else "constant"
    print(
        f"{a.task} {kind} seed {a.seed} lr {lr:g} {schedule} steps {steps} cpu {cpu:.0f} s mean {mean:.3f}  {each}",
        flush=True,
    )


for kind in a.families.split(","):
    for lr in (float(x) for x in a.lrs.split(",")):
        cfg = lab_model(a.task, s, context, kind)
        # constant: one run, scored at every step count of the grid; decay: one run per step count (the rate
        # falls over the whole run, so step s of a longer run is not what an s-step run gives)
        for run_steps in grid if a.decay else [max(grid)]:
            train_cfg = lab_train_config(
                run_steps,
                a.seed,
                "cpu",
                s["batch_size"],
                lr,
                eval_interval=run_steps,
                constant_lr=not a.decay,
                beta2=0.95,
                warmup=0,
            )
            with tempfile.TemporaryDirectory() as tmp:
                trainer = lab_trainer(data, Path(tmp) / "run", cfg, train_cfg, PYTORCH_INIT)
                t0 = time.process_time()
                for steps in [run_steps] if a.decay else grid:
                    trainer.fit(until=steps)
                    show(kind, lr, steps, time.process_time() - t0, score(trainer))
