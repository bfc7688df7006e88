"""What every lab experiment shares: its result record, training a model with the real trainer on a
synthetic task (a normal run directory that chat, attn, gates and compare open), and scoring it.

A lab model learns the task as it is posed: every training window starts at an example, and the loss
covers only the characters the example determines (tasks.TaskText, data.Batches). The coupling to the
trainer and the checkpoint format lives here and nowhere else in charlm.lab.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from charlm import checkpoint, files
from charlm.config import ModelConfig, TrainConfig
from charlm.lab import tasks
from charlm.lab.tasks import Example, TaskText
from charlm.models import config_params
from charlm.train import Trainer

LAB_DIR = Path("checkpoints/lab")  # run directories of lab models, e.g. LAB_DIR/<experiment>-<model>-s<seed>
RUN_FILES = ("corpus.txt", "targets.npy", "last.pt", "best.pt", "metrics.jsonl")
TARGETS = "targets.npy"  # next to a lab run's corpus.txt: its mask (True where the task determines the character)


@dataclass(frozen=True)
class Init:
    """How a lab Transformer's weights are drawn again before its first step (lab_init). charlm's own init is
    GPT-2's (0.02, made for widths near 768): at width 64 it leaves attention almost uniform."""

    std: float | None  # the matrices that read the residual stream (and an untied head); None: PyTorch's own init
    embeddings: float | None = None  # the token and position tables (None: std)
    residual: float | None = None  # the projections that write to it (None: charlm's, scaled down)


# induction: its phase change came at 350-450 steps in each of seeds 0, 1, 2 measured
INDUCTION_INIT = Init(0.05)
# copy and recall: PyTorch's own init (embeddings N(0, 1), each Linear uniform within ±1/sqrt(fan-in)), as the
# independent reference (benchmarks/lab_recall_reference.py) draws it. With charlm's small init recall sat in its
# elimination shortcut (~45% at P=8) in every seed; with one std of 0.07 for every matrix it still did in seed 0
# for 1,000 steps; from PyTorch's init the lookup circuit formed by step 300-600 in 6 of 6 seeds (RESULTS, Lab)
PYTORCH_INIT = Init(None)


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


def lab_train_config(
    steps: int,
    seed: int,
    device: str,
    batch_size: int = 32,
    lr: float = 3e-3,
    optimizer: str = "adamw",
    eval_interval: int | None = None,
    constant_lr: bool = False,
    beta2: float = TrainConfig.beta2,
    warmup: int | None = None,
) -> TrainConfig:
    # AdamW by default (with Muon recall fell into its shortcut at once: notes-lab.md); one evaluation at the
    # end unless asked (the lab scores its models itself); no samples. constant_lr: no cosine decay after the
    # warmup (a circuit that forms late, in a phase change, still has the learning rate to form). float32 on
    # every CPU: a lab result must not depend on whether the machine has bf16 (auto would pick it on a Zen 4,
    # where these small Transformers also train slower in it)
    return TrainConfig(
        steps=steps,
        batch_size=batch_size,
        lr=lr,
        warmup=min(50, steps // 10) if warmup is None else warmup,
        beta2=beta2,
        precision="fp32",
        optimizer=optimizer,
        eval_interval=eval_interval or steps,
        eval_iters=4,
        sample_tokens=0,
        seed=seed,
        device=device,
        min_lr_ratio=1.0 if constant_lr else TrainConfig.min_lr_ratio,
    )


def lab_trainer(
    data: TaskText | str, run_dir: Path, model_cfg: ModelConfig, train_cfg: TrainConfig, init: Init | None = None
) -> Trainer:
    """A trainer for `data` (kept as run_dir/corpus.txt): a TaskText is learned as posed (windows from its
    examples' starts, loss on its mask), plain text as any corpus. init: how a Transformer's weights are
    drawn again (lab_init; None: charlm's init). A previous lab run in run_dir is replaced, so a rerun
    gives the same run."""
    run_dir.mkdir(parents=True, exist_ok=True)
    for name in RUN_FILES:
        (run_dir / name).unlink(missing_ok=True)
    corpus = run_dir / "corpus.txt"
    aligned = isinstance(data, TaskText)
    text = (data.text if aligned else data).encode("utf-8")
    files.atomic_write(corpus, lambda f: f.write(text))  # (never through a link or onto a special file)
    if aligned:  # so that what reads the run later (lab ablate) scores the task as it was posed
        files.atomic_write(run_dir / TARGETS, lambda f: np.save(f, data.mask))
    trainer = Trainer(
        corpus,
        model_cfg,
        train_cfg,
        run_dir,
        starts=data.starts if aligned else None,
        mask=data.mask if aligned else None,
    )
    if init is not None and "attention" in trainer.model.capabilities:
        lab_init(trainer.model, init, train_cfg.seed)
    return trainer


@torch.no_grad()
def lab_init(model: torch.nn.Module, init: Init, seed: int) -> None:
    """Draw the weights of a fresh Transformer again (see Init), in place, before its first step."""
    if init.std is None:
        with torch.random.fork_rng(devices=[]):  # PyTorch's init draws from the global generator: keep it as it was
            torch.manual_seed(seed)
            for module in model.modules():
                if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
                    module.reset_parameters()
        return
    gen = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if p.dim() != 2:
            continue
        if name.endswith("emb.weight"):
            p.normal_(0.0, init.std if init.embeddings is None else init.embeddings, generator=gen)
        elif not name.endswith("proj.weight"):
            p.normal_(0.0, init.std, generator=gen)
        elif init.residual is not None:
            p.normal_(0.0, init.residual, generator=gen)


def train_model(
    data: TaskText | str, run_dir: Path, model_cfg: ModelConfig, train_cfg: TrainConfig, init: Init | None = None
) -> Path:
    """Train a model on `data` with charlm's trainer (see lab_trainer); returns run_dir."""
    lab_trainer(data, run_dir, model_cfg, train_cfg, init).fit()
    return run_dir


def load_run(run_dir: Path, device: str = "cpu") -> checkpoint.Checkpoint:
    return checkpoint.load(run_dir, device=device)


def matched_rnn(transformer: ModelConfig, kind: str = "lstm") -> ModelConfig:
    """An LSTM/GRU with the transformer's layers and context whose width gives it about as many parameters."""
    target = config_params(transformer)
    best = None
    for d in range(8, 4 * transformer.d_model + 1, 4):
        cfg = ModelConfig(
            kind=kind,
            vocab_size=transformer.vocab_size,
            n_layers=transformer.n_layers,
            d_model=d,
            context=transformer.context,
        )
        gap = abs(config_params(cfg) - target)
        if best is None or gap < best[0]:
            best = (gap, cfg)
    return best[1]


def _groups(examples: list[Example], size: int = 64):
    """Examples in batches of equal length (each one a line: a newline first, as in training)."""
    by_length: dict[int, list[Example]] = {}
    for e in examples:
        by_length.setdefault(len(e.text), []).append(e)
    for group in by_length.values():
        for b in range(0, len(group), size):
            yield group[b : b + size]


@torch.no_grad()
def scored(model, tokenizer, examples: list[Example]) -> tuple[float, float]:
    """(accuracy, nats): the share of target characters the model predicts exactly (argmax) from everything
    before them in the example, and its mean loss on them (teacher forcing: a right prefix, as greedy
    decoding has while it makes no mistake)."""
    device = next(model.parameters()).device
    right = total = 0
    nats = 0.0
    for group in _groups(examples):
        ids = torch.tensor([tokenizer.encode("\n" + e.text) for e in group], device=device)
        logits, _ = model(ids[:, :-1])  # logits[:, p] predicts ids[:, p + 1] = text[p]
        logits = logits.float()
        for row, e in enumerate(group):
            t = torch.tensor(e.targets, device=device)
            right += int((logits[row, t].argmax(-1) == ids[row, t + 1]).sum())
            nats += float(F.cross_entropy(logits[row, t], ids[row, t + 1], reduction="sum"))
            total += len(e.targets)
    return right / total, nats / total


def accuracy(model, tokenizer, examples: list[Example]) -> float:
    return scored(model, tokenizer, examples)[0]


def seeds_of(seed: int, count: int) -> list[int]:
    return list(range(seed, seed + count))


def spread(values: list[float]) -> dict:
    """The fields a record shows for one score over several seeds: the mean, and with more than one
    seed the lowest and every value (in seed order)."""
    out = {"accuracy": statistics.fmean(values)}
    if len(values) > 1:
        out |= {"lowest": min(values), "per_seed": [round(v, 4) for v in values]}
    return out


FAMILIES = ("transformer", "lstm")


def sweep(
    task: str,
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
    """Train a Transformer (settings s) and an LSTM of about its size, each family at its own learning rate and
    steps (s["lr"][family], s["steps"][family]: the best of the same sweep for each, benchmarks/lab_tune.py),
    one model per family and seed that learns every size of `trained` at once (lines of each size mixed:
    padded with newlines to `pad` characters, one line a window, or packed one after another), and score it
    at every size of `tested` on held-out lines (tasks.examples: never a training line). beside(size): the
    baselines a record shows beside its accuracy. Returns (one record per family and tested size, over the
    seeds; run directory by (family, seed))."""
    key = {"copy": "length", "recall": "pairs"}[task]
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
            # the reference's optimizer: AdamW, betas (0.9, 0.95), a constant rate from the first step
            train_cfg = lab_train_config(
                steps, seed, device, s["batch_size"], lr, constant_lr=True, beta2=0.95, warmup=0
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


def lab_model(task: str, s: dict, context: int, kind: str) -> ModelConfig:
    """The Transformer of copy and recall (settings s), or the LSTM of about its size."""
    tf = ModelConfig(
        kind="transformer",
        vocab_size=tasks.vocab_size(task),
        n_layers=s["layers"],
        d_model=s["d_model"],
        n_heads=s["heads"],
        context=context,
        positions="learned",  # one example a window, always from its start: absolute positions suffice
        tied=False,  # a head of its own: tied, the key's own embedding pulls each answer toward the key
    )
    return tf if kind == "transformer" else matched_rnn(tf, kind)


def params(records: list[dict]) -> str:
    """A family's parameter count in a reading: one number, or the range over the sizes (learned positions
    grow with the context)."""
    low, high = min(r["params"] for r in records), max(r["params"] for r in records)
    return f"{low:,}" if low == high else f"{low:,}-{high:,}"


def per_seed(r: dict) -> list[float]:
    """Every seed's accuracy in a record made with spread()."""
    return r.get("per_seed") or [r["accuracy"]]


def pct(x: float) -> str:
    """A share as the readings print it: whole percent, one decimal below 10%."""
    return f"{x:.1%}" if x < 0.1 else f"{x:.0%}"


def span(values: list[float]) -> str:
    """Every seed's accuracy as a reading quotes it: one value, or the lowest-highest."""
    low, high = min(values), max(values)
    return pct(low) if pct(low) == pct(high) else f"{pct(low)}-{pct(high)}"


def fit_exponent(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of log y against log x: y ~ x^slope."""
    lx, ly = np.log(np.asarray(xs, float)), np.log(np.asarray(ys, float))
    return float(np.polyfit(lx, ly, 1)[0])


def bits_per_symbol(accuracy: float, alphabet: int) -> float:
    """Information one copied symbol carries when it is right with probability `accuracy` and wrong
    evenly otherwise: log2 K - H(a) - (1 - a) log2 (K - 1), 0 at chance (1/K), log2 K when always right."""
    a = min(max(accuracy, 1 / alphabet), 1.0)
    h = -sum(p * math.log2(p) for p in (a, 1 - a) if p > 0)
    return math.log2(alphabet) - h - (1 - a) * math.log2(alphabet - 1)


def record(**kw) -> dict:
    return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in kw.items()}
