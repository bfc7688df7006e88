"""Checkpoints: one self-contained file holding weights, configs, tokenizer (as JSON), training state
and metrics. Written atomically (temp file + rename) and loaded with weights_only=True: loading never
executes code from the file.
"""

from __future__ import annotations

import os
import pickle
import tempfile
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
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save({"format": FORMAT, "version": VERSION, **payload}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
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


def load_raw(path: str | Path, map_location="cpu") -> dict:
    p = resolve(path)
    try:
        data = torch.load(p, map_location=map_location, weights_only=True)
    except (RuntimeError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile, OSError, ValueError, KeyError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"{p} is not a readable charlm checkpoint (corrupt, truncated or foreign: {first[:120]})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise CheckpointError(f"{p} is not a charlm checkpoint")
    if data.get("version", 0) > VERSION:
        raise CheckpointError(f"{p} was written by a newer charlm (format {data['version']}): upgrade charlm")
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
        raise CheckpointError(f"{p} is an incompatible charlm checkpoint ({type(e).__name__}: {str(e).splitlines()[0][:120]})") from None
    model.to(device).eval()
    return Checkpoint(p, model, model_cfg, train_cfg, tokenizer, data)
