"""Checkpoints: one self-contained file holding weights, configs, tokenizer (as JSON), training state
and metrics. Written atomically (temp file + rename); never executes code from the file when reading it.

Reading has three depths, all checked the same way:
  read_header(path)  what the file says of itself, without torch (charlm info, charlm runs)
  read(path)         and its tensors (a resumed run), via torch.load(weights_only=True)
  load(path)         and a ready model (every command that runs one)
The weights' shapes are checked against the config on the header, before any tensor is allocated.
"""

from __future__ import annotations

import collections
import math
import pickle
import sys
import warnings
import zipfile
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from charlm import files
from charlm.config import ModelConfig, TrainConfig
from charlm.errors import ConfigError, UserError
from charlm.models import build_model, param_shapes
from charlm.settings import shown
from charlm.tokenizer import tokenizer_from_json

if TYPE_CHECKING:
    import torch

FORMAT = "charlm-checkpoint"
VERSION = 2  # 2: "no evaluation yet" is None (v1 wrote float("inf")); v1 files are converted on read


class CheckpointError(UserError):
    """A checkpoint that cannot be used, with a message that says why."""


def save(saved: Saved | dict, path: str | Path) -> None:
    """Write a checkpoint to path atomically: readers see the old file or the new one, never half of one.
    A full disk is a files.WriteError naming the directory; the file already at path stays as it was."""
    import torch

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
    # charlm compress: the weights stored as int8/int4 with their scales (see "Quantized weights" below), taken
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
            "compressed": describe_compression(self.compressed),
            "teacher": self.train_config.teacher,
        }

    def require_training_state(self, path: Path) -> None:
        missing = [k for k in ("optimizer", "rng", "corpus") if getattr(self, k) is None]
        if missing:
            raise CheckpointError(f"{path} is an incomplete charlm checkpoint (missing {', '.join(missing)})")


# what holds tensors: read_header leaves them as TensorInfo
TENSOR_FIELDS = ("model", "optimizer", "rng", "scaler", "quantized")

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


def _open_archive(p: Path) -> zipfile.ZipFile:
    """The checkpoint's zip archive (torch.save writes one), after checks that turn every failure into a clear error."""
    try:
        with open(p, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise CheckpointError(f"cannot read {p}: {e.strerror}") from None
    if magic != b"PK\x03\x04":  # anything else is not ours
        raise CheckpointError(f"{p} is not a charlm checkpoint (not a PyTorch archive)")
    zip_errors = (zipfile.BadZipFile, OSError, EOFError, ValueError, NotImplementedError, RuntimeError)
    damaged = "train again or use another checkpoint"
    try:
        z = zipfile.ZipFile(p)
    except zip_errors as e:
        raise CheckpointError(f"{p} is truncated or corrupt ({_last_words(e)}); {damaged}") from None
    try:
        if odd := _odd_entries(z):
            raise CheckpointError(f"{p} is not a charlm checkpoint ({odd})")
        bad = z.testzip()  # torch.load skips the CRCs: a damaged weight would load silently
        if bad is not None:  # the name as ascii(): on one line, whatever it holds
            raise CheckpointError(f"{p} is corrupt ({ascii(bad)[1:-1]} fails its checksum); {damaged}")
    except zip_errors as e:
        z.close()
        raise CheckpointError(f"{p} is truncated or corrupt ({_last_words(e)}); {damaged}") from None
    except CheckpointError:
        z.close()
        raise
    return z


def _odd_entries(z: zipfile.ZipFile) -> str | None:
    """What no archive of torch.save's has: compressed entries (a few KB of them can hold gigabytes, which
    reading them would take in time and memory; a stored entry is never larger than the file), or two entries
    of one name (torch.load and this reader might not read the same one)."""
    infos = z.infolist()
    if any(i.compress_type != zipfile.ZIP_STORED for i in infos):
        return "its archive holds compressed entries, which torch.save never writes"
    if len({i.filename for i in infos}) != len(infos):
        return "its archive holds two entries of one name"
    return None


@dataclass(frozen=True)
class TensorInfo:
    """A tensor as the header describes it, without its values: what checks need before anything is allocated."""

    dtype: str  # the storage's type, e.g. "FloatStorage"
    key: str  # where its storage lies in the archive: <archive>/data/<key>
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    storage_numel: int  # values the file holds for it

    def holds_its_values(self) -> bool:
        """The storage covers every element the shape and strides reach, and each element has its own
        value (no zero stride: a crafted file could make a huge tensor of a few stored numbers)."""
        if any(n < 0 for n in (*self.shape, *self.stride, self.offset)):
            return False
        if math.prod(self.shape) == 0:
            return True
        reach = self.offset + sum((n - 1) * st for n, st in zip(self.shape, self.stride)) + 1
        return all(st > 0 for n, st in zip(self.shape, self.stride) if n > 1) and reach <= self.storage_numel


_STORAGES = {  # torch's storage classes in a data.pkl, by element size (what the header needs of them)
    "FloatStorage": 4, "DoubleStorage": 8, "HalfStorage": 2, "BFloat16Storage": 2, "LongStorage": 8,
    "IntStorage": 4, "ShortStorage": 2, "CharStorage": 1, "ByteStorage": 1, "BoolStorage": 1,
}  # fmt: skip


_PLAIN = (str, int, float, bytes, bool, type(None))  # what a dict key or a set element may be: cheap to hash
_INT64 = 2**63  # every whole number a checkpoint holds is below it (sizes, steps, counts)


def _is_int64(x) -> bool:
    return type(x) is int and -_INT64 <= x < _INT64


def _unpickler_dispatch() -> dict:
    """pickle's pure-Python dispatch table, with the opcodes a small crafted file could abuse guarded or refused:
    a dict key or set element must be a plain value (hashing a tuple recurses in C: a deep one overflows the
    stack and kills the process, one that shares its items, t = (s, s), s = (r, r), ..., takes 2^depth steps);
    BUILD may only give a state dict its _metadata (it would change a TensorInfo after its checks); and
    protocol 5's buffers are refused (BYTEARRAY8 allocates the size the file claims before reading it)."""

    class Table(dict):
        def __missing__(self, op):
            raise pickle.UnpicklingError(f"invalid load key {bytes([op])!r}")

    table = Table(pickle._Unpickler.dispatch)

    def plain_keys(opcode: bytes, keys) -> None:
        load = table[opcode[0]]

        def checked(self):
            if not all(type(k) in _PLAIN for k in keys(self.stack)):
                raise pickle.UnpicklingError("a dict key or set element that is not a plain value")
            load(self)

        table[opcode[0]] = checked

    plain_keys(pickle.SETITEM, lambda stack: stack[-2:-1])  # the stack: ... dict key value
    plain_keys(pickle.SETITEMS, lambda stack: stack[::2])  # the stack since MARK: key value key value ...
    plain_keys(pickle.DICT, lambda stack: stack[::2])
    plain_keys(pickle.ADDITEMS, lambda stack: stack)  # the stack since MARK: elements
    plain_keys(pickle.FROZENSET, lambda stack: stack)
    build = table[pickle.BUILD[0]]

    def build_state_dict(self):
        if type(self.stack[-2]) is not collections.OrderedDict:
            raise pickle.UnpicklingError("BUILD of something other than a state dict")
        build(self)

    def refused(self):
        raise pickle.UnpicklingError("an out-of-band buffer (pickle protocol 5, which torch.save never writes)")

    table[pickle.BUILD[0]] = build_state_dict
    for opcode in (pickle.BYTEARRAY8, pickle.NEXT_BUFFER, pickle.READONLY_BUFFER):
        table[opcode[0]] = refused
    return table


class _HeaderUnpickler(pickle._Unpickler):
    """Reads a checkpoint's data.pkl without torch: plain values as they are, every tensor as a TensorInfo.
    Like torch.load(weights_only=True), it refuses every class and function but the few a state dict
    names, so a crafted file runs no code here either. It is pickle's pure-Python unpickler, whose memo is a
    dict (the C one allocates an array as long as the largest memo index a file names: a 9-byte data.pkl
    asks for gigabytes), with the opcodes that could take unbounded time or memory refused (see
    _unpickler_dispatch). What it returns is then checked by _check_tree."""

    dispatch = _unpickler_dispatch()

    def find_class(self, module: str, name: str):
        if (module, name) == ("collections", "OrderedDict"):
            return _ordered_dict
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _tensor_info
        if module == "torch" and name in _STORAGES:
            return name
        raise pickle.UnpicklingError(f"global '{module}.{name}' is not allowed (GLOBAL)")

    def persistent_load(self, pid):
        # torch's storages: ("storage", storage class, key, location, number of values)
        if not (type(pid) is tuple and len(pid) == 5 and pid[0] == "storage" and type(pid[1]) is str):
            raise pickle.UnpicklingError(f"unexpected persistent id (a {type(pid).__name__})")
        if pid[1] not in _STORAGES or type(pid[2]) is not str or not (_is_int64(pid[4]) and pid[4] >= 0):
            raise pickle.UnpicklingError("a storage of an unknown type, or of a negative or non-integer size")
        return _Storage(pid[1], pid[2], pid[4])


def _ordered_dict() -> collections.OrderedDict:
    return collections.OrderedDict()  # torch pickles one as OrderedDict() and SETITEMS: never from arguments


@dataclass(frozen=True)
class _Storage:
    kind: str
    key: str
    numel: int


def _tensor_info(storage, offset, size, stride, *_rest) -> TensorInfo:
    ints = lambda xs: type(xs) is tuple and all(map(_is_int64, xs))  # noqa: E731
    if not (
        isinstance(storage, _Storage) and _is_int64(offset) and ints(size) and ints(stride) and len(size) == len(stride)
    ):
        raise pickle.UnpicklingError("a malformed tensor")
    return TensorInfo(storage.kind, storage.key, size, stride, offset, storage.numel)


MAX_DEPTH = 32  # a checkpoint's payload nests 5 deep (optimizer, param_groups, a group, params, a number)


def _check_tree(p: Path, tree: object, budget: int) -> None:
    """The payload is a tree of at most `budget` values (pickle can share one list many times over: a file of
    a few hundred bytes can hold 2^60 of them, and printing one would never end), at most MAX_DEPTH deep, whose
    text is valid Unicode (a lone surrogate crashes the terminal writes of `charlm info`) and whose whole numbers
    fit in 64 bits (str() of one of more than 4300 digits raises ValueError)."""
    stack = [(tree, 0)]
    while stack:
        value, depth = stack.pop()
        budget -= 1
        if budget < 0 or depth > MAX_DEPTH:
            raise CheckpointError(
                f"{p} is not a readable charlm checkpoint (its header nests too deep or holds too much)"
            )
        if isinstance(value, dict):
            stack.extend((x, depth + 1) for item in value.items() for x in item)
        elif isinstance(value, (list, tuple, set, frozenset)):
            stack.extend((x, depth + 1) for x in value)
        elif isinstance(value, str) and not value.isascii():
            try:  # a name from the file system may hold undecodable bytes (as surrogateescape writes them)
                value.encode("utf-8", "surrogateescape")
            except UnicodeEncodeError:
                raise CheckpointError(
                    f"{p} is a damaged charlm checkpoint (it holds text that is not valid Unicode)"
                ) from None
        elif isinstance(value, int) and not -(2**64) < value < 2**64:
            raise CheckpointError(
                f"{p} is a damaged charlm checkpoint (it holds a number of {value.bit_length()} bits)"
            )


def _header(p: Path, z: zipfile.ZipFile) -> object:
    names = [n for n in z.namelist() if n.endswith("/data.pkl") and n.count("/") == 1]
    if len(names) != 1:
        raise CheckpointError(f"{p} is not a charlm checkpoint (a zip archive, but not one PyTorch wrote)")
    if names[0].replace("data.pkl", "byteorder") in z.namelist():
        if z.read(names[0].replace("data.pkl", "byteorder")) != sys.byteorder.encode():
            raise CheckpointError(f"{p} was written on a machine of another byte order: it cannot be read here")
    try:
        with z.open(names[0]) as f:
            tree = _HeaderUnpickler(f).load()
    except pickle.UnpicklingError as e:
        if "GLOBAL" in str(e):  # it names a class or function: the file wants to run code
            raise CheckpointError(
                f"{p} is not a charlm checkpoint: it holds Python objects, which are never loaded (only tensors and plain data)"
            ) from None
        raise CheckpointError(f"{p} is not a readable charlm checkpoint ({_last_words(e)})") from None
    except Exception as e:  # zip errors, truncated pickles: the file is unusable
        raise CheckpointError(f"{p} is not a readable charlm checkpoint ({_last_words(e)})") from None
    _check_tree(p, tree, budget=64 + 4 * z.getinfo(names[0]).file_size)  # torch's pickles hold < 1 value a byte
    return tree


def _load_tensors(p: Path, map_location) -> object:
    """torch.load with weights_only=True: tensors and plain containers only, so a crafted file cannot run code."""
    import torch

    try:
        with warnings.catch_warnings():  # torch's warnings would be extra lines on the user's terminal
            warnings.simplefilter("ignore")
            return torch.load(p, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        raise CheckpointError(f"{p} is not a readable charlm checkpoint ({_last_words(e)})") from None
    except Exception as e:  # zip, storage and OS errors alike: the file is unusable
        raise CheckpointError(f"{p} is not a readable charlm checkpoint ({_last_words(e)})") from None


def _last_words(e: Exception) -> str:
    # the start of the message, on one line (load_state_dict's first line alone says nothing)
    text = " ".join(line.strip() for line in str(e).splitlines() if line.strip())
    return f"{type(e).__name__}: {text[:160]}" if text else type(e).__name__


@contextmanager
def _hint_last(p: Path):
    """A damaged best.pt beside a last.pt: say that last.pt is there (it is often intact), not only "train again"."""
    try:
        yield
    except CheckpointError as e:
        if p.name != "best.pt" or not (p.parent / "last.pt").is_file():
            raise
        raise CheckpointError(f"{e}; {p.parent / 'last.pt'} may be intact: use it, or move best.pt away") from None


def read_header(path: str | Path) -> Saved:
    """What a checkpoint says of itself (configs, tokenizer, step, scores), with every check, without torch:
    the model, optimizer and rng hold TensorInfo, not tensors. For info and runs."""
    p = resolve(path)
    with _hint_last(p):
        return _read_header(p)


def _read_header(p: Path) -> Saved:
    with _open_archive(p) as z:
        saved = _typed(p, _header(p, z))
        _check_weights(saved, p, z)
    _tokenizer(saved, p)
    return saved


def read(path: str | Path, map_location="cpu") -> Saved:
    """The checkpoint's contents, typed and checked for consistency (config, weights and tokenizer agree),
    without building a model: what a resumed run continues from."""
    p = resolve(path)
    with _hint_last(p):
        return _checked(p, map_location)[0]


def _checked(p: Path, map_location) -> tuple[Saved, object]:
    """(the contents, the tokenizer), after every check that needs no model. The weights' shapes are checked
    against the config on the header, before torch.load allocates anything for them."""
    with _open_archive(p) as z:
        header = _typed(p, _header(p, z))
        _check_weights(header, p, z)
    tokenizer = _tokenizer(header, p)
    data = _load_tensors(p, map_location)
    if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
        raise CheckpointError(f"{p} is not a readable charlm checkpoint (its tensors do not match its header)")
    saved = replace(header, **{k: data.get(k) for k in TENSOR_FIELDS})
    for name, info in header.model.items():  # torch.load read the same bytes: the same tensors, unless crafted
        if getattr(saved.model.get(name), "shape", None) != info.shape:
            raise CheckpointError(f"{p} is not a readable charlm checkpoint (its tensors do not match its header)")
    if header.quantized:  # the same check, then the float weights every command computes with
        shapes = param_shapes(header.model_config)
        saved = replace(saved, model={**saved.model, **_dequantized(p, header.quantized, saved.quantized, shapes)})
    return saved, tokenizer


def _tokenizer(saved: Saved, p: Path):
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
    return tokenizer


def _check_weights(saved: Saved, p: Path, z: zipfile.ZipFile) -> None:
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
            _check_quantized(saved, p, z, name, want, bad)
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
    prefix = next(n for n in z.namelist() if n.endswith("/data.pkl"))[: -len("data.pkl")]
    for name, t in saved.model.items():  # numpy on the stored bytes: no torch, no copy of the model
        try:
            values = np.frombuffer(z.read(f"{prefix}data/{t.key}"), dtype=FLOATS[t.dtype])
        except (KeyError, ValueError, zipfile.BadZipFile, OSError) as e:
            raise CheckpointError(f"{p} is not a readable charlm checkpoint ({_last_words(e)})") from None
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


def _typed(p: Path, data: object) -> Saved:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise CheckpointError(f"{p} is not a charlm checkpoint (a PyTorch file written by something else)")
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
            raise CheckpointError(f"{p} is an incompatible charlm checkpoint ({_last_words(e)})") from None
    model.to(device).eval()
    return Checkpoint(p, model, tokenizer, saved)


# ---- Quantized weights (charlm compress) ----------------------------------------------------------------
# A quantized matrix is stored as {"bits": 8 or 4, "values": ..., "scales": ...} in Saved.quantized, under its
# state-dict name, instead of as a float tensor in Saved.model:
#   int8: values int8 (rows, cols), scales float32 (rows,): one scale per output channel, w = q * scale
#   int4: values uint8 (rows, groups * 16), scales float16 (rows, groups), groups = ceil(cols / 32): a scale
#         per group of 32 along a row, two codes a byte (the first in the low nibble), code = q + 8, w = q *
#         scale; the codes past the row's end (its last group's padding) are 8 (zero) and never read
# Quantizing rounds to the nearest step (|w - q * scale| <= scale / 2); commands compute in float after loading.
# Checks, before anything is allocated: the shapes and dtypes above by arithmetic from the config's shapes,
# every value stored, every scale a finite number in [0, MAX_SCALE[bits]].

INT4_GROUP = 32
QMAX = {8: 127, 4: 7}  # symmetric: q in [-QMAX, QMAX]
MAX_WEIGHT = 2.0**16  # no trained weight comes near: a larger scale is a damaged or crafted file
MAX_SCALE = {bits: MAX_WEIGHT / q for bits, q in QMAX.items()}
_QUANT_DTYPES = {8: ("CharStorage", "FloatStorage"), 4: ("ByteStorage", "HalfStorage")}  # values, scales


def quantized_shapes(bits: int, rows: int, cols: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The shapes of (values, scales) that hold a (rows, cols) matrix at `bits`."""
    if bits == 8:
        return (rows, cols), (rows,)
    groups = -(-cols // INT4_GROUP)
    return (rows, groups * INT4_GROUP // 2), (rows, groups)


def quantize(w: np.ndarray, bits: int) -> dict:
    """A float matrix (rows, cols) as Saved.quantized stores it, in numpy: {"bits", "values", "scales"}. Each
    scale is the largest magnitude of its row (int8) or group (int4) over QMAX, rounded up to its stored type."""
    w = np.asarray(w, dtype=np.float32)
    rows, cols = w.shape
    q = QMAX[bits]
    if bits == 8:
        scales = (np.abs(w).max(axis=1) / q).astype(np.float32)
        fit = scales.astype(np.float64)
        values = np.rint(w / np.where(fit > 0, fit, 1)[:, None]).clip(-q, q).astype(np.int8)
        return {"bits": 8, "values": values, "scales": scales}
    groups = -(-cols // INT4_GROUP)
    padded = np.zeros((rows, groups * INT4_GROUP), np.float32)
    padded[:, :cols] = w
    g = padded.reshape(rows, groups, INT4_GROUP)
    top = np.abs(g).max(axis=2).astype(np.float64)
    scales = (top / q).astype(np.float16)
    low = scales.astype(np.float64) * q < top  # float16 rounded it down: the group's largest would not fit
    scales[low] = np.nextafter(scales[low], np.float16(np.inf))
    fit = scales.astype(np.float64)
    codes = (np.rint(g / np.where(fit > 0, fit, 1)[..., None]).clip(-q, q) + 8).astype(np.uint8)
    codes = codes.reshape(rows, groups * INT4_GROUP)
    return {"bits": 4, "values": codes[:, 0::2] | (codes[:, 1::2] << 4), "scales": scales}


def _check_quantized(saved: Saved, p: Path, z: zipfile.ZipFile, name: str, want: tuple, bad: str) -> None:
    """One entry of Saved.quantized against the matrix `want` the config needs, on the header's TensorInfo and
    the scales' stored bytes (numpy, no torch)."""
    e = saved.quantized[name]
    if not (
        isinstance(e, dict)
        and e.keys() == {"bits", "values", "scales"}
        and type(e["bits"]) is int
        and e["bits"] in QMAX
        and len(want) == 2
    ):
        raise CheckpointError(f"{bad}: {name} is not a quantized matrix (bits 8 or 4, values, scales))")
    bits = e["bits"]
    for part, shape, dtype in zip(("values", "scales"), quantized_shapes(bits, *want), _QUANT_DTYPES[bits]):
        t = e[part]
        if not isinstance(t, TensorInfo) or t.dtype != dtype:
            kind = dtype[: -len("Storage")].lower()
            raise CheckpointError(f"{bad}: {name}'s int{bits} {part} should be a tensor of {kind} values)")
        if t.shape != shape:
            raise CheckpointError(f"{bad}: {name}'s int{bits} {part} are {t.shape}, its shape {want} needs {shape})")
        if not t.holds_its_values():
            raise CheckpointError(f"{bad}: {name}'s {part} do not hold their {math.prod(t.shape):,} values)")
        prefix = next(n for n in z.namelist() if n.endswith("/data.pkl"))[: -len("data.pkl")]
        try:
            stored = z.getinfo(f"{prefix}data/{t.key}").file_size
        except KeyError as e:
            raise CheckpointError(f"{p} is not a readable charlm checkpoint ({_last_words(e)})") from None
        if stored != t.storage_numel * _STORAGES[dtype]:
            raise CheckpointError(f"{p} is not a readable charlm checkpoint ({name}'s {part} are not all there)")
    t = e["scales"]
    scales = np.frombuffer(z.read(f"{prefix}data/{t.key}"), dtype="<f4" if bits == 8 else "<f2")
    if not (np.isfinite(scales).all() and (scales >= 0).all() and (scales <= MAX_SCALE[bits]).all()):
        raise CheckpointError(
            f"{p} holds damaged weights: {name}'s int{bits} scales should be finite numbers between 0 and "
            f"{MAX_SCALE[bits]:g}; compress again or use another checkpoint"
        )


def _dequantized(p: Path, header: dict, loaded: dict, shapes: dict) -> dict:
    """The float32 matrices of Saved.quantized, after checking that torch.load read what the header described."""
    import torch

    out = {}
    for name, e in header.items():
        got = loaded.get(name) if isinstance(loaded, dict) else None
        if not (
            isinstance(got, dict)
            and getattr(got.get("values"), "shape", None) == e["values"].shape
            and getattr(got.get("scales"), "shape", None) == e["scales"].shape
        ):
            raise CheckpointError(f"{p} is not a readable charlm checkpoint (its tensors do not match its header)")
        values, scales = got["values"], got["scales"].float()
        if e["bits"] == 8:
            out[name] = values.float() * scales[:, None]
            continue
        rows, groups = scales.shape
        codes = torch.stack((values & 15, values >> 4), dim=-1).reshape(rows, groups, INT4_GROUP)
        out[name] = ((codes.float() - 8) * scales[..., None]).reshape(rows, -1)[:, : shapes[name][1]].contiguous()
    return out


def describe_compression(compressed: dict | None) -> str | None:
    """What charlm compress did, in a few words (for info): "int8 weights; 1 head of each layer dropped"."""
    if not compressed:
        return None
    words = []
    if compressed.get("bits") in (16, 8, 4):
        words.append({16: "bf16", 8: "int8", 4: "int4 (groups of 32)"}[compressed["bits"]] + " weights")
    for key, what in (("heads_dropped", "head"), ("units_dropped", "unit")):
        k = compressed.get(key)
        if isinstance(k, int) and k > 0:
            words.append(f"{k} {what}{'s' * (k > 1)} of each layer dropped")
    return "; ".join(words) or "as it was"
