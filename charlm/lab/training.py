"""How a lab model is trained: with charlm's own trainer on a synthetic task, into a normal run directory that
chat, attn, gates and compare open. A lab model learns the task as it is posed: every training window starts at
an example, and the loss covers only the characters the example determines (tasks.TaskText, data.Batches). The
coupling to the trainer and the checkpoint format lives here and nowhere else in charlm.lab.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from charlm import files
from charlm.config import ModelConfig, TrainConfig
from charlm.data import READS, TARGETS, model_input
from charlm.errors import ConfigError, UserError
from charlm.lab import tasks
from charlm.lab.tasks import TaskText
from charlm.models import config_params
from charlm.storage import checkpoint
from charlm.storage.checkpoint import BEST, LAST, OLD_BEST, OLD_LAST
from charlm.storage.runs import LOCK, RunLock
from charlm.training.trainer import Trainer

LAB_DIR = Path("checkpoints/lab")  # run directories of lab models, e.g. LAB_DIR/<experiment>-<model>-s<seed>
RUN_FILES = ("corpus.txt", TARGETS, READS, LAST, BEST, OLD_LAST, OLD_BEST, "metrics.jsonl")  # (an older charlm's too)
MARK = "lab.json"  # in every lab run: which lab run it is, so a rerun replaces it and nothing else
_held: list = []  # the run locks this process holds on lab runs (release_runs)


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
    drawn again (lab_init; None: charlm's init). Only the lab's own earlier run of this name is replaced (claim),
    so a rerun gives the same run."""
    claim(run_dir)
    for name in RUN_FILES:
        (run_dir / name).unlink(missing_ok=True)
    corpus = run_dir / "corpus.txt"
    aligned = isinstance(data, TaskText)
    text = (data.text if aligned else data).encode("utf-8")
    files.atomic_write(corpus, lambda f: f.write(text))  # (never through a link or onto a special file)
    if aligned:  # so that what reads the run later (lab ablate, explore) scores the task as it was posed
        files.atomic_write(run_dir / TARGETS, lambda f: np.save(f, data.mask))
    if aligned and data.fill is not None:  # and feeds the model what it was trained to read (data.filler)
        files.atomic_write(run_dir / READS, lambda f: f.write(data.fill.encode("utf-8")))
    trainer = Trainer(
        corpus,
        model_cfg,
        train_cfg,
        run_dir,
        starts=data.starts if aligned else None,
        mask=data.mask if aligned else None,
    )
    if aligned and data.fill is not None:  # the model reads the filler in place of each answer
        trainer.batches = FilledBatches(trainer.batches, trainer.tokenizer.encode(data.fill)[0])
    if init is not None and "attention" in trainer.model.capabilities:
        lab_init(trainer.model, init, train_cfg.seed)
    return trainer


def claim(run_dir: Path) -> None:
    """Make run_dir this lab run's, or refuse with one line: never through a link, never over anything but the
    lab's own earlier run of the same name (its MARK says so) or an empty directory; then hold the run lock there
    as train does (runs.RunLock: a training into it meanwhile is refused) until release_runs()."""
    where = f"{run_dir}"
    for lock in [lock for lock in _held if lock.out == run_dir]:  # this process's own earlier claim of it
        _held.remove(lock)
        lock.release()
    if run_dir.is_symlink():
        raise ConfigError(f"{where} is a link: charlm lab never writes through one; remove it or choose another --out")
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"{where} is not a directory: move it away or choose another --out")
    if run_dir.exists() and not _ours(run_dir):
        raise ConfigError(
            f"{where} already holds something that is not this lab run's earlier result; charlm lab replaces only "
            "its own runs: move it away or choose another --out"
        )
    _held.append(RunLock(run_dir, "charlm lab"))
    if not _ours(run_dir):  # between the look and the lock another process wrote there
        release_runs()
        raise ConfigError(f"{where} was written to by another process meanwhile: choose another --out")
    files.atomic_write(run_dir / MARK, lambda f: f.write(json.dumps({"lab_run": run_dir.name}).encode()))


def check_runs(out: Path, experiment: str) -> None:
    """Before any work: refuse (claim's one line) where a run this experiment would write, out/<experiment>-*,
    is a link or holds something else than the lab's own earlier run."""
    if not out.is_dir():
        return
    for run_dir in sorted(out.glob(f"{experiment}-*")):
        if run_dir.is_symlink() or not run_dir.is_dir() or not _ours(run_dir):
            claim(run_dir)  # raises, saying which


def _ours(run_dir: Path) -> bool:
    """Whether run_dir is empty (but for a lock) or the lab's own earlier run of this name."""
    names = {p.name for p in run_dir.iterdir()} - {LOCK}
    if not names:
        return True
    mark = run_dir / MARK
    if mark.is_symlink() or not mark.is_file():  # (a FIFO there would hang a read)
        return False
    try:
        mark = json.loads(files.read_bounded(mark, 4096, "lab run record"))
    except (OSError, ValueError, UserError):
        return False
    return isinstance(mark, dict) and mark.get("lab_run") == run_dir.name


def release_runs() -> None:
    """Let go of every lab run this process holds (claim)."""
    while _held:
        _held.pop().release()


class FilledBatches:
    """A task's batches (data.Batches, with its mask) where the model reads `fill` in place of every target
    token: y is as before, x holds the filler wherever the mask marks a target (Zoology's recall: an answer is
    never an input). Everything else is the wrapped Batches'."""

    def __init__(self, batches, fill: int):
        self.inner, self.fill = batches, fill

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def get_batch(self, split: str, batch_size: int, generator: torch.Generator, device="cpu"):
        # the targets of x's windows are y's, one token earlier: y[:, p] is a target where x[:, p + 1] holds it
        x, y = self.inner.get_batch(split, batch_size, generator, "cpu")
        targets = torch.zeros_like(x, dtype=torch.bool)
        targets[:, 1:] = y[:, :-1] >= 0
        x = torch.from_numpy(model_input(x.numpy(), targets.numpy(), self.fill))
        return x.to(device), y.to(device)


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


@dataclass
class Plateau:
    """A budget that ends where held-out accuracy stops rising: every `check` steps the model is scored on
    held-out lines of its own (not the test lines); training stops at the first check that is not `rise` above
    the best of the checks more than `patience` checks before it, or at `cap` steps."""

    check: int
    cap: int
    patience: int = 3
    rise: float = 0.01


def fit_to_plateau(trainer: Trainer, check: list[list[tasks.Example]], rule: Plateau) -> tuple[int, list[float]]:
    """Train with `trainer` (its cfg.steps at least rule.cap, a constant rate: a pause changes nothing) under
    the plateau rule, scored at each check by its mean accuracy over the sets of held-out lines `check` (one a
    size). Returns (steps trained, the curve)."""
    from charlm.lab.scoring import accuracy

    curve: list[float] = []
    step = 0
    while step < rule.cap:
        step = min(step + rule.check, rule.cap)
        trainer.fit(until=step)
        trainer.model.eval()
        curve.append(sum(accuracy(trainer.model, trainer.tokenizer, ex) for ex in check) / len(check))
        trainer.model.train()
        if len(curve) > rule.patience and max(curve[-rule.patience :]) < max(curve[: -rule.patience]) + rule.rise:
            break
    return step, curve


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


def lab_model(task: str, s: dict, context: int, kind: str) -> ModelConfig:
    """The Transformer of copy and recall (settings s), or the LSTM of about its size."""
    tf = ModelConfig(
        kind="transformer",
        vocab_size=tasks.vocab_size(task),
        n_layers=s["layers"],
        d_model=s["d_model"],
        n_heads=s["heads"],
        context=context,
        positions=s["positions"],
        tied=False,  # a head of its own: tied, the key's own embedding pulls each answer toward the key
    )
    return tf if kind == "transformer" else matched_rnn(tf, kind)
