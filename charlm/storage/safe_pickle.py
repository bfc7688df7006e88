"""Reading a checkpoint of an older charlm (best.pt, last.pt: torch.save's zip archives, before safetensors),
safely: its zip archive checked before use (no compressed or doubled entries, every CRC), its data.pkl read
without torch and without running code (HeaderUnpickler: plain values, every tensor a TensorInfo, the opcodes a
small crafted file could abuse refused), the tree it gives bounded in size, depth, text and numbers (check_tree;
the safetensors reader bounds its metadata with it too); and torch.load(weights_only=True) with every failure
one clear CheckpointError. checkpoint.py owns what the file means; this module only reads it.
"""

from __future__ import annotations

import collections
import math
import pickle
import sys
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path

from charlm.errors import CheckpointError


def open_archive(p: Path) -> zipfile.ZipFile:
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
        raise CheckpointError(f"{p} is truncated or corrupt ({last_words(e)}); {damaged}") from None
    try:
        if odd := odd_entries(z):
            raise CheckpointError(f"{p} is not a charlm checkpoint ({odd})")
        bad = z.testzip()  # torch.load skips the CRCs: a damaged weight would load silently
        if bad is not None:  # the name as ascii(): on one line, whatever it holds
            raise CheckpointError(f"{p} is corrupt ({ascii(bad)[1:-1]} fails its checksum); {damaged}")
    except zip_errors as e:
        z.close()
        raise CheckpointError(f"{p} is truncated or corrupt ({last_words(e)}); {damaged}") from None
    except CheckpointError:
        z.close()
        raise
    return z


def odd_entries(z: zipfile.ZipFile) -> str | None:
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


STORAGES = {  # torch's storage classes in a data.pkl, by element size (what the header needs of them)
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


class HeaderUnpickler(pickle._Unpickler):
    """Reads a checkpoint's data.pkl without torch: plain values as they are, every tensor as a TensorInfo.
    Like torch.load(weights_only=True), it refuses every class and function but the few a state dict
    names, so a crafted file runs no code here either. It is pickle's pure-Python unpickler, whose memo is a
    dict (the C one allocates an array as long as the largest memo index a file names: a 9-byte data.pkl
    asks for gigabytes), with the opcodes that could take unbounded time or memory refused (see
    _unpickler_dispatch). What it returns is then checked by check_tree."""

    dispatch = _unpickler_dispatch()

    def find_class(self, module: str, name: str):
        if (module, name) == ("collections", "OrderedDict"):
            return _ordered_dict
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _tensor_info
        if module == "torch" and name in STORAGES:
            return name
        raise pickle.UnpicklingError(f"global '{module}.{name}' is not allowed (GLOBAL)")

    def persistent_load(self, pid):
        # torch's storages: ("storage", storage class, key, location, number of values)
        if not (type(pid) is tuple and len(pid) == 5 and pid[0] == "storage" and type(pid[1]) is str):
            raise pickle.UnpicklingError(f"unexpected persistent id (a {type(pid).__name__})")
        if pid[1] not in STORAGES or type(pid[2]) is not str or not (_is_int64(pid[4]) and pid[4] >= 0):
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


def check_tree(p: Path, tree: object, budget: int) -> None:
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


def read_pickle(p: Path, z: zipfile.ZipFile) -> object:
    names = [n for n in z.namelist() if n.endswith("/data.pkl") and n.count("/") == 1]
    if len(names) != 1:
        raise CheckpointError(f"{p} is not a charlm checkpoint (a zip archive, but not one PyTorch wrote)")
    if names[0].replace("data.pkl", "byteorder") in z.namelist():
        if z.read(names[0].replace("data.pkl", "byteorder")) != sys.byteorder.encode():
            raise CheckpointError(f"{p} was written on a machine of another byte order: it cannot be read here")
    try:
        with z.open(names[0]) as f:
            tree = HeaderUnpickler(f).load()
    except pickle.UnpicklingError as e:
        if "GLOBAL" in str(e):  # it names a class or function: the file wants to run code
            raise CheckpointError(
                f"{p} is not a charlm checkpoint: it holds Python objects, which are never loaded (only tensors and plain data)"
            ) from None
        raise CheckpointError(f"{p} is not a readable charlm checkpoint ({last_words(e)})") from None
    except Exception as e:  # zip errors, truncated pickles: the file is unusable
        raise CheckpointError(f"{p} is not a readable charlm checkpoint ({last_words(e)})") from None
    check_tree(p, tree, budget=64 + 4 * z.getinfo(names[0]).file_size)  # torch's pickles hold < 1 value a byte
    return tree


def archive_values(p: Path, z: zipfile.ZipFile):
    """read_values(TensorInfo) -> the stored bytes of a tensor of the archive (numpy reads them, no torch)."""
    prefix = next(n for n in z.namelist() if n.endswith("/data.pkl"))[: -len("data.pkl")]

    def read_values(t: TensorInfo) -> bytes:
        try:
            return z.read(f"{prefix}data/{t.key}")
        except (KeyError, ValueError, zipfile.BadZipFile, OSError) as e:
            raise CheckpointError(f"{p} is not a readable charlm checkpoint ({last_words(e)})") from None

    return read_values


def load_tensors(p: Path, map_location) -> object:
    """torch.load with weights_only=True: tensors and plain containers only, so a crafted file cannot run code."""
    import torch

    try:
        with warnings.catch_warnings():  # torch's warnings would be extra lines on the user's terminal
            warnings.simplefilter("ignore")
            return torch.load(p, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        raise CheckpointError(f"{p} is not a readable charlm checkpoint ({last_words(e)})") from None
    except Exception as e:  # zip, storage and OS errors alike: the file is unusable
        raise CheckpointError(f"{p} is not a readable charlm checkpoint ({last_words(e)})") from None


def last_words(e: Exception) -> str:
    # the start of the message, on one line (load_state_dict's first line alone says nothing)
    text = " ".join(line.strip() for line in str(e).splitlines() if line.strip())
    return f"{type(e).__name__}: {text[:160]}" if text else type(e).__name__
