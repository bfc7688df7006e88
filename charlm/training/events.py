"""What a training run reports, and how it ends: the events the trainer sends to its callback (Encoding,
Started, Phase, Stopping, Stepped, Evaluated), its Result, and the exceptions that end a run early
(TrainingInterrupted, TrainingDiverged). Plain data, without torch: views.progress draws them.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from pathlib import Path

from charlm.config import ModelConfig, TrainConfig
from charlm.errors import UserError


@dataclass(kw_only=True)
class Encoding:
    done: int  # bytes of the corpus encoded so far
    total: int


@dataclass(kw_only=True)
class Started:
    out_dir: Path
    device: str
    params: int
    model_config: ModelConfig
    train_config: TrainConfig
    start_step: int
    train_tokens: int
    val_tokens: int
    vocab_size: int
    world_size: int = 1  # processes (torchrun ranks): effective batch = batch_size * grad_accum * world_size
    start_seconds: float = 0.0  # seconds trained by earlier sessions of a resumed run


@dataclass(kw_only=True)
class Phase:
    name: str  # "evaluating" | "sampling" | "saving": work between steps that shows no progress of its own


@dataclass(kw_only=True)
class Stopping:
    """A signal (Ctrl-C, SIGTERM, SIGHUP) asked the run to stop: sent at once, from the signal handler."""

    signum: int
    saving: bool  # the run saves before it stops (False: in set-up, there is nothing to save yet)


@dataclass(kw_only=True)
class Stepped:
    step: int
    loss: float
    lr: float
    tokens_per_s: float
    elapsed: float  # seconds of training so far, earlier sessions included
    load: float | None = None  # the machine's 1-minute load average (None where the system has none)
    # since the last reading (runtime.CpuShare, every 2 s; None: no reading yet, or on a GPU, or without /proc)
    others: float | None = None  # cores that other programs kept busy
    own: float | None = None  # cores this process used
    threads: int | None = None  # torch's threads for this step


@dataclass(kw_only=True)
class Evaluated:
    step: int
    train_loss: float
    val_loss: float
    val_bpc: float
    is_best: bool
    sample: str | None = None  # a short sample of the model at this step (sample_tokens > 0)


@dataclass(kw_only=True)
class Result:
    out_dir: Path
    step: int
    stopped: str  # "steps" | "time" | "interrupted" | "until"
    train_seconds: float
    best_val_loss: float | None  # None: never evaluated
    best_val_bpc: float | None
    last_val_loss: float | None
    params: int
    sample: str | None = None  # the final sample (sample_tokens > 0, rank 0)
    tokens_per_s: float | None = None  # this session's median over its steps (evaluations left out)
    usual_tokens_per_s: float | None = None  # the fastest this machine trained this set-up before (commands.train)


class TrainingInterrupted(Exception):
    """Ctrl-C, SIGTERM or SIGHUP stopped the run. signum: the signal that stopped it; result: where training
    got to (None: stopped in set-up); saved_step: the step out_dir/last.safetensors holds (None: there is none), which
    is result.step unless a second signal quit without saving."""

    def __init__(
        self,
        result: Result | None,
        signum: int = signal.SIGINT,
        *,
        out_dir: Path | None = None,
        saved_step: int | None = -1,
    ):
        super().__init__("interrupted")
        self.result, self.signum = result, signum
        self.out_dir = out_dir if out_dir is not None else result.out_dir if result else None
        self.saved_step = result.step if saved_step == -1 and result else None if saved_step == -1 else saved_step


class TrainingDiverged(UserError):
    """The loss became NaN or infinite; the last good checkpoint is kept."""
