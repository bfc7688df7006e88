"""An older charlm's .pt checkpoint (torch.save's zip archive) is read by safe_pickle without running code, in
bounded memory and time: every crafted archive, pickle and payload value that the fuzzer
(benchmarks/fuzz_checkpoint.py) and the property tests (test_properties.py) found is refused in one line that
names the file (issue 20). Each test fails on the code before its fix: the symptom is in its docstring.

Crafted checkpoints are written here byte for byte where torch.save cannot write them (a data.pkl of hand-made
opcodes, a tensor rebuilt from a plain tuple): `crafted` pickles a payload as torch.save does, with hooks for
what a crafted file may change."""

from __future__ import annotations

import collections
import io
import math
import pickle
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from conftest import cli, legacy_payload, one_line_error, run_limited, tampered

from charlm.errors import CheckpointError
from charlm.storage import checkpoint
from charlm.storage.checkpoint import OLD_LAST, Saved

# ---- ways to change an older charlm's checkpoint (conftest's old_pt) -----------------------------------


def with_data_pkl(base: Path, dest: Path, pkl: bytes, compression: int = zipfile.ZIP_STORED, extra=()) -> Path:
    """base's archive with its data.pkl replaced (and entries added)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(base) as src, zipfile.ZipFile(dest, "w", compression=compression) as z:
        for info in src.infolist():
            z.writestr(info.filename, pkl if info.filename.endswith("/data.pkl") else src.read(info))
        for name, data in extra:
            z.writestr(name, data)
    return dest


class Tensor:
    """A tensor as a crafted data.pkl may write it: `state` adds a BUILD after it, `storage` replaces the
    persistent id of its storage by any object."""

    def __init__(self, key: str, shape: tuple, state=None, storage=None):
        self.key, self.shape, self.state, self.storage = key, shape, state, storage


class _Pid:
    def __init__(self, key: str, numel: int):
        self.key, self.numel = key, numel


class _Pickler(pickle.Pickler):
    def reducer_override(self, obj):
        if isinstance(obj, Tensor):
            stride = tuple(math.prod(obj.shape[i + 1 :]) for i in range(len(obj.shape)))
            storage = obj.storage if obj.storage is not None else _Pid(obj.key, math.prod(obj.shape))
            args = (storage, 0, obj.shape, stride, False, collections.OrderedDict())
            return (torch._utils._rebuild_tensor_v2, args) + ((obj.state,) if obj.state is not None else ())
        return NotImplemented

    def persistent_id(self, obj):
        return ("storage", torch.FloatStorage, obj.key, "cpu", obj.numel) if isinstance(obj, _Pid) else None


def crafted(base: Path, dest: Path, change) -> Path:
    """base's payload pickled again as torch.save does, after change(payload, tensors) (tensors: the model's,
    as Tensor) has edited it in place."""
    data = legacy_payload(base)
    with zipfile.ZipFile(base) as z:
        prefix = next(n for n in z.namelist() if n.endswith("/data.pkl"))[: -len("data.pkl")]
    tensors = {name: Tensor(f"w{i}", tuple(t.shape)) for i, (name, t) in enumerate(data["model"].items())}
    values = {tensors[name].key: t.contiguous().numpy().tobytes() for name, t in data["model"].items()}
    data["model"] = dict(tensors)
    change(data, tensors)
    buf = io.BytesIO()
    _Pickler(buf, protocol=2).dump(data)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(dest, "w") as z:
        z.writestr(prefix + "data.pkl", buf.getvalue())
        z.writestr(prefix + "byteorder", sys.byteorder)
        for key, value in values.items():
            z.writestr(f"{prefix}data/{key}", value)
    return dest


def refused(path: Path, *fragments: str) -> str:
    """read_header refuses the file with one line that names it (and holds each fragment)."""
    with pytest.raises(CheckpointError) as e:
        checkpoint.read_header(path)
    message = str(e.value)
    assert "\n" not in message and str(path) in message, message
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    return message


def refused_in_a_process(proc: subprocess.CompletedProcess, *fragments: str) -> None:
    err = proc.stderr.strip()
    assert proc.returncode == 1 and err.startswith("error: ") and "\n" not in err, (proc.returncode, proc.stderr)
    assert "please report" not in err
    for fragment in fragments:
        assert fragment in err, (fragment, err)


def test_the_crafting_helpers_write_what_the_reader_accepts(old_pt, tmp_path):
    """The helpers' own check: unchanged, each of their files reads (so a refusal below is the change's)."""
    checkpoint.read_header(crafted(old_pt, tmp_path / "a.pt", lambda data, tensors: None))
    checkpoint.read_header(tampered(old_pt, tmp_path / "b.pt"))
    with zipfile.ZipFile(old_pt) as z:
        pkl = z.read(next(n for n in z.namelist() if n.endswith("/data.pkl")))
    checkpoint.load(with_data_pkl(old_pt, tmp_path / "c.pt", pkl))


# ---- the pickle: memory, time and the interpreter itself -------------------------------------------------


def test_a_memo_index_allocates_nothing(old_pt, tmp_path):
    """Fuzzer: a 9-byte data.pkl (LONG_BINPUT 2^27) made the C unpickler allocate a 2^28-slot memo: 2 GB and
    4 s for `charlm info` (2^29: 8 GB). The pure-Python unpickler's memo is a dict."""
    pkl = b"\x80\x02N" + b"r" + (2**27).to_bytes(4, "little") + b"."  # PROTO 2, None, LONG_BINPUT 2^27, STOP
    bad = with_data_pkl(old_pt, tmp_path / "memo.pt", pkl)
    refused_in_a_process(run_limited(["info", bad], headroom_mb=500), "a PyTorch file written by something else")


def test_a_deep_tuple_as_a_key_is_refused_not_a_segfault(old_pt, tmp_path):
    """A dict key of 300,000 nested tuples (300 KB): hashing it recursed in C until the interpreter died
    (SIGSEGV, exit -11). Keys and set elements must now be plain values."""
    pkl = b"\x80\x02}" + b")" + b"\x85" * 300_000 + b"Ns."  # {(((...),),): None}
    bad = with_data_pkl(old_pt, tmp_path / "deep.pt", pkl)
    refused_in_a_process(
        run_limited(["info", bad], headroom_mb=800, timeout=60), "a dict key or set element that is not a plain value"
    )


def _shared_tuples(depth: int) -> bytes:
    """Opcodes that leave t_depth on the stack, t_0 = (), t_i+1 = (t_i, t_i) through the memo: 2^depth items."""
    ops = b")q\x000"  # EMPTY_TUPLE, BINPUT 0, POP
    for i in range(depth):
        ops += b"h" + bytes([i]) + b"h" + bytes([i]) + b"\x86q" + bytes([i + 1]) + b"0"  # BINGET i twice, TUPLE2
    return ops + b"h" + bytes([depth])


def test_a_key_that_shares_its_items_is_refused_not_a_hang(old_pt, tmp_path):
    """A key of 80 tuples that share their items (2^80 to hash) hung `charlm info` for ever."""
    bad = with_data_pkl(old_pt, tmp_path / "dag.pt", b"\x80\x02}" + _shared_tuples(80) + b"Ns.")
    refused_in_a_process(run_limited(["info", bad], headroom_mb=800, timeout=30), "not a plain value")


def test_a_persistent_id_that_shares_its_items_is_refused_not_a_hang(old_pt, tmp_path):
    """The same tuples as a storage's persistent id hung it too: its error message printed str(pid)[:40]."""
    bad = with_data_pkl(old_pt, tmp_path / "pid.pt", b"\x80\x02" + _shared_tuples(80) + b"Q.")  # BINPERSID
    refused_in_a_process(run_limited(["info", bad], headroom_mb=800, timeout=30), "unexpected persistent id (a tuple)")


def test_a_config_value_that_shares_its_items_is_refused_not_a_hang(old_pt, tmp_path):
    """A model kind of 60 nested lists that share their items (2^60 values, 700 bytes): the config's error
    message printed it, which never ends. The payload may now hold at most 4 values per byte of data.pkl."""
    kind = []
    for _ in range(60):
        kind = [kind, kind]
    bad = tampered(old_pt, tmp_path / "kind.pt", model_config={"kind": kind})
    assert bad.stat().st_size < 10_000
    refused_in_a_process(
        run_limited(["info", bad], headroom_mb=800, timeout=30), "its header nests too deep or holds too much"
    )


def test_a_deeply_nested_config_value_is_one_line(old_pt, tmp_path):
    """A model kind of 3000 nested lists: RecursionError printing it ("unexpected RecursionError ... please
    report it"). The payload may now nest 32 deep."""
    kind = 0
    for _ in range(3000):
        kind = [kind]
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(20_000)  # for the pickler
    try:
        bad = tampered(old_pt, tmp_path / "deep.pt", model_config={"kind": kind})
    finally:
        sys.setrecursionlimit(limit)
    one_line_error(cli("info", bad), "its header nests too deep or holds too much")


def test_an_out_of_band_buffer_allocates_nothing(old_pt, tmp_path):
    """Protocol 5's BYTEARRAY8 makes the pure-Python unpickler allocate the size it claims before reading
    it: refused, as torch.save never writes one (a guard for the unpickler this fix chose)."""
    pkl = b"\x80\x05\x96" + (2**31).to_bytes(8, "little") + b"."
    bad = with_data_pkl(old_pt, tmp_path / "buffer.pt", pkl)
    refused_in_a_process(run_limited(["info", bad], headroom_mb=500), "an out-of-band buffer")


# ---- tensors changed after their checks --------------------------------------------------------------


def test_build_cannot_change_a_tensor_after_its_checks(old_pt, tmp_path):
    """A BUILD after a tensor set its storage size to text, past _tensor_info's checks: `charlm info` said
    "unexpected TypeError: '<=' not supported between instances of 'int' and 'str' ... please report it"."""

    def change(data, tensors):
        first = next(iter(tensors.values()))
        first.state = {"storage_numel": "many"}

    refused(crafted(old_pt, tmp_path / "build.pt", change), "BUILD of something other than a state dict")


def test_a_tensor_needs_a_storage_from_the_archive(old_pt, tmp_path):
    """A tensor rebuilt from a plain tuple instead of a storage's persistent id kept whatever the tuple held
    (here a size of text): the same TypeError as above."""

    def change(data, tensors):
        first = next(iter(tensors.values()))
        first.storage = ("FloatStorage", first.key, "many")

    refused(crafted(old_pt, tmp_path / "tuple.pt", change), "a malformed tensor")


# ---- the archive ---------------------------------------------------------------------------------------------


def test_compressed_entries_are_refused(old_pt, tmp_path):
    """torch.save stores its entries; a deflated one (the fuzzer's: with a damaged stream) raised zlib.error
    ("unexpected error ... please report it"), and a few KB of deflate can hold gigabytes of weights (the model
    loaded is no longer bounded by the file's size)."""
    with zipfile.ZipFile(old_pt) as z:
        pkl = z.read(next(n for n in z.namelist() if n.endswith("/data.pkl")))
    bad = with_data_pkl(old_pt, tmp_path / "deflated.pt", pkl, compression=zipfile.ZIP_DEFLATED)
    refused(bad, "its archive holds compressed entries")


def test_two_entries_of_one_name_are_refused(old_pt, tmp_path):
    """Python's zipfile reads the last of two entries of one name; torch.load might read the other."""
    with zipfile.ZipFile(old_pt) as z:
        pkl_name = next(n for n in z.namelist() if n.endswith("/data.pkl"))
        pkl = z.read(pkl_name)
    with pytest.warns(UserWarning, match="Duplicate name"):
        bad = with_data_pkl(old_pt, tmp_path / "twice.pt", pkl, extra=[(pkl_name, pkl)])
    refused(bad, "two entries of one name")


def test_an_entry_name_with_a_newline_is_one_line(old_pt, tmp_path):
    """The fuzzer's: an entry named "...\\nPK" that fails its checksum: the message printed the name as it was,
    on two lines."""
    bad = with_data_pkl(old_pt, tmp_path / "name.pt", b"", extra=[("archive/x\ny", b"1234")])
    data = bytearray(bad.read_bytes())
    at = data.rindex(b"1234")
    data[at] = ord("5")  # its CRC no longer holds
    bad.write_bytes(bytes(data))
    assert "x\\ny fails its checksum" in refused(bad)


def test_a_weight_name_with_a_newline_is_one_line(old_pt, tmp_path):
    """The fuzzer's (its 30-minute run on the final code): a state dict key "t\\neight" was printed as it was,
    so the refusal "its weights do not match its config (... unexpected t / eight)" took two lines."""

    def rename(data, tensors):
        data["model"]["t\neight" + "x" * 500] = data["model"].pop("tok_emb.weight")

    bad = crafted(old_pt, tmp_path / "renamed.pt", rename)
    message = refused(bad, "missing tok_emb.weight", "unexpected t\\neight")
    assert len(message) < 400, message
    one_line_error(cli("info", bad), "unexpected t\\neight")


# ---- the payload's values ----------------------------------------------------------------------------------


VALUES = [
        (dict(step=10**5000), "it holds a number of 16610 bits"),  # str() of it raised ValueError (info, runs)
        (dict(params=10**400), "it holds a number of 1329 bits"),  # runs: OverflowError dividing it by 1e6
        (dict(model_config={"kind": 10**5000}), "it holds a number of 16610 bits"),
        (dict(train_seconds=math.nan), "train_seconds should be a finite number of at least 0, not nan"),
        (dict(train_seconds=math.inf), "train_seconds should be a finite number of at least 0, not inf"),
        (dict(step=-5), "step should be a whole number from 0 up, not -5"),
        (dict(world_size=0), "world_size should be a whole number from 1 up, not 0"),
        (dict(best_val_loss=-1.0, best_val_bpc=1.0), "best_val_loss should be a finite number of at least 0"),
        (dict(corpus={"name": 5}), "corpus name should be str, not int"),  # runs: AttributeError in safe_text
        (dict(corpus={"chars_per_token": "x"}), "corpus chars_per_token should be int or float, not str"),
        (dict(corpus={"chars_per_token": 0.0}), "corpus chars_per_token should be a finite number of at least 1e-09"),
        (dict(metrics={"val_loss": math.nan}), "metric val_loss should be a finite number, not nan"),
        (dict(weights_sha256=[1, 2]), "weights_sha256 should be a list of digests"),
        (dict(corpus={"name": None}), "corpus name should be str, not NoneType"),  # property test: accepted
        (dict(corpus={"chars_per_token": None}), "corpus chars_per_token should be int or float, not NoneType"),
        (dict(model_config=None), "incomplete charlm checkpoint (missing model_config)"),  # AttributeError
        (dict(model=None), "incomplete charlm checkpoint (missing model)"),  # AttributeError
        (dict(model_config={"n_layers": 1.0}), "--layers must be a whole number, got 1.0"),  # TypeError in range()
        (dict(model_config={"d_model": 4.0}), "--d-model must be a whole number, got 4.0"),  # passed info, broke sample
        (dict(train_config={"seed": 1.5}), "--seed must be a whole number, got 1.5"),  # passed; a resume broke
        (dict(train_config={"lr": "x"}), "--lr must be a number, got 'x'"),  # was "TypeError: '<' not supported"
        (dict(model_config={"kind": "x\ny"}), "unknown --model 'x\\ny'"),  # the message was two lines
        (dict(run_name="x\ud800y"), "it holds text that is not valid Unicode"),  # info: UnicodeEncodeError
]  # fmt: skip


@pytest.mark.parametrize("changes, message", VALUES, ids=[f"{'+'.join(c)}-{i}" for i, (c, _) in enumerate(VALUES)])
def test_values_out_of_range_are_one_line_everywhere(old_pt, tmp_path, changes, message):
    """Each of these passed the reader, and made info, runs or sample crash ("unexpected ... please report it"),
    print a message of two lines, or accept the file and fail further on; now each is refused on reading, and
    `charlm runs` shows the run as unreadable."""
    run = tmp_path / "runs" / "bad"
    bad = tampered(old_pt, run / OLD_LAST, **changes)
    refused(bad, message)
    one_line_error(cli("info", bad), message)
    r = cli("runs", run.parent)
    assert r.exit_code == 0 and "unreadable" in r.stdout, r.output


def test_a_payload_alone_is_checked_without_the_tree_check(old_pt):
    """The payload property test calls Saved.from_payload alone (read_header's _check_tree, which refuses
    numbers over 64 bits, comes before it): a 5000-digit number inside a config value, or as a metric, made
    its message raise ValueError (reprlib.repr and str() of it)."""
    data = legacy_payload(old_pt)
    for changes in (
        {"model_config": {**data["model_config"], "context": {"": 10**5000}}},
        {"metrics": {"x": 10**5000}},
    ):
        with pytest.raises(CheckpointError, match="a number of 16610 bits"):
            Saved.from_payload({**data, **changes}, old_pt)


def test_a_run_in_a_directory_of_undecodable_bytes_still_reads(old_pt, tmp_path):
    """The Unicode check above keeps what surrogateescape makes of a file name's undecodable bytes (a run
    directory named b"run\\xff" writes run_name "run\\udcff"): a real checkpoint, not a damaged one."""
    ok = tampered(old_pt, tmp_path / "ok.pt", run_name="run\udcff", corpus={"name": "c\udcfe.txt"})
    assert checkpoint.read_header(ok).run_name == "run\udcff"
