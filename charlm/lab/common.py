"""What every lab experiment shares: its result record, training a model with the real trainer on a
synthetic text (a normal run directory that chat, attn, gates and compare open), and scoring it.

The coupling to the trainer and the checkpoint format lives here and nowhere else in charlm.lab.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from charlm import checkpoint
from charlm.config import ModelConfig, TrainConfig
from charlm.lab.tasks import Example
from charlm.models import build_model, count_params
from charlm.train import Trainer

LAB_DIR = Path("checkpoints/lab")  # run directories of lab models: LAB_DIR/<experiment>-<model>-<size>
RUN_FILES = ("corpus.txt", "last.pt", "best.pt", "metrics.jsonl")


@dataclass
class Chart:
    """How to draw a result's records: y against x, one line per value of `series` (None: one per y key)."""

    x: str
    y: str | tuple[str, ...]
    series: str | None
    xlabel: str
    ylabel: str
    xlog: bool = False
    ylog: bool = False


@dataclass
class LabResult:
    experiment: str
    settings: dict
    results: list[dict]  # flat records, e.g. {"model": "lstm", "length": 40, "accuracy": 0.31}
    reading: str  # what the numbers say, written from them
    chart: Chart | None = None
    runs: list[str] = field(default_factory=list)  # run directories this experiment trained
    seconds: float = 0.0
    details: dict = field(default_factory=dict)  # what an experiment found beyond its table (e.g. the copy head)

    def to_dict(self) -> dict:
        return {
            "experiment": self.experiment,
            "settings": self.settings,
            "results": self.results,
            "reading": self.reading,
            "details": self.details,
            "runs": self.runs,
            "seconds": round(self.seconds, 1),
        }


class Clock:
    def __init__(self):
        self.t0 = time.perf_counter()

    def __call__(self) -> float:
        return time.perf_counter() - self.t0


def lab_train_config(steps: int, seed: int, device: str, batch_size: int = 32, lr: float = 3e-3) -> TrainConfig:
    # one evaluation at the end (the lab scores its models itself); no samples
    return TrainConfig(
        steps=steps,
        batch_size=batch_size,
        lr=lr,
        warmup=min(50, steps // 10),
        eval_interval=steps,
        eval_iters=4,
        sample_tokens=0,
        seed=seed,
        device=device,
    )


def train_model(text: str, run_dir: Path, model_cfg: ModelConfig, train_cfg: TrainConfig) -> Path:
    """Train a model on `text` (kept as run_dir/corpus.txt) with charlm's trainer; returns run_dir.
    A previous lab run in run_dir is replaced, so a rerun gives the same run."""
    run_dir.mkdir(parents=True, exist_ok=True)
    for name in RUN_FILES:
        (run_dir / name).unlink(missing_ok=True)
    corpus = run_dir / "corpus.txt"
    corpus.write_text(text, encoding="utf-8")
    Trainer(corpus, model_cfg, train_cfg, run_dir).fit()
    return run_dir


def load_run(run_dir: Path, device: str = "cpu") -> checkpoint.Checkpoint:
    return checkpoint.load(run_dir, device=device)


def params_of(cfg: ModelConfig) -> int:
    return count_params(build_model(cfg))


def matched_rnn(transformer: ModelConfig, kind: str = "lstm") -> ModelConfig:
    """An LSTM/GRU with the transformer's layers and context whose width gives it about as many parameters."""
    target = params_of(transformer)
    best = None
    for d in range(8, 4 * transformer.d_model + 1, 4):
        cfg = ModelConfig(
            kind=kind,
            vocab_size=transformer.vocab_size,
            n_layers=transformer.n_layers,
            d_model=d,
            context=transformer.context,
        )
        gap = abs(params_of(cfg) - target)
        if best is None or gap < best[0]:
            best = (gap, cfg)
    return best[1]


@torch.no_grad()
def accuracy(model, tokenizer, examples: list[Example]) -> float:
    """Share of target characters the model predicts exactly (argmax) from everything before them in
    the example (teacher forcing: a right prefix, as greedy decoding has while it makes no mistake).
    Each example starts a line, as in training."""
    device = next(model.parameters()).device
    right = total = 0
    for b in range(0, len(examples), 64):
        group = examples[b : b + 64]
        ids = torch.tensor([tokenizer.encode("\n" + e.text) for e in group], device=device)  # all one length
        logits, _ = model(ids[:, :-1])  # logits[:, p] predicts ids[:, p + 1] = text[p]
        pred = logits.argmax(-1)
        for row, e in enumerate(group):
            t = torch.tensor(e.targets, device=device)
            right += int((pred[row, t] == ids[row, t + 1]).sum())
            total += len(e.targets)
    return right / total


def sweep(
    task: str, sizes, s: dict, context_for, out: Path, seed: int, device: str, progress
) -> tuple[list[dict], dict]:
    """Train a Transformer (settings s) and a same-size LSTM at each task size, with the same budget, and
    score each on fresh examples. Returns (records, run directory by (model, size))."""
    from charlm.lab import tasks

    key = {"copy": "length", "recall": "pairs"}[task]
    records, runs = [], {}
    jobs = [(n, kind) for n in sizes for kind in ("transformer", "lstm")]
    clock = Clock()
    for k, (n, kind) in enumerate(jobs, 1):
        tf = ModelConfig(
            kind="transformer",
            vocab_size=tasks.vocab_size(task),
            n_layers=s["layers"],
            d_model=s["d_model"],
            n_heads=s["heads"],
            context=context_for(n),
        )
        cfg = tf if kind == "transformer" else matched_rnn(tf, "lstm")
        name = f"{task}-{kind}-{'n' if task == 'copy' else 'p'}{n}"
        progress(f"training {name} ({k}/{len(jobs)}, {params_of(cfg):,} parameters, {s['steps']} steps)")
        t0 = clock()
        run_dir = train_model(
            tasks.corpus(task, n, s["train_chars"], seed + n),
            out / name,
            cfg,
            lab_train_config(s["steps"], seed, device, s["batch_size"], s["lr"]),
        )
        seconds = clock() - t0
        ck = load_run(run_dir)
        acc = accuracy(ck.model, ck.tokenizer, tasks.examples(task, n, s["eval_examples"], seed + 10_000 + n))
        records.append(record(model=kind, **{key: n}, accuracy=acc, params=params_of(cfg), train_seconds=seconds))
        runs[(kind, n)] = str(run_dir)
    return records, runs


def fit_exponent(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of log y against log x: y ~ x^slope."""
    lx, ly = np.log(np.asarray(xs, float)), np.log(np.asarray(ys, float))
    return float(np.polyfit(lx, ly, 1)[0])


def record(**kw) -> dict:
    return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in kw.items()}
