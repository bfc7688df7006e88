"""Continuing a run: what it continues from, read and decided once (resume_run: last.safetensors read and checked, the
one resume rule of storage/runs.py applied, the corpus checked to be the run's), and putting that state back into a
fresh trainer (restore_state: weights, optimizer, random states; best_so_far; drop_metrics_beyond). commands.train
decides before any work and hands the Resumed to the Trainer; a Trainer made with resume=True decides itself.
A state that does not fit this model and machine (a crafted or damaged last.safetensors) is a CheckpointError that
names the file.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from itertools import zip_longest
from pathlib import Path

import torch

from charlm import files
from charlm.config import ModelConfig, TrainConfig
from charlm.data import corpus_sha256
from charlm.errors import CheckpointError, ConfigError
from charlm.settings import shown
from charlm.storage import checkpoint, runs
from charlm.storage.checkpoint import Saved


@dataclass(frozen=True)
class Resumed:
    """A run to continue: its last.safetensors, read and checked, and the configs it goes on with (the saved ones, with
    what the resume rule let change)."""

    path: Path  # out/last.safetensors
    saved: Saved
    model_cfg: ModelConfig
    train_cfg: TrainConfig


def resume_run(
    out: str | Path,
    corpus: str | Path,
    model_cfg: ModelConfig,
    train_cfg: TrainConfig,
    world_size: int = 1,
    given: set[str] | None = None,
) -> Resumed:
    """The run in out to continue with these settings: last.safetensors read (tensors and all) and checked to hold a
    training state, the resume rule applied (runs.resume_configs; given: the settings the user typed, None:
    every field), and the corpus checked by its hash (another text would fail later with a less helpful
    message; the trainer passes the same hash on, so the corpus is read for hashing once)."""
    path = Path(out) / checkpoint.LAST
    if not path.exists() and (old := Path(out) / checkpoint.OLD_LAST).exists():
        raise CheckpointError(
            f"{old} was written by an earlier charlm (before safetensors): it can still be sampled, evaluated and "
            "compressed, but not resumed; train a new run with another --out"
        )
    saved = checkpoint.read(path)
    saved.require_training_state(path)
    model_cfg, train_cfg = runs.resume_configs(Path(out), saved, model_cfg, train_cfg, world_size, given)
    if saved.corpus.sha256 != corpus_sha256(corpus):
        raise ConfigError(
            f"{corpus} is not the text this run was trained on: resume with that file, or use a new --out"
        )
    return Resumed(path, saved, model_cfg, train_cfg)


def restore_state(resumed: Resumed, model, optimizer, data_gen: torch.Generator, scaler, device: str, dist) -> None:
    """The saved weights, optimizer state, random states (this rank's, under torchrun) and gradient scaler,
    into a freshly built model and optimizer: the run continues exactly."""
    path, saved = resumed.path, resumed.saved
    model.load_state_dict(saved.model)
    _load_optimizer(optimizer, saved.optimizer, path)
    ranks = saved.rng.get("ranks") if isinstance(saved.rng, dict) else None
    if dist.enabled and not (isinstance(ranks, list) and len(ranks) == dist.world_size):
        raise _unusable(path, "no random state for each process")
    rng = ranks[dist.rank] if dist.enabled else saved.rng
    _set_rng(data_gen, rng, device, path)
    if scaler and saved.scaler:
        try:
            scaler.load_state_dict(saved.scaler)
        except (ValueError, KeyError, TypeError, RuntimeError, AttributeError):
            raise _unusable(path, "a damaged gradient scaler state") from None


def best_so_far(resumed: Resumed) -> tuple[float | None, float | None]:
    """(the best validation loss, its bits per character) of the run: last.safetensors's, or those of a best.safetensors written
    after it (a kill fell between the two: see charlm.training.trainer's docstring). A best.safetensors of another
    run is refused: it would be kept as the run's best, and `charlm sample` of the run would use it."""
    path, saved = resumed.path, resumed.saved
    best_loss, best_bpc = saved.best_val_loss, saved.best_val_bpc
    best = path.parent / checkpoint.BEST
    if not best.exists():
        return best_loss, best_bpc
    try:
        other = checkpoint.read_header(best)
    except CheckpointError as e:  # (its message says last.safetensors is there: move best.safetensors away)
        raise CheckpointError(f"{e}, then resume (the next evaluation writes a new best.safetensors)") from None
    if (other.model_config, other.tokenizer, other.corpus and other.corpus.sha256) != (
        saved.model_config,
        saved.tokenizer,
        saved.corpus.sha256,
    ):
        raise CheckpointError(
            f"{best} is not this run's: it holds a {other.model_config.describe()} with another tokenizer or "
            f"corpus than {path}; move it away, then resume"
        )
    if best.stat().st_mtime_ns > path.stat().st_mtime_ns:
        if other.best_val_loss is not None and (best_loss is None or other.best_val_loss < best_loss):
            best_loss, best_bpc = other.best_val_loss, other.best_val_bpc
    return best_loss, best_bpc


def drop_metrics_beyond(out_dir: Path, step: int) -> None:
    """metrics.jsonl as last.safetensors, the commit record, knows it: the lines of later steps, which a process
    killed before it wrote last.safetensors left, go (the run writes them again); every other line stays as it is
    (plot skips what is not an evaluation). Read a line at a time: the file may be large. (A new run: step 0
    drops them all, the log of a run killed before its first last.safetensors.)"""
    log = out_dir / "metrics.jsonl"
    if not os.path.lexists(log):
        return
    if why := files.not_regular(log):
        raise ConfigError(f"{log} is {why}, not a regular file: remove it, or choose another --out")

    def kept(f):
        for line in _lines(f):
            at = _step_of(line)
            if at is not None and at > step:
                continue
            if not line.endswith(b"\n"):  # the last line, cut short by a kill: nothing can be appended to it
                if at is None:
                    continue
                line += b"\n"
            yield line

    try:
        with open(log, "rb") as f, open(log, "rb") as g:
            changed = any(a != b for a, b in zip_longest(_lines(f), kept(g)))
        if changed:
            with open(log, "rb") as f:
                files.atomic_write(log, lambda out: out.writelines(kept(f)))
    except OSError as e:
        raise ConfigError(f"cannot read {log}: {e.strerror}") from None


def _unusable(path: Path, what: str) -> CheckpointError:
    return CheckpointError(
        f"{path} cannot be resumed: it holds {what}; sample from it, or train a new run with another --out"
    )


def _load_optimizer(optimizer, state, path: Path) -> None:
    """optimizer.load_state_dict(state), with every tensor of the state checked against its parameter: torch
    takes a state of the wrong shape and fails (or trains on garbage) only at the next step. The settings of
    each group (betas, weight decay...) stay the ones this run's config gives."""
    settings = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    try:
        optimizer.load_state_dict(state)
    except (ValueError, KeyError, TypeError, IndexError, RuntimeError, AttributeError, ConfigError) as e:
        raise _unusable(path, f"an optimizer state that does not fit this model ({type(e).__name__})") from None
    for group, kept in zip(optimizer.param_groups, settings):
        group.update(kept)
    for o in optimizer.optimizers:
        params = {p for g in o.param_groups for p in g["params"]}
        for key in [k for k in o.state if k not in params]:  # state of no parameter of this model
            del o.state[key]
        for p, entry in o.state.items():
            if not isinstance(entry, dict):
                raise _unusable(path, "a damaged optimizer state")
            for name, value in entry.items():
                ok = isinstance(value, torch.Tensor) and value.is_floating_point()
                ok = ok and (value.numel() == 1 if name == "step" else value.shape == p.shape)
                if not ok or not bool(torch.isfinite(value).all()) or name == "step" and value.item() < 0:
                    raise _unusable(path, f"an optimizer state that does not fit this model ({shown(name)})")


def _set_rng(data_gen: torch.Generator, rng, device: str, path: Path) -> None:
    """The random states of a run (its batches', torch's for dropout, CUDA's), each checked before use."""
    if not isinstance(rng, dict):
        raise _unusable(path, "a damaged random state")
    for name, generator in (("data", data_gen), ("torch", None)):
        state = rng.get(name)
        if not (isinstance(state, torch.Tensor) and state.dtype == torch.uint8 and state.shape == (_RNG_BYTES,)):
            raise _unusable(path, f"a damaged random state ({name})")
        try:
            (generator or torch.Generator()).set_state(state)
        except (RuntimeError, TypeError, ValueError):
            raise _unusable(path, f"a damaged random state ({name})") from None
    torch.set_rng_state(rng["torch"])
    if device == "cuda" and isinstance(rng.get("cuda"), torch.Tensor):
        try:
            torch.cuda.set_rng_state(rng["cuda"])
        except (RuntimeError, TypeError, ValueError):
            raise _unusable(path, "a damaged random state (cuda)") from None


_RNG_BYTES = torch.Generator().get_state().numel()  # a CPU generator's state: 5056 bytes


def _lines(f, longest: int = 1 << 20):
    """The lines of a binary file, none longer than `longest` bytes (a longer one comes in pieces)."""
    return iter(lambda: f.readline(longest), b"")


def _step_of(line: bytes | str) -> int | None:
    """The step of a metrics.jsonl line; None for a line that is not one (cut short by a kill, not UTF-8...)."""
    try:
        step = json.loads(line).get("step")
    except (ValueError, AttributeError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None
    return step if isinstance(step, int) and not isinstance(step, bool) else None
