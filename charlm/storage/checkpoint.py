"""Checkpoints: one self-contained safetensors file holding weights, configs, tokenizer (as JSON), training
state and metrics (the layout: safetensors_file.py). Written atomically (temp file + rename); never executes
code from the file when reading it.

Reading has three depths, all checked the same way:
  read_header(path)  what the file says of itself, without torch (charlm info, charlm runs)
  read(path)         and its tensors (a resumed run), via the safetensors library (memory-mapped)
  load(path)         and a ready model (every command that runs one)
The weights' shapes are checked against the config on the header, before any tensor is allocated.
Checkpoints of charlm before safetensors (best.pt, last.pt: torch.save's zip archives) are still read, by
safe_pickle.py and torch.load(weights_only=True), for every command but a resume (see docs/train.md).
Over ~450 lines on purpose: the one owner of the format, its schema and every check on what a file holds,
read in one place (the byte layouts live in safetensors_file.py, safe_pickle.py and quantized.py).
"""

from __future__ import annotations

import math
import os
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from charlm import files
from charlm.config import ModelConfig, TrainConfig
from charlm.errors import CheckpointError, ConfigError
from charlm.models import build_model, param_shapes
from charlm.settings import shown
from charlm.storage import safetensors_file
from charlm.storage.quantized import check_quantized, dequantized
from charlm.storage.safe_pickle import TensorInfo, archive_values, last_words, load_tensors, open_archive, read_pickle
from charlm.tokenizer import tokenizer_from_json

if TYPE_CHECKING:
    import torch

FORMAT = "charlm-checkpoint"
VERSION = 3  # 3: safetensors; 2: "no evaluation yet" is None (v1 wrote float("inf")); v1 files are converted on read
BEST, LAST = "best.safetensors", "last.safetensors"  # a run directory's checkpoints: its best, and where it got to
OLD_BEST, OLD_LAST = "best.pt", "last.pt"  # the same, as charlm wrote them before safetensors (read, never written)


def save(saved: Saved | dict, path: str | Path) -> None:
    """Write a checkpoint to path atomically: readers see the old file or the new one, never half of one.
    A full disk is a files.WriteError naming the directory; the file already at path stays as it was."""
    payload = saved.to_payload() if isinstance(saved, Saved) else saved
    data = safetensors_file.to_bytes(payload)
    files.atomic_write(path, lambda f: f.write(data), parents=True)


def last_of(run: Path) -> Path | None:
    """A run directory's last checkpoint (LAST, else an older charlm's OLD_LAST); None: it has none."""
    return next((run / n for n in (LAST, OLD_LAST) if os.path.lexists(run / n)), None)


def resolve(path: str | Path) -> Path:
    """A checkpoint file, or a run directory (its best, else its last; an older charlm's best.pt, last.pt after)."""
    p = Path(path)
    if not str(path).strip():  # Path("") is ".": an empty name would open whatever run is in this directory
        raise CheckpointError("the checkpoint name is empty: give a run's name, its directory or a checkpoint file")
    if not p.exists():
        raise CheckpointError(f"no such checkpoint: {p}")
    if p.is_dir():
        for name in (BEST, LAST, OLD_BEST, OLD_LAST):
            if (p / name).is_file():
                return p / name
        raise CheckpointError(f"{p} holds no checkpoint ({BEST} or {LAST}): train one with 'charlm train'")
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
    # charlm compress: the weights stored as int8/int4 with their scales (see quantized.py), taken
    # out of `model`; and what was done to the model, as plain values (its source, bits, what was dropped)
    quantized: dict | None = None
    compressed: dict | None = None

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
        missing = [
            k for k in REQUIRED if k not in data or data[k] is None and k not in ("best_val_loss", "best_val_bpc")
        ]
        if missing:
            raise CheckpointError(f"{path} is an incomplete charlm checkpoint (missing {', '.join(missing)})")
        corpus = data.get("corpus")
        if problem := _mistyped(data, TYPES) or corpus and _mistyped(corpus, CORPUS_TYPES, "corpus ", required=True):
            raise CheckpointError(f"{path} is a damaged charlm checkpoint ({problem})")
        if (data["best_val_loss"] is None) != (data["best_val_bpc"] is None):
            raise CheckpointError(
                f"{path} is a damaged charlm checkpoint (best_val_loss and best_val_bpc "
                "should both be numbers, or both be empty)"
            )
        if problem := _out_of_range(data):
            raise CheckpointError(f"{path} is a damaged charlm checkpoint ({problem})")
        if problem := check_compressed(data.get("compressed")):
            raise CheckpointError(f"{path} is a damaged charlm checkpoint (its compressed record: {problem})")
        try:
            model_config = ModelConfig.from_dict(data["model_config"]).validate()
            train_config = TrainConfig.from_dict(data["train_config"])  # (validated as it is made)
            corpus = Corpus(**data["corpus"]) if data.get("corpus") is not None else None
        except (ConfigError, TypeError) as e:
            raise CheckpointError(f"{path} is an incompatible charlm checkpoint ({last_words(e)})") from None
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

    def summary(self) -> dict:
        """What the file says of its model and run, as plain values: the one summary behind info, runs,
        eval --json and compare --json."""
        m, c = self.model_config, self.corpus
        return {
            "run": self.run_name,
            "model": m.kind,
            "layers": m.n_layers,
            "d_model": m.d_model,
            "heads": m.n_heads if m.applies("n_heads") else None,
            "context": m.context,
            "positions": m.positions if m.applies("positions") else None,
            "mlp_ratio": m.mlp_ratio if m.applies("mlp_ratio") else None,
            "qk_norm": m.qk_norm if m.applies("qk_norm") else None,
            "smear": m.smear if m.applies("smear") else None,
            "tied": m.tied if m.applies("tied") else None,
            "params": self.params,
            "tokenizer": self.train_config.tokenizer,
            "vocab_size": m.vocab_size,  # read() checked that the tokenizer has as many
            "steps": self.step,
            "train_seconds": round(self.train_seconds, 2),
            "best_val_loss": self.best_val_loss,
            "best_val_bpc": self.best_val_bpc,
            "corpus": c.name if c else None,
            "corpus_sha256": c.sha256 if c else None,
            "device": self.device,
            "compressed": describe_compressed(self.compressed),
            "teacher": self.train_config.teacher,
        }

    def require_training_state(self, path: Path) -> None:
        missing = [k for k in ("optimizer", "rng", "corpus") if getattr(self, k) is None]
        if missing:
            raise CheckpointError(f"{path} is an incomplete charlm checkpoint (missing {', '.join(missing)})")


# what holds tensors: read_header leaves them as TensorInfo
TENSOR_FIELDS = ("model", *safetensors_file.TREE_FIELDS)

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
TYPES = {  # None stands for "not there" in every field
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
    "quantized": (dict,),
    "compressed": (dict,),
}
CORPUS_TYPES = {
    "name": (str,),
    "sha256": (str,),
    "train_tokens": (int,),
    "val_tokens": (int,),
    "chars_per_token": _NUMBER,
}
COUNTS = {"step": 0, "params": 0, "world_size": 1, "corpus train_tokens": 0, "corpus val_tokens": 0}  # at least
AMOUNTS = {"train_seconds": 0, "best_val_loss": 0, "best_val_bpc": 0, "corpus chars_per_token": 1e-9}  # at least
# (a number out of range is no crash here, but it is further on: `charlm runs` rounds the seconds, and so on)


def _mistyped(data: dict, types: dict, prefix: str = "", required: bool = False) -> str | None:
    for name, allowed in types.items():
        value = data.get(name)
        if value is None and not (required and name in data):  # "not there": a missing field is Corpus()'s error
            continue
        if not isinstance(value, allowed) or isinstance(value, bool) and bool not in allowed:
            return f"{prefix}{name} should be {' or '.join(t.__name__ for t in allowed)}, not {type(value).__name__}"
    return None


def _out_of_range(data: dict) -> str | None:
    def get(name):
        part, _, key = name.rpartition(" ")
        return (data.get(part) or {}).get(key) if part else data.get(name)

    finite = lambda x: -(2**63) <= x < 2**63 if isinstance(x, int) else math.isfinite(x)  # noqa: E731
    for name, least in COUNTS.items():
        if (value := get(name)) is not None and not least <= value < 2**63:
            return f"{name} should be a whole number from {least} up, not {shown(value)}"
    for name, least in AMOUNTS.items():
        if (value := get(name)) is not None and not (finite(value) and value >= least):
            return f"{name} should be a finite number of at least {least:g}, not {shown(value)}"
    for key, value in (data.get("metrics") or {}).items():
        if not isinstance(key, str):
            return f"metric names should be text, not {type(key).__name__}"
        label = shown(key)[1:-1]  # without its quotes, escaped and short
        if not isinstance(value, _NUMBER) or isinstance(value, bool):
            return f"metric {label} should be a number, not {type(value).__name__}"
        if not finite(value):
            return f"metric {label} should be a finite number, not {shown(value)}"
    if not all(isinstance(x, str) for x in data.get("weights_sha256") or []):
        return "weights_sha256 should be a list of digests"
    return None


# ---- the `compressed` record (charlm compress): what was done to the model, step by step -------------------
# {"steps": [{"from": the source's path, "bits": 32|16|8|4, "heads_dropped": K, "units_dropped": K,
#             "dropped": [[layer, index], ...]}, ...]}, the first step first; a record written before there were
# steps is that one step's dict.

STORED_BITS = {32: "float32", 16: "bf16", 8: "int8", 4: "int4 (groups of 32)"}
MAX_STEPS = 64  # compressions of compressions: no run has more, a crafted record may
MAX_DROPPED = 1 << 16  # heads or units dropped of one layer, and layer numbers: a crafted count above this is refused


def compression_steps(record: dict | None) -> list[dict]:
    """The steps of a record check_compressed accepted (none for a run that was never compressed)."""
    if not record:
        return []
    return list(record["steps"]) if "steps" in record else [record]


def check_compressed(record) -> str | None:
    """What is wrong with a `compressed` record read from a file (types and ranges), or None."""
    if record is None:
        return None
    if not isinstance(record, dict):
        return f"should be a dict, not {type(record).__name__}"
    steps = record.get("steps", [record]) if "steps" in record else [record]
    if not isinstance(steps, list) or not 1 <= len(steps) <= MAX_STEPS:
        return f"steps should be a list of 1 to {MAX_STEPS} steps"
    whole = lambda x, top: isinstance(x, int) and not isinstance(x, bool) and 0 <= x < top  # noqa: E731
    said = lambda x: shown(x) if isinstance(x, (int, float, type(None))) else type(x).__name__  # noqa: E731
    for n, step in enumerate(steps, 1):
        if not isinstance(step, dict):
            return f"step {n} should be a dict, not {type(step).__name__}"
        if not isinstance(step.get("from"), str) or len(step["from"]) > 4096:
            return f"step {n}'s source should be a path"
        if not whole(step.get("bits"), 33) or step["bits"] not in STORED_BITS:
            return f"step {n}'s bits should be one of {', '.join(map(str, STORED_BITS))}, not {said(step.get('bits'))}"
        for key in ("heads_dropped", "units_dropped"):
            if key in step and not whole(step[key], MAX_DROPPED):
                return f"step {n}'s {key} should be a whole number from 0 to {MAX_DROPPED - 1}, not {said(step[key])}"
        dropped = step.get("dropped", [])
        if not isinstance(dropped, list) or not all(
            isinstance(d, (list, tuple)) and len(d) == 2 and all(whole(i, MAX_DROPPED) for i in d) for d in dropped
        ):
            return f"step {n}'s dropped should be a list of [layer, index] pairs"
    return None


def describe_compressed(record: dict | None) -> str | None:
    """What charlm compress did, in a few words, step by step (for info): "int8 weights → 1 head of each layer
    dropped"."""
    described = []
    for step in compression_steps(record):
        words = [STORED_BITS[step["bits"]] + " weights"] if step["bits"] != 32 else []
        for key, what in (("heads_dropped", "head"), ("units_dropped", "unit")):
            if k := step.get(key):
                words.append(f"{k} {what}{'s' * (k > 1)} of each layer dropped")
        described.append("; ".join(words) or "as it was")
    return " → ".join(described) or None


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


@contextmanager
def _hint_last(p: Path):
    """A damaged best beside a last: say that the last is there (it is often intact), not only "train again"."""
    try:
        yield
    except CheckpointError as e:
        last = p.parent / {BEST: LAST, OLD_BEST: OLD_LAST}.get(p.name, "")
        if p.name not in (BEST, OLD_BEST) or not last.is_file():
            raise
        raise CheckpointError(f"{e}; {last} may be intact: use it, or move {p.name} away") from None


def read_header(path: str | Path) -> Saved:
    """What a checkpoint says of itself (configs, tokenizer, step, scores), with every check, without torch:
    the model, optimizer and rng hold TensorInfo, not tensors. For info and runs."""
    p = resolve(path)
    with _hint_last(p):
        return _read_header(p)


def _read_header(p: Path) -> Saved:
    return _header(p)[0]


def _header(p: Path) -> tuple[Saved, safetensors_file.Header | None]:
    """The file's contents with TensorInfo for its tensors, every check done (the weights' values read by
    numpy); and its safetensors header (None: an older charlm's .pt)."""
    if not safetensors_file.is_safetensors(p):
        with open_archive(p) as z:
            saved = _typed(p, read_pickle(p, z))
            _check_weights(saved, p, archive_values(p, z))
        _tokenizer(saved, p)
        return saved, None
    header = safetensors_file.Header(p)
    saved = _typed(p, header.payload(), written_by="a safetensors file written by something else")
    _check_weights(saved, p, header.read_values)
    _tokenizer(saved, p)
    return saved, header


def read(path: str | Path, map_location="cpu") -> Saved:
    """The checkpoint's contents, typed and checked for consistency (config, weights and tokenizer agree),
    without building a model: what a resumed run continues from."""
    p = resolve(path)
    with _hint_last(p):
        return _checked(p, map_location)[0]


def _checked(p: Path, map_location) -> tuple[Saved, object]:
    """(the contents, the tokenizer), after every check that needs no model. The weights' shapes are checked
    against the config on the header, before safetensors (or torch.load) allocates anything for them."""
    header, st = _header(p)
    tokenizer = _tokenizer(header, p)
    if st is not None:
        tensors = safetensors_file.load_tensors(p, st, str(map_location))
        data = {k: safetensors_file.with_tensors(getattr(header, k), tensors) for k in TENSOR_FIELDS}
    else:
        data = load_tensors(p, map_location)
    if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
        raise CheckpointError(f"{p} is not a readable charlm checkpoint (its tensors do not match its header)")
    saved = replace(header, **{k: data.get(k) for k in TENSOR_FIELDS})
    for name, info in header.model.items():  # torch.load read the same bytes: the same tensors, unless crafted
        if getattr(saved.model.get(name), "shape", None) != info.shape:
            raise CheckpointError(f"{p} is not a readable charlm checkpoint (its tensors do not match its header)")
    if header.quantized:  # the same check, then the float weights every command computes with
        shapes = param_shapes(header.model_config)
        saved = replace(saved, model={**saved.model, **dequantized(p, header.quantized, saved.quantized, shapes)})
    return saved, tokenizer


def _tokenizer(saved: Saved, p: Path):
    try:
        tokenizer = tokenizer_from_json(saved.tokenizer)
    except Exception as e:
        raise CheckpointError(f"{p} is an incompatible charlm checkpoint ({last_words(e)})") from None
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
    return tokenizer


def _check_weights(saved: Saved, p: Path, read_values) -> None:
    """The stored tensors must be exactly what the config describes (models.param_shapes, by arithmetic),
    each holding its own values (the model loaded later is never larger than the file, so a crafted config
    cannot make charlm allocate), and those values must be finite numbers."""
    expected = param_shapes(saved.model_config)
    m = saved.model_config
    bad = f"{p} is an inconsistent charlm checkpoint: its weights do not match its config ({m.kind}, layers {m.n_layers}, d_model {m.d_model}"
    quantized = saved.quantized or {}
    stored = saved.model.keys() | quantized.keys()
    missing = sorted(expected.keys() - stored)
    # a crafted file's keys need not be strings, short, or free of newlines: each shown on one line, short
    extra = sorted(shown(k)[1:-1] if isinstance(k, str) else shown(k) for k in stored - expected.keys())
    extra += sorted(k for k in quantized.keys() & saved.model.keys() if k in expected)  # stored twice
    if missing or extra:
        what = "; ".join(
            ([f"missing {', '.join(missing[:3])}"] if missing else [])
            + ([f"unexpected {', '.join(extra[:3])}"] if extra else [])
        )
        raise CheckpointError(f"{bad}: {what})")
    for name, want in expected.items():
        if name in quantized:
            check_quantized(quantized[name], p, read_values, name, want, bad)
            continue
        t = saved.model[name]
        if not isinstance(t, TensorInfo):
            raise CheckpointError(f"{bad}: {name} is not a tensor)")
        if t.shape != want:
            raise CheckpointError(f"{bad}: {name} is {t.shape}, the config needs {want})")
        if not t.holds_its_values():
            raise CheckpointError(f"{bad}: {name} does not hold its {math.prod(t.shape):,} values)")
        if t.dtype not in FLOATS:
            raise CheckpointError(f"{bad}: {name} holds {t.dtype[: -len('Storage')].lower()} values, not floats)")
    for name, t in saved.model.items():  # numpy on the stored bytes: no torch, no copy of the model
        try:
            values = np.frombuffer(read_values(t), dtype=FLOATS[t.dtype])
        except ValueError as e:
            raise CheckpointError(f"{p} is not a readable charlm checkpoint ({last_words(e)})") from None
        if values.size != t.storage_numel:
            raise CheckpointError(f"{p} is not a readable charlm checkpoint ({name}'s values are not all there)")
        if t.dtype == "BFloat16Storage":  # the upper half of a float32: all exponent bits set is inf or NaN
            finite = ((values & 0x7F80) != 0x7F80).all()
        else:
            finite = np.isfinite(values).all()
        if not finite:
            raise CheckpointError(
                f"{p} holds damaged weights: {NONFINITE.format(tensor=name)}; train again or use another checkpoint"
            )


FLOATS = {"FloatStorage": "<f4", "DoubleStorage": "<f8", "HalfStorage": "<f2", "BFloat16Storage": "<u2"}
NONFINITE = "{tensor} has NaN or infinite values"  # on load, and when training makes such weights


def _typed(p: Path, data: object, written_by: str = "a PyTorch file written by something else") -> Saved:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise CheckpointError(f"{p} is not a charlm checkpoint ({written_by})")
    version = data.get("version")
    if not isinstance(version, int) or version < 1:
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

    def summary(self) -> dict:
        return {"path": str(self.path), **self.saved.summary()}


def load(path: str | Path, device: str = "cpu") -> Checkpoint:
    p = resolve(path)
    with _hint_last(p):
        saved, tokenizer = _checked(p, map_location=device)
        try:  # the shapes are known to fit: what is left to fail here is the file's fault too
            model = build_model(saved.model_config)
            model.load_state_dict(saved.model)
        except Exception as e:
            raise CheckpointError(f"{p} is an incompatible charlm checkpoint ({last_words(e)})") from None
    model.to(device).eval()
    return Checkpoint(p, model, tokenizer, saved)
