"""`charlm train` as a function: a corpus and configs in, a trained run directory out.

Around the trainer (charlm.training.trainer) it does what a run needs from the outside: the decision to resume (made
once, by resume.resume_run, and handed to the trainer), checks before any work (a directory in use, not writable, a run that cannot fit in memory), the run lock,
and the torchrun relaunch for --nproc. What happens is reported as the trainer's events; errors are
exceptions with a one-line message (TrainingInterrupted carries the saved step).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from charlm import files
from charlm.config import ModelConfig, TrainConfig
from charlm.data import cache_dir
from charlm.errors import CheckpointError, ConfigError
from charlm.runtime import cpu_name, pick_device
from charlm.storage import checkpoint, runs
from charlm.storage.runs import check_writable
from charlm.training import distributed, memory
from charlm.training.events import Result, Stopping, TrainingInterrupted
from charlm.training.resume import Resumed, resume_run
from charlm.training.stopping import RunSignals, SetupInterrupted, stop_signals
from charlm.training.trainer import Trainer
from charlm.views.text import shell_quote


def train(
    corpus: str,
    model_cfg: ModelConfig,
    train_cfg: TrainConfig,
    out: str | Path | None = None,
    *,
    resume: bool = False,
    nproc: int | None = None,
    given: set[str] | None = None,
    on_event: Callable | None = None,
    launch: Callable[[list[str]], NoReturn] | None = None,
    argv: list[str] | None = None,
    settle_signals: bool = False,
) -> Result:
    """Train a model on corpus into out (default: checkpoints/<corpus>-<model>-<tokenizer>), or continue
    the run there (resume). given: the settings the user typed, for the resume rule (runs.resume_configs;
    None: every field). nproc > 1: relaunch the command line argv (charlm's arguments, "train" first) under
    torchrun through launch(the torchrun command line), which does not return. Ctrl-C, SIGTERM and SIGHUP stop it in every phase (RunSignals): in set-up at once, with
    nothing to save; once training, saved at the step it is at; either way TrainingInterrupted says what
    last.safetensors holds. settle_signals: once training ends, ignore them (a process that only has to exit; a Python
    caller keeps its handlers)."""
    me = distributed.env()
    signals = RunSignals(
        *stop_signals(me.enabled),
        notify=lambda signum, saving: (on_event or (lambda e: None))(Stopping(signum=signum, saving=saving)),
        settle=settle_signals and not me.enabled,  # (under torchrun, SIGTERM must still stop a rank that hangs)
    )
    found: list[Path] = []  # the run directory, once known
    try:
        with signals:  # from here to the end, a signal stops the run: at once in set-up, saved once training
            return _train(
                corpus, model_cfg, train_cfg, out, resume, nproc, given, on_event, (launch, argv), signals, found
            )
    except SetupInterrupted as e:
        out, saved = (found or [None])[0], None
        if out is not None and resume and (out / checkpoint.LAST).is_file():
            try:
                saved = checkpoint.read_header(out / checkpoint.LAST).step
            except CheckpointError:
                pass
        raise TrainingInterrupted(None, e.signum, out_dir=out, saved_step=saved) from None


def _train(corpus, model_cfg, train_cfg, out, resume, nproc, given, on_event, relaunch, signals, found) -> Result:
    me = distributed.env()
    out, resumed = _run_dir(corpus, model_cfg, train_cfg, out, resume, nproc or me.world_size, given)
    if resumed:
        model_cfg, train_cfg = resumed.model_cfg, resumed.train_cfg
    found.append(out)
    check_writable(out)
    device = pick_device(train_cfg.device)
    memory.check_fits(model_cfg, train_cfg, device, nproc or me.world_size)  # before any work
    if nproc is not None:
        if me.enabled:
            raise ConfigError("--nproc starts torchrun itself: drop it when running under torchrun")
        if nproc < 1:
            raise ConfigError(f"--nproc must be at least 1, got {nproc}")
        if nproc > 1:  # everything above was checked once, here; now the same command, N times
            torchrun(nproc, out, device, *relaunch)
    # rank 0 holds the run directory until it exits: a second training into it is refused meanwhile
    lock = runs.RunLock(out) if me.is_main else None
    try:
        if lock and not resume:
            check_unused(out)  # again, now under the lock: another run may have finished in it since
        run = Trainer(corpus, model_cfg, train_cfg, out, resume=resumed or False, on_event=on_event, signals=signals)
        return _with_usual_speed(run, run.fit(), device == "cpu" and me.is_main)
    except files.WriteError as e:
        if _inside(e.path, out) and (out / checkpoint.LAST).exists():
            raise files.WriteError(
                f"{e}; the checkpoints already in it are intact: free some space, then resume with: "
                f"{resume_command(corpus, out)}",
                e.path,
            ) from None
        raise
    finally:
        distributed.close()
        if lock:
            lock.release()


def _inside(path: Path, directory: Path) -> bool:
    try:
        return directory.resolve() in path.resolve().parents
    except (OSError, RuntimeError):  # a loop of symbolic links (RuntimeError before Python 3.13)
        return False


SPEED_STEPS = 50  # a run's speed is recorded, and compared, from this many steps: a short run's is noise


def _with_usual_speed(run: Trainer, result: Result, record: bool) -> Result:
    """result with the fastest this machine has trained the same set-up (runs.usual_speed), for the summary to
    compare: recorded on the CPU, by the main process, from runs of SPEED_STEPS steps or more."""
    if not record or len(run.speeds) < SPEED_STEPS:
        return result
    usual = runs.usual_speed(_speed_key(run), result.tokens_per_s, cache_dir() / "speeds.json")
    return dataclasses.replace(result, usual_tokens_per_s=usual)


def _speed_key(run: Trainer) -> str:
    """What a training speed depends on: the CPU, the threads, the model and the batch."""
    import torch

    m, t = run.model_cfg, run.cfg
    return (
        f"{cpu_name()} · {torch.get_num_threads()} threads · {m.describe()} · vocab {m.vocab_size} · "
        f"batch {t.batch_size}×{t.grad_accum} · {t.precision}"
    )


def _run_dir(corpus, model_cfg, train_cfg, out, resume, world_size, given) -> tuple[Path, Resumed | None]:
    """(the run directory, None) for a new run, free and unused; or (the run's directory, the run to resume
    with the settings the resume rule lets change: resume.resume_run, the one place that decides)."""
    main, out = distributed.env().is_main, None if out is None else Path(out)
    if not resume:
        out = out or runs.default_out(corpus, model_cfg.kind, train_cfg.tokenizer)
        if main:
            runs.check_free(out)
        check_unused(out)
        return out, None
    out = out or runs.latest_run(corpus, model_cfg.kind, train_cfg.tokenizer)
    if main:  # in use: say so first (what follows reads a run that is being written)
        runs.check_free(out)
    if not checkpoint.last_of(out):
        raise ConfigError(
            f"--resume: no checkpoint at {out / checkpoint.LAST}; train one first, or point --out at an existing run"
        )
    return out, resume_run(out, corpus, model_cfg, train_cfg, world_size, given)


def resume_command(corpus: str, out: Path) -> str:
    """The command that continues the run in out, quoted for the shell."""
    return f"charlm train {shell_quote(corpus)} --out {shell_quote(out)} --resume"


def check_unused(out: Path) -> None:
    if last := checkpoint.last_of(out):
        if last.name == checkpoint.OLD_LAST:  # (--resume would refuse it: see resume.resume_run)
            raise ConfigError(f"{out} already holds a run of an earlier charlm ({last.name}): choose another --out")
        raise ConfigError(f"{out} already holds a run: add --resume to continue it, or choose another --out")
    # another run's files without a last checkpoint (a run killed before its first one, or copied in): a new
    # run would rewrite them and mix its own lines into that log
    names = (checkpoint.BEST, checkpoint.OLD_BEST, "metrics.jsonl")
    left = [n for n in names if os.path.lexists(out / n) and _not_empty(out / n)]
    if left:
        raise ConfigError(
            f"{out} holds {' and '.join(left)} of another run (but no {checkpoint.LAST} to resume): move "
            f"{'them' if len(left) > 1 else 'it'} away, or choose another --out"
        )


def _not_empty(path: Path) -> bool:
    try:  # (a directory or a FIFO of that name is no run's: writing there fails, in one line, when it comes)
        return path.is_file() and path.stat().st_size > 0
    except OSError:
        return False


def torchrun(
    nproc: int, out: Path, device: str, launch: Callable[[list[str]], NoReturn] | None, argv: list[str] | None
) -> NoReturn:
    """Replace this process by torchrun (PyTorch's launcher) running the command line argv (charlm's
    arguments) in nproc processes: the same arguments minus --nproc, with the run directory made explicit."""
    import torch

    if device == "cuda" and nproc > torch.cuda.device_count():
        raise ConfigError(f"--nproc {nproc}: only {torch.cuda.device_count()} GPU(s) visible; use one process per GPU")
    if launch is None or not argv or argv[0] != "train":
        raise ConfigError(
            "--nproc works from the command line only; run torchrun --nproc-per-node N -m charlm train ..."
        )
    args, skip = [], False
    for arg in argv:
        if skip or arg == "--nproc" or arg.startswith("--nproc="):
            skip = arg == "--nproc"
            continue
        args.append(arg)
    if "--out" not in args and not any(a.startswith("--out=") for a in args):
        args += ["--out", str(out)]
    launch(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={nproc}",
            "-m",
            "charlm",
            *args,
        ]
    )


def exec_process(cmd: list[str]) -> NoReturn:
    """Become cmd (os.execv): what `charlm train --nproc N` does with the torchrun command line."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(cmd[0], cmd)
