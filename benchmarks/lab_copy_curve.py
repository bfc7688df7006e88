"""Does a copy model copy by content? The lab's model and trainer (charlm.lab.training) on copy lines of every
length from --lo to --hi, mixed (packed one after another, or each padded to the longest with --pad), scored
on held-out lines at trained and longer lengths every --every steps. What benchmarks/RESULTS.md ("Lab")
quotes for the choices behind `charlm lab copy`.

    python benchmarks/lab_copy_curve.py --seed 3
    python benchmarks/lab_copy_curve.py --model lstm --lr 1e-2 --seed 3

Prints one line per evaluation: the step, CPU seconds so far, the accuracy at each N. One thread, float32.
"""

import argparse
import tempfile
import time
from pathlib import Path

import torch

from charlm.config import ModelConfig
from charlm.lab import tasks
from charlm.lab.scoring import accuracy
from charlm.lab.training import PYTORCH_INIT, lab_train_config, lab_trainer, matched_rnn

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--lo", type=int, default=5)
ap.add_argument("--hi", type=int, default=40)
ap.add_argument("--test", default="5,10,20,30,40,50,60", help="N scored")
ap.add_argument("--model", default="transformer", choices=("transformer", "lstm"))
ap.add_argument("--positions", default="learned")
ap.add_argument("--heads", type=int, default=2)
ap.add_argument("--layers", type=int, default=2)
ap.add_argument("--pad", action="store_true", help="one line a window (padded), not packed")
ap.add_argument("--seed", type=int, default=0)
ap.add_argument("--steps", type=int, default=1000)
ap.add_argument("--every", type=int, default=100)
ap.add_argument("--batch", type=int, default=64)
ap.add_argument("--lr", type=float, default=3e-3)
ap.add_argument("--chars", type=int, default=400_000)
ap.add_argument("--keep", help="keep the run directory here (default: a temporary one)")
ap.add_argument("--decay", action="store_true", help="cosine decay to a tenth of --lr over --steps (else constant)")
a = ap.parse_args()

torch.set_num_threads(1)
test = [int(x) for x in a.test.split(",")]
tf = ModelConfig(
    kind="transformer",
    vocab_size=tasks.vocab_size("copy"),
    n_layers=a.layers,
    d_model=64,
    n_heads=a.heads,
    context=2 * max(test) + 2,
    positions=a.positions,
    tied=False,
)
cfg = tf if a.model == "transformer" else matched_rnn(tf, a.model)
pad = tasks.example_length("copy", a.hi) if a.pad else None
data = tasks.corpus("copy", tuple(range(a.lo, a.hi + 1)), a.chars, a.seed + a.hi, pad=pad, heldout=True)
train_cfg = lab_train_config(
    a.steps, a.seed, "cpu", a.batch, a.lr, eval_interval=a.every, constant_lr=not a.decay, beta2=0.95, warmup=0
)
with tempfile.TemporaryDirectory() as tmp:
    trainer = lab_trainer(data, Path(a.keep or Path(tmp) / "run"), cfg, train_cfg, PYTORCH_INIT)
    fresh = {n: tasks.examples("copy", n, 100, a.seed + 10_000 + n) for n in test}
    t0 = time.process_time()
    for step in range(a.every, a.steps + 1, a.every):
        trainer.fit(until=step)
        trainer.model.eval()
        scores = " ".join(f"N={n} {accuracy(trainer.model, trainer.tokenizer, ex):.3f}" for n, ex in fresh.items())
        trainer.model.train()
        print(f"{a.model} seed {a.seed} step {step} cpu {time.process_time() - t0:.0f} s  {scores}", flush=True)
