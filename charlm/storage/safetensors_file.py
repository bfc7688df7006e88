"""A checkpoint as a safetensors file, read and written: the layout (every tensor a named entry; everything
else in the header's metadata, one JSON text per field), and its header read without torch and checked
before anything is allocated. checkpoint.py owns what the fields mean; this module only lays them out.

A safetensors file is 8 bytes (the header's length, little-endian), the header (JSON: each tensor's dtype,
shape and byte range; "__metadata__", text to text), then the tensors' bytes. charlm's layout in it:
  the weights           under their state-dict names ("tok_emb.weight"), as any safetensors reader sees them
  every other field     metadata[field] = its value as JSON; the tokenizer is its own JSON text, as it is
  a field with tensors  (optimizer, rng, scaler, quantized) JSON in which each tensor is {"@tensor": its
                        entry's name}, e.g. "optimizer.optimizers.0.state.3.exp_avg"; a dict whose keys are
                        not all text is {"@items": [[key, value], ...]}, a tuple {"@tuple": [...]}
so `safetensors.torch.load_file(path)` gives the weights (and the training state's tensors, by those names),
and `safe_open(path, "pt").metadata()` the rest.
"""

from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path

from charlm.errors import CheckpointError
from charlm.storage.safe_pickle import TensorInfo, check_tree, last_words

MAX_HEADER = 100 * 2**20  # the safetensors library's own limit: a larger header is refused before it is read
TREE_FIELDS = ("optimizer", "rng", "scaler", "quantized")  # the fields that hold tensors besides the weights
RAW_FIELDS = ("tokenizer",)  # text stored as it is (a tokenizer's JSON, which tokenizers.Tokenizer.from_str reads)
DTYPES = {  # safetensors' dtypes charlm stores, as torch's storage names (safe_pickle.STORAGES) and sizes
    "F64": ("DoubleStorage", 8), "F32": ("FloatStorage", 4), "F16": ("HalfStorage", 2),
    "BF16": ("BFloat16Storage", 2), "I64": ("LongStorage", 8), "I32": ("IntStorage", 4),
    "I16": ("ShortStorage", 2), "I8": ("CharStorage", 1), "U8": ("ByteStorage", 1), "BOOL": ("BoolStorage", 1),
}  # fmt: skip
MAX_DIMS = 8  # no tensor of a checkpoint has more than 2


def is_safetensors(p: Path) -> bool:
    """Whether the file is to be read as one: anything but a zip archive (torch.save's format, an older charlm's)."""
    try:
        with open(p, "rb") as f:
            return f.read(4) != b"PK\x03\x04"
    except OSError as e:
        raise CheckpointError(f"cannot read {p}: {e.strerror}") from None


# ---- writing --------------------------------------------------------------------------------------------


def layout(payload: dict) -> tuple[dict, dict[str, str]]:
    """(tensors by entry name, metadata) for a checkpoint's payload: the weights under their own names, every
    other field as JSON. A tensor under two names (a tied head is the embedding table) is stored once: the
    second name is {"@tensor": the first} (for the weights, in metadata "model", which holds only those)."""
    import torch

    tensors: dict[str, torch.Tensor] = {}
    seen: dict[tuple, str] = {}

    def put(name: str, t: torch.Tensor) -> dict | None:
        """Store t as `name`; {"@tensor": its name} when it is already stored under another."""
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype, t.device)
        if t.numel() and key in seen:
            return {"@tensor": seen[key]}
        if name in tensors:
            raise ValueError(f"two tensors named {name!r}")
        tensors[name], seen[key] = t.detach().cpu().contiguous(), name
        return None

    def tree(value, path: str):
        if isinstance(value, torch.Tensor):
            return put(path, value) or {"@tensor": path}
        if isinstance(value, dict):
            if all(isinstance(k, str) and not k.startswith("@") for k in value):
                return {k: tree(v, f"{path}.{k}") for k, v in value.items()}
            return {"@items": [[k, tree(v, f"{path}.{k}")] for k, v in value.items()]}
        if isinstance(value, tuple):
            return {"@tuple": [tree(v, f"{path}.{i}") for i, v in enumerate(value)]}
        if isinstance(value, list):
            return [tree(v, f"{path}.{i}") for i, v in enumerate(value)]
        if value is None or isinstance(value, (str, int, float, bool)):
            return value
        raise TypeError(f"a checkpoint holds tensors and plain values, not a {type(value).__name__} ({path})")

    metadata = {}
    for name, value in payload.items():
        if name == "model":
            aliases = {k: ref for k, t in value.items() if (ref := put(k, t))}
            if aliases:
                metadata[name] = json.dumps(aliases, separators=(",", ":"))
        elif name in RAW_FIELDS and isinstance(value, str):
            metadata[name] = value
        else:
            metadata[name] = json.dumps(tree(value, name), allow_nan=False, separators=(",", ":"))
    return tensors, metadata


def to_bytes(payload: dict) -> bytes:
    from safetensors.torch import save

    tensors, metadata = layout(payload)
    return save(tensors, metadata)


# ---- reading --------------------------------------------------------------------------------------------


class Header:
    """A safetensors file's header, checked: entries (name -> TensorInfo), where the tensors' bytes start,
    and the metadata. Every entry's byte range lies in the file, matches its dtype and shape, and the ranges
    tile the data exactly (as the safetensors library requires: a file this accepts, it accepts)."""

    def __init__(self, p: Path):
        self.path = p
        try:
            with open(p, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                head = f.read(9)
                if len(head) < 9 or head[8:] != b"{":  # a safetensors header is a JSON object
                    raise CheckpointError(
                        f"{p} is not a charlm checkpoint (neither a safetensors file nor a PyTorch archive)"
                    )
                (n,) = struct.unpack("<Q", head[:8])
                if not 2 <= n <= MAX_HEADER or 8 + n > size:
                    raise CheckpointError(
                        f"{p} is truncated or corrupt (its header claims {n:,} bytes of a {size:,}-byte file); "
                        "train again or use another checkpoint"
                    )
                f.seek(8)
                raw = f.read(n)
        except OSError as e:
            raise CheckpointError(f"cannot read {p}: {e.strerror}") from None
        if len(raw) != n:
            raise self.bad("it was cut short while being read")
        self.data_start, data_size = 8 + n, size - 8 - n
        try:
            header = json.loads(raw.decode("utf-8"), parse_constant=_no_constant, object_pairs_hook=_unique)
        except (ValueError, RecursionError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
            raise self.bad(f"its header is not JSON: {last_words(e)}") from None
        if not isinstance(header, dict):
            raise self.bad("its header is not a JSON object")
        meta = header.pop("__metadata__", None) or {}
        if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
            raise self.bad("its metadata is not text")
        self.metadata: dict[str, str] = meta
        self.entries: dict[str, TensorInfo] = {}
        self.ranges: dict[str, tuple[int, int]] = {}
        for name, e in header.items():
            self.entries[name], self.ranges[name] = self._entry(name, e, data_size)
        end = 0
        for begin, stop in sorted(self.ranges.values()):
            if begin != end:
                raise self.bad("its tensors' byte ranges overlap or leave gaps")
            end = stop
        if end != data_size:
            raise self.bad(f"its tensors take {end:,} bytes, the file holds {data_size:,} after its header")

    def bad(self, why: str) -> CheckpointError:
        return CheckpointError(f"{self.path} is not a readable charlm checkpoint ({why})")

    def _entry(self, name: str, e, data_size: int) -> tuple[TensorInfo, tuple[int, int]]:
        label = json.dumps(name)[1:-1][:60]
        if not (isinstance(e, dict) and e.keys() == {"dtype", "shape", "data_offsets"}):
            raise self.bad(f"entry {label} is not a tensor's dtype, shape and data_offsets")
        dtype, shape, offsets = e["dtype"], e["shape"], e["data_offsets"]
        if not isinstance(dtype, str) or dtype not in DTYPES:
            raise self.bad(f"entry {label} holds {json.dumps(dtype)[:20]} values, which charlm never stores")
        if not (isinstance(shape, list) and len(shape) <= MAX_DIMS and all(_count(n) for n in shape)):
            raise self.bad(f"entry {label} has no valid shape")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(_count(n) for n in offsets)):
            raise self.bad(f"entry {label} has no valid byte range")
        begin, end = offsets
        storage, itemsize = DTYPES[dtype]
        numel = math.prod(shape)  # exact: Python's integers, so a huge declared shape cannot wrap around
        if not begin <= end or end - begin != numel * itemsize:
            raise self.bad(f"entry {label}'s byte range does not fit its shape")
        if end > data_size:
            raise CheckpointError(
                f"{self.path} is truncated or corrupt (entry {label} ends {end - data_size:,} bytes past the end of "
                "the file); train again or use another checkpoint"
            )
        stride = tuple(math.prod(shape[i + 1 :]) for i in range(len(shape)))
        return TensorInfo(storage, name, tuple(shape), stride, 0, numel), (begin, end)

    def read_values(self, t: TensorInfo) -> bytes:
        """The stored bytes of one entry (numpy reads them; nothing else is allocated)."""
        begin, end = self.ranges[t.key]
        try:
            with open(self.path, "rb") as f:
                f.seek(self.data_start + begin)
                data = f.read(end - begin)
        except OSError as e:
            raise CheckpointError(f"cannot read {self.path}: {e.strerror}") from None
        if len(data) != end - begin:
            raise self.bad(f"{json.dumps(t.key)[1:-1][:60]}'s values are not all there")
        return data

    def payload(self) -> dict:
        """The checkpoint's fields, as checkpoint.Saved.from_payload takes them: each metadata field's JSON,
        with TensorInfo for each tensor; "model" every entry no other field names (and the names in metadata
        "model" of a weight stored under another name)."""
        out, named = {}, set()
        for field, text in self.metadata.items():
            if field in RAW_FIELDS:
                out[field] = text
                continue
            try:
                value = json.loads(text, parse_constant=_no_constant, object_pairs_hook=_unique)
            except (ValueError, RecursionError) as e:
                raise CheckpointError(
                    f"{self.path} is a damaged charlm checkpoint ({json.dumps(field)[1:-1][:40]} is not JSON: "
                    f"{last_words(e)})"
                ) from None
            out[field] = self._tree(value, named) if field in TREE_FIELDS else value
        model = {k: t for k, t in self.entries.items() if k not in named}
        aliases = out.get("model", {})
        if not (isinstance(aliases, dict) and all(_ref(v) in model and k not in model for k, v in aliases.items())):
            raise self.bad("its metadata's model should name weights the file holds, each under another name")
        out["model"] = model | {k: model[_ref(v)] for k, v in aliases.items()}
        check_tree(self.path, out, budget=64 + 4 * sum(map(len, self.metadata.values())) + 4 * len(self.entries))
        return out

    def _tree(self, value, named: set, depth: int = 0):
        if depth > 32:
            raise self.bad("its metadata nests too deep")
        if isinstance(value, list):
            return [self._tree(v, named, depth + 1) for v in value]
        if not isinstance(value, dict):
            return value
        if "@tensor" in value:
            if _ref(value) not in self.entries:
                raise self.bad("its metadata names a tensor the file does not hold")
            named.add(value["@tensor"])
            return self.entries[value["@tensor"]]
        if "@items" in value or "@tuple" in value:
            (kind, items), *rest = value.items()
            if rest or not isinstance(items, list):
                raise self.bad("its metadata holds a malformed @items or @tuple")
            if kind == "@tuple":
                return tuple(self._tree(v, named, depth + 1) for v in items)
            if not all(isinstance(kv, list) and len(kv) == 2 and isinstance(kv[0], (str, int)) for kv in items):
                raise self.bad("its metadata holds a malformed @items")
            keys = [k for k, _ in items]
            if len(set(keys)) != len(keys):
                raise self.bad("its metadata holds a key twice")
            return {k: self._tree(v, named, depth + 1) for k, v in items}
        return {k: self._tree(v, named, depth + 1) for k, v in value.items()}


def load_tensors(p: Path, header: Header, device: str) -> dict:
    """Every entry, through the safetensors library (memory-mapped), checked to be what the header said:
    the file may have been replaced since it was read."""
    from safetensors.torch import load_file

    try:
        tensors = load_file(p, device=device)
    except Exception as e:  # SafetensorError, OS and torch errors alike: the file is unusable
        raise CheckpointError(f"{p} is not a readable charlm checkpoint ({last_words(e)})") from None
    if tensors.keys() != header.entries.keys() or any(
        tuple(t.shape) != header.entries[k].shape for k, t in tensors.items()
    ):
        raise CheckpointError(f"{p} is not a readable charlm checkpoint (its tensors do not match its header)")
    return tensors


def with_tensors(tree, tensors: dict):
    """A field's tree with each TensorInfo replaced by its loaded tensor."""
    if isinstance(tree, TensorInfo):
        return tensors[tree.key]
    if isinstance(tree, dict):
        return {k: with_tensors(v, tensors) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(with_tensors(v, tensors) for v in tree)
    return tree


def _ref(value) -> str | None:
    """The entry {"@tensor": name} names (None: it is not one)."""
    ok = isinstance(value, dict) and len(value) == 1 and isinstance(value.get("@tensor"), str)
    return value["@tensor"] if ok else None


def _count(n) -> bool:
    return type(n) is int and 0 <= n < 2**63


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")  # NaN, Infinity: Python's extension, which other readers refuse


def _unique(pairs: list) -> dict:
    d = dict(pairs)
    if len(d) != len(pairs):
        raise ValueError("a key twice in one object")
    return d
