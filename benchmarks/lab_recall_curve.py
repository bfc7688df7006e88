"""When does a recall Transformer form its lookup circuit? The lab's model and trainer (charlm.lab.training) on
recall examples of one P or of several mixed (one a row, padded to the longest), scored on fresh examples at
each P every --every steps. What benchmarks/RESULTS.md ("Lab") quotes for the choices behind `charlm lab
recall`: PyTorch's init against one std of 0.07, one P against a mixture.

    python benchmarks/lab_recall_curve.py --sizes 8 --seed 0                      # P=8 alone
    python benchmarks/lab_recall_curve.py --sizes 2,4,8,16 --steps 1200 --every 200 --seed 1   # mixed
    python benchmarks/lab_recall_curve.py --sizes 8 --init std0.07 --beta2 0.99 --warmup 50    # last round's

Prints one line per evaluation: the step, CPU seconds so far, the accuracy at each P. One thread, float32.
"""

import argparse
import tempfile
import time
from pathlib import Path

import torch

from charlm.config import ModelConfig
from charlm.lab import tasks
from charlm.lab.scoring import accuracy
from charlm.lab.training import PYTORCH_INIT, Init, lab_train_config, lab_trainer, matched_rnn

INITS = {"pytorch": PYTORCH_INIT, "std0.07": Init(0.07, embeddings=1.0, residual=0.07)}  # the second: last round's

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--sizes", default="8", help="P, or several mixed: 2,4,8,16")
ap.add_argument("--model", default="transformer", choices=("transformer", "lstm"))
ap.add_argument("--seed", type=int, default=0, help="the weights' and batches' seed; the examples' is seed + max P")
ap.add_argument("--steps", type=int, default=1000)
ap.add_argument("--every", type=int, default=100)
ap.add_argument("--batch", type=int, default=64)
ap.add_argument("--lr", type=float, default=3e-3)
ap.add_argument("--beta2", type=float, default=0.95)
ap.add_argument("--warmup", type=int, default=0)
ap.add_argument("--init", default="pytorch", choices=tuple(INITS))
ap.add_argument("--chars", type=int, default=3_000_000, help="characters of training examples")
a = ap.parse_args()

torch.set_num_threads(1)
sizes = tuple(int(x) for x in a.sizes.split(","))
longest = max(sizes)
tf = ModelConfig(
    kind="transformer",
    vocab_size=tasks.vocab_size("recall"),
    n_layers=2,
    d_model=64,
    n_heads=2,
    context=tasks.example_length("recall", longest) + 1,
    positions="learned",
    tied=False,
)
cfg = tf if a.model == "transformer" else matched_rnn(tf, a.model)
data = tasks.corpus(
    "recall", sizes, a.chars, a.seed + longest, pad=tasks.example_length("recall", longest), heldout=True
)
train_cfg = lab_train_config(
    a.steps, a.seed, "cpu", a.batch, a.lr, eval_interval=a.every, constant_lr=True, beta2=a.beta2, warmup=a.warmup
)
with tempfile.TemporaryDirectory() as tmp:
    trainer = lab_trainer(data, Path(tmp) / "run", cfg, train_cfg, INITS[a.init])
    fresh = {p: tasks.examples("recall", p, 200, a.seed + 10_000 + p) for p in sizes}
    t0 = time.process_time()
    for step in range(a.every, a.steps + 1, a.every):
        trainer.fit(until=step)
        trainer.model.eval()
        scores = " ".join(f"P={p} {accuracy(trainer.model, trainer.tokenizer, ex):.3f}" for p, ex in fresh.items())
        trainer.model.train()
        print(f"{a.model} seed {a.seed} step {step} cpu {time.process_time() - t0:.0f} s  {scores}", flush=True)
