"""Checkpoints: one self-contained file holding weights, configs, tokenizer (as JSON), training state
and metrics. Written atomically (temp file + rename) and loaded with weights_only=True: loading never
executes code from the file.
"""

from __future__ import annotations

import pickle
import warnings
import zipfile
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch

from charlm import files
from charlm.config import ConfigError, ModelConfig, TrainConfig
from charlm.models import build_model
from charlm.tokenizer import tokenizer_from_json

FORMAT = "charlm-checkpoint"
VERSION = 2  # 2: "no evaluation yet" is None (v1 wrote float("inf")); v1 files are converted on read


class CheckpointError(Exception):
    """A checkpoint that cannot be used, with a message that says why."""


def save(saved: Saved | dict, path: str | Path) -> None:
    """Write a checkpoint to path atomically: readers see the old file or the new one, never half of one.
    A full disk is a files.WriteError naming the directory; the file already at path stays as it was."""
    payload = saved.to_payload() if isinstance(saved, Saved) else saved
    files.atomic_write(path, lambda f: torch.save(payload, f), parents=True)


def resolve(path: str | Path) -> Path:
    """A checkpoint file, or a run directory (its best.pt, else last.pt)."""
    p = Path(path)
    if not p.exists():
        raise CheckpointError(f"no such checkpoint: {p}")
    if p.is_dir():
        for name in ("best.pt", "last.pt"):
            if (p / name).is_file():
                return p / name
        raise CheckpointError(f"{p} holds no checkpoint (best.pt or last.pt): train one with 'charlm train'")
    if not p.is_file():  # a FIFO or a device: opening it could wait for ever
        raise CheckpointError(f"{p} is not a regular file: give a checkpoint file or a run directory")
    return p


@dataclass(kw_only=True)
class Corpus:
    """The text a run was trained on."""

    name: str
    sha256: str
    train_tokens: int
    val_tokens: int
    chars_per_token: float
    path: str | None = None  # the absolute path the trainer read (None in checkpoints written before it was kept)


@dataclass(kw_only=True)
class Saved:
    """Everything a checkpoint file holds, typed: the one schema, written by the trainer and read by
    every command. The training state (optimizer, rng, corpus) is what a resume needs beyond the rest."""

    run_name: str
    model_config: ModelConfig
    train_config: TrainConfig
    tokenizer: str  # the tokenizer as JSON (never pickled)
    model: dict  # the plain module's state dict
    step: int
    train_seconds: float
    best_val_loss: float | None  # None: no evaluation yet
    best_val_bpc: float | None
    params: int | None = None
    device: str | None = None
    metrics: dict | None = None  # the evaluation this file was written at
    corpus: Corpus | None = None
    optimizer: dict | None = None
    rng: dict | None = None  # data and torch generators (and cuda); under torchrun "ranks": one per rank
    scaler: dict | None = None  # fp16's GradScaler
    world_size: int = 1  # processes that trained it: each rank's batches are part of the run
    weights_sha256: list[str] | None = None  # every rank's weights digest (several processes only)

    def to_payload(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["model_config"], d["train_config"] = self.model_config.to_dict(), self.train_config.to_dict()
        d["corpus"] = asdict(self.corpus) if self.corpus else None
        return {"format": FORMAT, "version": VERSION, **d}

    @classmethod
    def from_payload(cls, data: dict, path: Path) -> Saved:
        """Check every field's type (a file's content is input like any other) and build the schema."""
        if data.get("version") == 1:
            data = _from_v1(data)
        missing = [k for k in REQUIRED if k not in data]
        if missing:
            raise CheckpointError(f"{path} is an incomplete charlm checkpoint (missing {', '.join(missing)})")
        for name, types in TYPES.items():
            value = data.get(name)
            if value is not None and (not isinstance(value, types) or isinstance(value, bool) and bool not in types):
                raise CheckpointError(
                    f"{path} is a damaged charlm checkpoint ({name} should be "
                    f"{' or '.join(t.__name__ for t in types)}, not {type(value).__name__})"
                )
        if (data["best_val_loss"] is None) != (data["best_val_bpc"] is None):
            raise CheckpointError(
                f"{path} is a damaged charlm checkpoint (best_val_loss and best_val_bpc "
                "should both be numbers, or both be empty)"
            )
        odd = [k for k, v in (data.get("metrics") or {}).items() if not isinstance(v, _NUMBER) or isinstance(v, bool)]
        if odd:
            raise CheckpointError(
                f"{path} is a damaged charlm checkpoint (metric {odd[0]} should be a number, "
                f"not {type(data['metrics'][odd[0]]).__name__})"
            )
        try:
            model_config = ModelConfig.from_dict(data["model_config"]).validate()
            train_config = TrainConfig.from_dict(data["train_config"]).validate()
            corpus = Corpus(**data["corpus"]) if data.get("corpus") is not None else None
        except (ConfigError, TypeError) as e:
            raise CheckpointError(f"{path} is an incompatible charlm checkpoint ({_last_words(e)})") from None
        known = {f.name for f in fields(cls)}
        rest = {k: v for k, v in data.items() if k in known and k not in ("model_config", "train_config", "corpus")}
        return cls(
            **{
                **rest,
                "run_name": data.get("run_name") or path.parent.name,
                "model_config": model_config,
                "train_config": train_config,
                "corpus": corpus,
            }
        )

    def require_training_state(self, path: Path) -> None:
        missing = [k for k in ("optimizer", "rng", "corpus") if getattr(self, k) is None]
        if missing:
            raise CheckpointError(f"{path} is an incomplete charlm checkpoint (missing {', '.join(missing)})")


# what every checkpoint holds, and the types of the plain values (checked on read)
REQUIRED = (
    "model_config",
    "train_config",
    "tokenizer",
    "model",
    "step",
    "train_seconds",
    "best_val_loss",
    "best_val_bpc",
)
_NUMBER = (int, float)
TYPES = {
    "run_name": (str,),
    "model_config": (dict,),
    "train_config": (dict,),
    "tokenizer": (str,),
    "model": (dict,),
    "step": (int,),
    "train_seconds": _NUMBER,
    "best_val_loss": _NUMBER,
    "best_val_bpc": _NUMBER,
    "params": (int,),
    "device": (str,),
    "metrics": (dict,),
    "corpus": (dict,),
    "optimizer": (dict,),
    "rng": (dict,),
    "scaler": (dict,),
    "world_size": (int,),
    "weights_sha256": (list,),
}


def _from_v1(data: dict) -> dict:
    """A format-1 file as format 2: inf meant "no evaluation yet", and the process count lived in a
    "distributed" dict."""
    data = dict(data)
    for key in ("best_val_loss", "best_val_bpc"):
        if isinstance(data.get(key), float) and data[key] == float("inf"):
            data[key] = None
    dist = data.pop("distributed", None)
    if isinstance(dist, dict):
        data["world_size"], data["weights_sha256"] = dist.get("world_size", 1), dist.get("weights_sha256")
    return data


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
            raise CheckpointError(
                f"{p} is not a charlm checkpoint: it holds Python objects, which are never loaded (only tensors and plain data)"
            ) from None
        raise CheckpointError(f"{p} is not a readable charlm checkpoint ({_last_words(e)})") from None
    except Exception as e:  # zip, storage and OS errors alike: the file is unusable
        raise CheckpointError(f"{p} is not a readable charlm checkpoint ({_last_words(e)})") from None


def _last_words(e: Exception) -> str:
    # the start of the message, on one line (load_state_dict's first line alone says nothing)
    text = " ".join(line.strip() for line in str(e).splitlines() if line.strip())
    return f"{type(e).__name__}: {text[:160]}" if text else type(e).__name__


def read(path: str | Path, map_location="cpu") -> Saved:
    """The checkpoint's contents, typed and checked for consistency (config, weights and tokenizer agree),
    without building a model. weights_only=True: tensors and plain containers only, so a crafted file
    cannot run code while loading."""
    return _checked(resolve(path), map_location)[0]


def _checked(p: Path, map_location) -> tuple[Saved, object]:
    """(the contents, the tokenizer), after every check that needs no real model."""
    saved = _typed(p, map_location)
    _check_weights(saved, p)
    try:
        tokenizer = tokenizer_from_json(saved.tokenizer)
    except Exception as e:
        raise CheckpointError(f"{p} is an incompatible charlm checkpoint ({_last_words(e)})") from None
    if tokenizer.vocab_size != saved.model_config.vocab_size:  # else an IndexError in the middle of a stream
        raise CheckpointError(
            f"{p} is an inconsistent charlm checkpoint: its tokenizer has {tokenizer.vocab_size} "
            f"tokens, its model {saved.model_config.vocab_size}; train again or use another checkpoint"
        )
    if tokenizer.kind != saved.train_config.tokenizer:
        raise CheckpointError(
            f"{p} is an inconsistent charlm checkpoint: it holds a {tokenizer.kind} tokenizer, "
            f"its config says {saved.train_config.tokenizer}; train again or use another checkpoint"
        )
    return saved, tokenizer


def _check_weights(saved: Saved, p: Path) -> None:
    """The stored tensors must be exactly what the config describes, compared on a model built on the
    meta device (shapes, no memory). Each must also hold its own data (no zero-stride expansion), so the
    model loaded later is never larger than the file: a crafted config cannot make charlm allocate."""
    with torch.device("meta"):
        expected = build_model(saved.model_config).state_dict()
    m = saved.model_config
    bad = f"{p} is an inconsistent charlm checkpoint: its weights do not match its config ({m.kind}, layers {m.n_layers}, d_model {m.d_model}"
    missing = sorted(expected.keys() - saved.model.keys())
    extra = sorted(map(str, saved.model.keys() - expected.keys()))  # a crafted file's keys need not be strings
    if missing or extra:
        what = "; ".join(
            ([f"missing {', '.join(missing[:3])}"] if missing else [])
            + ([f"unexpected {', '.join(extra[:3])}"] if extra else [])
        )
        raise CheckpointError(f"{bad}: {what})")
    for name, want in expected.items():
        t = saved.model[name]
        if not isinstance(t, torch.Tensor):
            raise CheckpointError(f"{bad}: {name} is not a tensor)")
        if t.shape != want.shape:
            raise CheckpointError(f"{bad}: {name} is {tuple(t.shape)}, the config needs {tuple(want.shape)})")
        if t.untyped_storage().nbytes() < t.numel() * t.element_size():
            raise CheckpointError(f"{bad}: {name} does not hold its {t.numel():,} values)")


def _typed(p: Path, map_location) -> Saved:
    data = _read(p, map_location)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise CheckpointError(f"{p} is not a charlm checkpoint (a PyTorch file written by something else)")
    version = data.get("version")
    if not isinstance(version, int):
        raise CheckpointError(f"{p} is not a charlm checkpoint (no format version)")
    if version > VERSION:
        raise CheckpointError(f"{p} was written by a newer charlm (format {version}): upgrade charlm")
    return Saved.from_payload(data, p)


@dataclass
class Checkpoint:
    """A loaded checkpoint: a ready model (in eval mode) plus everything recorded beside it."""

    path: Path
    model: torch.nn.Module
    tokenizer: object
    saved: Saved

    @property
    def model_config(self) -> ModelConfig:
        return self.saved.model_config

    @property
    def train_config(self) -> TrainConfig:
        return self.saved.train_config

    @property
    def name(self) -> str:
        return self.saved.run_name


def load(path: str | Path, device: str = "cpu") -> Checkpoint:
    p = resolve(path)
    saved, tokenizer = _checked(p, map_location=device)
    try:  # the shapes are known to fit: what is left to fail here is the file's fault too
        model = build_model(saved.model_config)
        model.load_state_dict(saved.model)
    except Exception as e:
        raise CheckpointError(f"{p} is an incompatible charlm checkpoint ({_last_words(e)})") from None
    model.to(device).eval()
    return Checkpoint(p, model, tokenizer, saved)
