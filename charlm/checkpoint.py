"""Checkpoints: one self-contained file holding weights, configs, tokenizer (as JSON), training state
and metrics. Written atomically (temp file + rename) and loaded with weights_only=True: loading never
executes code from the file.
"""

from __future__ import annotations

import os
import pickle
import secrets
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch

from charlm.config import ModelConfig, TrainConfig
from charlm.models import build_model

FORMAT = "charlm-checkpoint"
VERSION = 1


class CheckpointError(Exception):
    """A checkpoint that cannot be used, with a message that says why."""


def save(payload: dict, path: str | Path) -> None:
    """Write payload to path atomically: readers see the old file or the new one, never half of one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # open(..., "xb") rather than mkstemp: the file gets the usual umask permissions, not 0600
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "xb") as f:
            torch.save({"format": FORMAT, "version": VERSION, **payload}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def resolve(path: str | Path, which: str = "best") -> Path:
    """A checkpoint file, or a run directory (its best.pt, else last.pt)."""
    p = Path(path)
    if not p.exists():
        raise CheckpointError(f"no such checkpoint: {p}")
    if p.is_dir():
        for name in (f"{which}.pt", "best.pt", "last.pt"):
            if (p / name).is_file():
                return p / name
        raise CheckpointError(f"{p} holds no checkpoint (best.pt or last.pt): train one with 'charlm train'")
    return p


# what every checkpoint holds; resuming also needs the training state
REQUIRED = ("model_config", "train_config", "tokenizer", "model", "step", "train_seconds", "best_val_loss", "best_val_bpc")
TRAINING_STATE = ("optimizer", "rng", "corpus")


def _read(p: Path, map_location) -> object:
    """torch.load with weights_only=True, after checks that turn every failure into a clear error."""
    try:
        with open(p, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise CheckpointError(f"cannot read {p}: {e.strerror}") from None
    if magic != b"PK\x03\x04":  # torch.save writes a zip archive; anything else is not ours
        raise CheckpointError(f"{p} is not a charlm checkpoint (not a PyTorch archive)")
    try:
        with zipfile.ZipFile(p) as z:
            bad = z.testzip()  # torch.load skips the CRCs: a damaged weight would load silently
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as e:
        raise CheckpointError(f"{p} is truncated or corrupt ({e}); train again or use another checkpoint") from None
    if bad is not None:
        raise CheckpointError(f"{p} is corrupt ({bad} fails its checksum); train again or use another checkpoint")
    try:
        with warnings.catch_warnings():  # torch's warnings would be extra lines on the user's terminal
            warnings.simplefilter("ignore")
            return torch.load(p, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        if "GLOBAL" in str(e):  # weights_only refused a class or function: the file wants to run code
            raise CheckpointError(f"{p} is not a charlm checkpoint: it holds Python objects, which are never loaded (only tensors and plain data)") from None
        raise CheckpointError(f"{p} is not a readable charlm checkpoint ({_last_words(e)})") from None
    except Exception as e:  # zip, storage and OS errors alike: the file is unusable
        raise CheckpointError(f"{p} is not a readable charlm checkpoint ({_last_words(e)})") from None


def _last_words(e: Exception) -> str:
    # the start of the message, on one line (load_state_dict's first line alone says nothing)
    text = " ".join(line.strip() for line in str(e).splitlines() if line.strip())
    return f"{type(e).__name__}: {text[:160]}" if text else type(e).__name__


def load_raw(path: str | Path, map_location="cpu", required: tuple[str, ...] = REQUIRED) -> dict:
    """The checkpoint's contents as plain data. weights_only=True: tensors and plain containers only,
    so a crafted file cannot run code while loading."""
    p = resolve(path)
    data = _read(p, map_location)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise CheckpointError(f"{p} is not a charlm checkpoint (a PyTorch file written by something else)")
    version = data.get("version")
    if not isinstance(version, int):
        raise CheckpointError(f"{p} is not a charlm checkpoint (no format version)")
    if version > VERSION:
        raise CheckpointError(f"{p} was written by a newer charlm (format {version}): upgrade charlm")
    missing = [k for k in required if k not in data]
    if missing:
        raise CheckpointError(f"{p} is an incomplete charlm checkpoint (missing {', '.join(missing)})")
    return data


@dataclass
class Checkpoint:
    """A loaded checkpoint: a ready model (in eval mode) plus everything recorded beside it."""

    path: Path
    model: torch.nn.Module
    model_config: ModelConfig
    train_config: TrainConfig
    tokenizer: object
    data: dict

    @property
    def name(self) -> str:
        return self.data.get("run_name") or self.path.parent.name


def load(path: str | Path, device: str = "cpu") -> Checkpoint:
    from charlm.tokenizer import tokenizer_from_json

    p = resolve(path)
    data = load_raw(p, map_location=device)
    try:
        model_cfg = ModelConfig.from_dict(data["model_config"]).validate()
        train_cfg = TrainConfig.from_dict(data["train_config"])
        tokenizer = tokenizer_from_json(data["tokenizer"])
        model = build_model(model_cfg)
        model.load_state_dict(data["model"])
    except Exception as e:  # any inconsistency inside the file is the file's fault, reported in one line
        raise CheckpointError(f"{p} is an incompatible charlm checkpoint ({_last_words(e)})") from None
    model.to(device).eval()
    return Checkpoint(p, model, model_cfg, train_cfg, tokenizer, data)
