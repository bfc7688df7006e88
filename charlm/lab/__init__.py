"""charlm lab: small controlled experiments on incremental memory (LSTM) against direct access (attention).

Each experiment is one module with run(...) -> LabResult; lab models are trained with charlm's own
trainer and saved as normal runs. EXPERIMENTS is the list `charlm lab` shows.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from charlm.errors import ConfigError
from charlm.generate import one_thread
from charlm.lab.result import LabResult
from charlm.lab.training import LAB_DIR, check_runs, release_runs
from charlm.options import LabConfig

__all__ = ["EXPERIMENTS", "LAB_DIR", "NEEDS_CKPT", "LabResult", "run_experiment"]

EXPERIMENTS = {
    "copy": "delayed copy of N symbols, every N mixed: trained lengths and longer unseen ones, against chance",
    "recall": "multi-query associative recall (MQAR): accuracy against P, beside what no binding can reach",
    "capacity": "copy against N for LSTMs of several sizes: bits that at least crossed the state, at one budget",
    "induction": "the phase change: loss on a repeated segment and the heads' induction score, step by step",
    "cost": "time per generated token and per training step as the context grows, with fitted exponents",
    "heads": "CKPT: score every attention head (previous-token, induction, distance, entropy) and name them",
    "ablate": "CKPT: clamp an LSTM/GRU gate or knock out one attention head at a time; bits/char lost",
    "positions": "RoPE, ALiBi, NoPE, learned, sinusoidal: copying and bits/char inside and beyond the context",
    "width": "recall (or --task copy) against model width, both families: where each width stops answering",
    "forgetting": "LSTMs whose forget gate is free, constant, fixed, chrono-initialised, floored or self-set: text, recall",
}
NEEDS_CKPT = ("heads", "ablate")
# the ones that train models: --seeds K trains K per cell
SEEDED = ("copy", "recall", "capacity", "induction", "positions", "forgetting", "width")
TASKED = ("width",)  # the ones --task chooses the task of


def run_experiment(
    name: str,
    settings: LabConfig | None = None,
    *,
    ckpt: str | None = None,
    progress=lambda message: None,
) -> LabResult:
    """Run the experiment `name` (heads and ablate read the checkpoint ckpt; the others train their models,
    saved as normal runs under settings.out) and return its result."""
    s = settings or LabConfig()
    if name not in EXPERIMENTS:
        raise ConfigError(f"unknown experiment '{name}': choose one of {', '.join(EXPERIMENTS)}")
    if (name in NEEDS_CKPT) != (ckpt is not None):
        raise ConfigError(
            f"charlm lab {name} takes a checkpoint: charlm lab {name} CKPT"
            if name in NEEDS_CKPT
            else f"charlm lab {name} takes no checkpoint (it trains its own models)"
        )
    if s.seeds != 1 and name not in SEEDED:
        raise ConfigError(f"--seeds is for the experiments that train models ({', '.join(SEEDED)}), not {name}")
    if s.task is not None and name not in TASKED:
        raise ConfigError(f"--task is for {', '.join(TASKED)} (the task measured against width), not {name}")
    module = importlib.import_module(f"charlm.lab.{name}")
    sizes = module.QUICK if s.quick else {}
    with one_thread():  # lab models are small: a second thread only waits, the more so on a busy CPU
        if name in NEEDS_CKPT:
            return module.run(ckpt, seed=s.seed, text=s.text, progress=progress, **sizes)
        extra = {"seeds": s.seeds} if name in SEEDED else {}
        extra |= {"task": s.task} if s.task is not None else {}
        out = Path(s.out) if s.out else LAB_DIR
        from charlm.storage.runs import RunLock, check_writable
        from charlm.training.events import TrainingInterrupted

        check_writable(out)  # before any work, as train does: a file, a read-only mount
        lock = RunLock(out, "charlm lab")  # a second lab into the same --out would delete this one's runs
        try:
            check_runs(out, name)  # a link or another run where this experiment writes: refused before any work
            return module.run(out, seed=s.seed, device=s.device, progress=progress, **extra, **sizes)
        except TrainingInterrupted:  # Ctrl-C: the lab runs saved so far stay; the CLI says "interrupted"
            raise KeyboardInterrupt from None
        finally:
            release_runs()
            lock.release()
