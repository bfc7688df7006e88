"""Issue 20: what the fuzzer (benchmarks/fuzz_checkpoint.py) and the property tests (test_properties.py) found,
one regression test each. Every test fails on the code before its fix: the symptom is in its docstring.

Crafted checkpoints are written here byte for byte where torch.save cannot write them (a data.pkl of hand-made
opcodes, a tensor rebuilt from a plain tuple): `crafted` pickles a payload as torch.save does, with hooks for
what a crafted file may change."""

from __future__ import annotations

import collections
import io
import json
import math
import os
import pickle
import subprocess
import sys
import warnings
import zipfile
from pathlib import Path

import pytest
import torch
from conftest import cli, legacy_payload, one_line_error, saved_model

from charlm import checkpoint, runs
from charlm.checkpoint import OLD_LAST, Saved
from charlm.config import ModelConfig, SampleConfig
from charlm.errors import CheckpointError
from charlm.generate import sample_next_token, sampling_probs
from charlm.models import build_model
from charlm.tokenizer import BPETokenizer, tokenizer_from_json

# ---- a tiny checkpoint, and ways to change it -----------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """A run directory with a valid last.pt of an older charlm (torch.save's archive, what these findings are
    about): a transformer of 1 layer × 4 with a 3-character vocabulary."""
    run = tmp_path_factory.mktemp("fuzz") / "run"
    run.mkdir()
    torch.manual_seed(0)
    cfg = ModelConfig(kind="transformer", vocab_size=3, n_layers=1, d_model=4, n_heads=2, context=4)
    model = build_model(cfg)
    saved = saved_model(model, "ab\n")
    torch.save({**saved.to_payload(), "version": 2}, run / OLD_LAST)
    return run / OLD_LAST


def tampered(base: Path, dest: Path, **changes) -> Path:
    """A copy of the checkpoint with fields replaced (a dict for a config or the corpus: merged into it)."""
    data = legacy_payload(base)
    for name in ("model_config", "train_config", "corpus"):
        if isinstance(changes.get(name), dict):
            changes[name] = {**data[name], **changes[name]}
    dest.parent.mkdir(parents=True, exist_ok=True)
    torch.save({**data, **changes}, dest)
    return dest


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


def info_in_a_process(path: Path, headroom_mb: int = 800, timeout: float = 60) -> subprocess.CompletedProcess:
    """`charlm info PATH` in its own process (a crash there is an exit code, not the end of the test run), with
    at most headroom_mb of memory beyond what it takes once imported (a failure never takes the machine's)."""
    code = (
        "import resource, sys; from charlm.cli import main; "
        "size = next(int(l.split()[1]) << 10 for l in open('/proc/self/status') if l.startswith('VmSize:')); "
        f"resource.setrlimit(resource.RLIMIT_AS, (size + ({headroom_mb} << 20),) * 2); "
        "sys.argv = ['charlm', 'info', sys.argv[1]]; main()"
    )
    return subprocess.run(
        [sys.executable, "-c", code, str(path)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "CHARLM_DEBUG": ""},
    )


def refused_in_a_process(proc: subprocess.CompletedProcess, *fragments: str) -> None:
    err = proc.stderr.strip()
    assert proc.returncode == 1 and err.startswith("error: ") and "\n" not in err, (proc.returncode, proc.stderr)
    assert "please report" not in err
    for fragment in fragments:
        assert fragment in err, (fragment, err)


def test_the_crafting_helpers_write_what_the_reader_accepts(tiny, tmp_path):
    """The helpers' own check: unchanged, each of their files reads (so a refusal below is the change's)."""
    checkpoint.read_header(crafted(tiny, tmp_path / "a.pt", lambda data, tensors: None))
    checkpoint.read_header(tampered(tiny, tmp_path / "b.pt"))
    with zipfile.ZipFile(tiny) as z:
        pkl = z.read(next(n for n in z.namelist() if n.endswith("/data.pkl")))
    checkpoint.load(with_data_pkl(tiny, tmp_path / "c.pt", pkl))


# ---- the pickle: memory, time and the interpreter itself -------------------------------------------------


def test_a_memo_index_allocates_nothing(tiny, tmp_path):
    """Fuzzer: a 9-byte data.pkl (LONG_BINPUT 2^27) made the C unpickler allocate a 2^28-slot memo: 2 GB and
    4 s for `charlm info` (2^29: 8 GB). The pure-Python unpickler's memo is a dict."""
    pkl = b"\x80\x02N" + b"r" + (2**27).to_bytes(4, "little") + b"."  # PROTO 2, None, LONG_BINPUT 2^27, STOP
    bad = with_data_pkl(tiny, tmp_path / "memo.pt", pkl)
    refused_in_a_process(info_in_a_process(bad, headroom_mb=500), "a PyTorch file written by something else")


def test_a_deep_tuple_as_a_key_is_refused_not_a_segfault(tiny, tmp_path):
    """A dict key of 300,000 nested tuples (300 KB): hashing it recursed in C until the interpreter died
    (SIGSEGV, exit -11). Keys and set elements must now be plain values."""
    pkl = b"\x80\x02}" + b")" + b"\x85" * 300_000 + b"Ns."  # {(((...),),): None}
    bad = with_data_pkl(tiny, tmp_path / "deep.pt", pkl)
    refused_in_a_process(info_in_a_process(bad), "a dict key or set element that is not a plain value")


def _shared_tuples(depth: int) -> bytes:
    """Opcodes that leave t_depth on the stack, t_0 = (), t_i+1 = (t_i, t_i) through the memo: 2^depth items."""
    ops = b")q\x000"  # EMPTY_TUPLE, BINPUT 0, POP
    for i in range(depth):
        ops += b"h" + bytes([i]) + b"h" + bytes([i]) + b"\x86q" + bytes([i + 1]) + b"0"  # BINGET i twice, TUPLE2
    return ops + b"h" + bytes([depth])


def test_a_key_that_shares_its_items_is_refused_not_a_hang(tiny, tmp_path):
    """A key of 80 tuples that share their items (2^80 to hash) hung `charlm info` for ever."""
    bad = with_data_pkl(tiny, tmp_path / "dag.pt", b"\x80\x02}" + _shared_tuples(80) + b"Ns.")
    refused_in_a_process(info_in_a_process(bad, timeout=30), "not a plain value")


def test_a_persistent_id_that_shares_its_items_is_refused_not_a_hang(tiny, tmp_path):
    """The same tuples as a storage's persistent id hung it too: its error message printed str(pid)[:40]."""
    bad = with_data_pkl(tiny, tmp_path / "pid.pt", b"\x80\x02" + _shared_tuples(80) + b"Q.")  # BINPERSID
    refused_in_a_process(info_in_a_process(bad, timeout=30), "unexpected persistent id (a tuple)")


def test_a_config_value_that_shares_its_items_is_refused_not_a_hang(tiny, tmp_path):
    """A model kind of 60 nested lists that share their items (2^60 values, 700 bytes): the config's error
    message printed it, which never ends. The payload may now hold at most 4 values per byte of data.pkl."""
    kind = []
    for _ in range(60):
        kind = [kind, kind]
    bad = tampered(tiny, tmp_path / "kind.pt", model_config={"kind": kind})
    assert bad.stat().st_size < 10_000
    refused_in_a_process(info_in_a_process(bad, timeout=30), "its header nests too deep or holds too much")


def test_a_deeply_nested_config_value_is_one_line(tiny, tmp_path):
    """A model kind of 3000 nested lists: RecursionError printing it ("unexpected RecursionError ... please
    report it"). The payload may now nest 32 deep."""
    kind = 0
    for _ in range(3000):
        kind = [kind]
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(20_000)  # for the pickler
    try:
        bad = tampered(tiny, tmp_path / "deep.pt", model_config={"kind": kind})
    finally:
        sys.setrecursionlimit(limit)
    one_line_error(cli("info", bad), "its header nests too deep or holds too much")


def test_an_out_of_band_buffer_allocates_nothing(tiny, tmp_path):
    """Protocol 5's BYTEARRAY8 makes the pure-Python unpickler allocate the size it claims before reading
    it: refused, as torch.save never writes one (a guard for the unpickler this fix chose)."""
    pkl = b"\x80\x05\x96" + (2**31).to_bytes(8, "little") + b"."
    bad = with_data_pkl(tiny, tmp_path / "buffer.pt", pkl)
    refused_in_a_process(info_in_a_process(bad, headroom_mb=500), "an out-of-band buffer")


# ---- tensors changed after their checks --------------------------------------------------------------


def test_build_cannot_change_a_tensor_after_its_checks(tiny, tmp_path):
    """A BUILD after a tensor set its storage size to text, past _tensor_info's checks: `charlm info` said
    "unexpected TypeError: '<=' not supported between instances of 'int' and 'str' ... please report it"."""

    def change(data, tensors):
        first = next(iter(tensors.values()))
        first.state = {"storage_numel": "many"}

    refused(crafted(tiny, tmp_path / "build.pt", change), "BUILD of something other than a state dict")


def test_a_tensor_needs_a_storage_from_the_archive(tiny, tmp_path):
    """A tensor rebuilt from a plain tuple instead of a storage's persistent id kept whatever the tuple held
    (here a size of text): the same TypeError as above."""

    def change(data, tensors):
        first = next(iter(tensors.values()))
        first.storage = ("FloatStorage", first.key, "many")

    refused(crafted(tiny, tmp_path / "tuple.pt", change), "a malformed tensor")


# ---- the archive ---------------------------------------------------------------------------------------------


def test_compressed_entries_are_refused(tiny, tmp_path):
    """torch.save stores its entries; a deflated one (the fuzzer's: with a damaged stream) raised zlib.error
    ("unexpected error ... please report it"), and a few KB of deflate can hold gigabytes of weights (the model
    loaded is no longer bounded by the file's size)."""
    with zipfile.ZipFile(tiny) as z:
        pkl = z.read(next(n for n in z.namelist() if n.endswith("/data.pkl")))
    bad = with_data_pkl(tiny, tmp_path / "deflated.pt", pkl, compression=zipfile.ZIP_DEFLATED)
    refused(bad, "its archive holds compressed entries")


def test_two_entries_of_one_name_are_refused(tiny, tmp_path):
    """Python's zipfile reads the last of two entries of one name; torch.load might read the other."""
    with zipfile.ZipFile(tiny) as z:
        pkl_name = next(n for n in z.namelist() if n.endswith("/data.pkl"))
        pkl = z.read(pkl_name)
    with pytest.warns(UserWarning, match="Duplicate name"):
        bad = with_data_pkl(tiny, tmp_path / "twice.pt", pkl, extra=[(pkl_name, pkl)])
    refused(bad, "two entries of one name")


def test_an_entry_name_with_a_newline_is_one_line(tiny, tmp_path):
    """The fuzzer's: an entry named "...\\nPK" that fails its checksum: the message printed the name as it was,
    on two lines."""
    bad = with_data_pkl(tiny, tmp_path / "name.pt", b"", extra=[("archive/x\ny", b"1234")])
    data = bytearray(bad.read_bytes())
    at = data.rindex(b"1234")
    data[at] = ord("5")  # its CRC no longer holds
    bad.write_bytes(bytes(data))
    assert "x\\ny fails its checksum" in refused(bad)


def test_a_weight_name_with_a_newline_is_one_line(tiny, tmp_path):
    """The fuzzer's (its 30-minute run on the final code): a state dict key "t\\neight" was printed as it was,
    so the refusal "its weights do not match its config (... unexpected t / eight)" took two lines."""

    def rename(data, tensors):
        data["model"]["t\neight" + "x" * 500] = data["model"].pop("tok_emb.weight")

    bad = crafted(tiny, tmp_path / "renamed.pt", rename)
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
def test_values_out_of_range_are_one_line_everywhere(tiny, tmp_path, changes, message):
    """Each of these passed the reader, and made info, runs or sample crash ("unexpected ... please report it"),
    print a message of two lines, or accept the file and fail further on; now each is refused on reading, and
    `charlm runs` shows the run as unreadable."""
    run = tmp_path / "runs" / "bad"
    bad = tampered(tiny, run / OLD_LAST, **changes)
    refused(bad, message)
    one_line_error(cli("info", bad), message)
    r = cli("runs", run.parent)
    assert r.exit_code == 0 and "unreadable" in r.stdout, r.output


def test_a_payload_alone_is_checked_without_the_tree_check(tiny):
    """The payload property test calls Saved.from_payload alone (read_header's _check_tree, which refuses
    numbers over 64 bits, comes before it): a 5000-digit number inside a config value, or as a metric, made
    its message raise ValueError (reprlib.repr and str() of it)."""
    data = legacy_payload(tiny)
    for changes in (
        {"model_config": {**data["model_config"], "context": {"": 10**5000}}},
        {"metrics": {"x": 10**5000}},
    ):
        with pytest.raises(CheckpointError, match="a number of 16610 bits"):
            Saved.from_payload({**data, **changes}, tiny)


def test_a_run_in_a_directory_of_undecodable_bytes_still_reads(tiny, tmp_path):
    """The Unicode check above keeps what surrogateescape makes of a file name's undecodable bytes (a run
    directory named b"run\\xff" writes run_name "run\\udcff"): a real checkpoint, not a damaged one."""
    ok = tampered(tiny, tmp_path / "ok.pt", run_name="run\udcff", corpus={"name": "c\udcfe.txt"})
    assert checkpoint.read_header(ok).run_name == "run\udcff"


# ---- tokenizers --------------------------------------------------------------------------------------------


TOKENIZERS = [
        ("[]", "unknown tokenizer kind None"),  # AttributeError: 'list' object has no attribute 'get'
        ('{"kind": "char", "chars": 5}', "a char vocabulary must be"),  # TypeError: 'int' object is not iterable
        ('{"kind": "char", "chars": [1, 2]}', "a char vocabulary must be"),  # TypeError: len() of an int
        ('{"kind": "char"}', "a char vocabulary must be"),  # KeyError: 'chars'
        ('{"kind": "char", "chars": ["a", "\\ud800"]}', "a char vocabulary must be"),  # accepted; printing failed
        ('{"kind": "bpe"}', "a BPE tokenizer holds a Hugging Face tokenizer"),  # KeyError: 'tokenizer'
        ('{"kind": "bpe", "tokenizer": {}}', "not a Hugging Face tokenizer"),  # the library's bare Exception
        ("[" * 100_000, "a tokenizer is JSON, and this is not (RecursionError)"),  # RecursionError
]  # fmt: skip


@pytest.mark.parametrize("text, message", TOKENIZERS, ids=[t[:24] for t, _ in TOKENIZERS])
def test_a_bad_tokenizer_is_a_value_error(text, message):
    """Property tests: tokenizer_from_json raised AttributeError, TypeError, KeyError or the tokenizers
    library's bare Exception on JSON that is not a tokenizer (a damaged token cache, data.prepare, was then an
    "unexpected" error); it is a ValueError that says what is wrong."""
    with pytest.raises(ValueError) as e:
        tokenizer_from_json(text)
    assert type(e.value) is ValueError and message in str(e.value) and "\n" not in str(e.value)


def test_a_char_of_an_undecodable_byte_has_its_byte():
    """The tokenizer property test: a char vocabulary may hold surrogateescape's U+DC80-U+DCFF (they stay
    allowed), but token_bytes raised UnicodeEncodeError for one: the streaming output of every token."""
    tok = tokenizer_from_json(json.dumps({"kind": "char", "chars": ["a", "\udcff"]}))
    assert tok.token_bytes(1) == b"\xff" and tok.decode([0, 1]) == "a\udcff"


@pytest.mark.parametrize("drop", ["decoder", "pre_tokenizer", "byte"])
def test_a_bpe_tokenizer_that_garbles_text_is_refused(drop):
    """The tokenizer property test: a BPE JSON without its decoder (or pre-tokenizer) loaded, and gave back
    "0 0" for "00"; one without a byte's token dropped that byte from every text. Both are refused now."""
    d = json.loads(BPETokenizer.train(["abcabc abab"] * 20, vocab_size=260).to_json())
    if drop == "byte":
        del d["tokenizer"]["model"]["vocab"]["!"]
        d["tokenizer"]["model"]["vocab"] = {k: i for i, k in enumerate(d["tokenizer"]["model"]["vocab"])}
        d["tokenizer"]["model"]["merges"] = []
    else:
        d["tokenizer"][drop] = None
    with pytest.raises(ValueError, match="all 256 bytes|does not give back the text it encodes"):
        tokenizer_from_json(json.dumps(d))


def test_a_bpe_vocabulary_with_a_gap_is_a_value_error():
    """A BPE vocabulary that skips an id (id_to_token is None there): TypeError building the token table."""
    tok = BPETokenizer.train(["abcabc abab"] * 20, vocab_size=260)
    d = json.loads(tok.to_json())
    d["tokenizer"]["model"]["vocab"] = {k: v + (v >= 100) for k, v in d["tokenizer"]["model"]["vocab"].items()}
    with pytest.raises(ValueError, match="byte-level tokens numbered from 0, without gaps"):
        tokenizer_from_json(json.dumps(d))


# ---- metrics.jsonl ------------------------------------------------------------------------------------------


def test_a_damaged_metrics_file_is_read_as_far_as_it_goes(tmp_path):
    """Issue 20's defect: a metrics.jsonl ending in a torn or binary line made info and plot say "unexpected
    UnicodeDecodeError ... please report it". read_metrics skips and counts what it cannot read."""
    good = [{"step": s, "train_loss": 2.0, "val_loss": 2.1, "val_bpc": 3.0, "elapsed": s / 10} for s in (10, 20)]
    lines = [json.dumps(r).encode() for r in good]
    (tmp_path / "metrics.jsonl").write_bytes(b"\n".join([lines[0], b"\xff\xfe binary", lines[1], b'{"step": 3'][:4]))
    m = runs.read_metrics(tmp_path)
    assert m.rows == good and m.skipped == 2
    assert m.note == f"skipped 2 unreadable lines of {tmp_path / 'metrics.jsonl'}"
    r = cli("plot", tmp_path, "--json")
    assert r.exit_code == 0 and [p["step"] for p in json.loads(r.stdout)[0]["evaluations"]] == [10, 20], r.output
    assert r.stderr.strip() == m.note  # said once, on stderr: the JSON on stdout stays JSON
    r = cli("plot", tmp_path)
    assert r.exit_code == 0 and "┤" in r.stdout and r.stderr.strip() == m.note


def test_info_says_what_it_skipped_of_a_damaged_metrics_file(tiny, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / OLD_LAST).write_bytes(tiny.read_bytes())
    row = {"step": 1, "train_loss": 2.0, "val_loss": 2.1, "val_bpc": 3.0, "elapsed": 0.1}
    (run / "metrics.jsonl").write_bytes(json.dumps(row).encode() + b"\n\xff torn")
    r = cli("info", run)
    assert r.exit_code == 0 and "please report" not in r.output, r.output
    assert r.stderr.strip() == f"skipped 1 unreadable line of {run / 'metrics.jsonl'}"


def test_a_validation_loss_of_zero_plots(tmp_path):
    """V1, found writing the metrics property: a val_loss of 0.0 (a text the model predicts exactly) made
    `plot` divide by zero turning the training loss into bits per character."""
    rows = [
        {"step": s, "train_loss": t, "val_loss": 0.0, "val_bpc": 0.0, "elapsed": s} for s, t in ((1, 0.5), (2, 0.0))
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = cli("plot", tmp_path, "--y", "bpc")
    assert r.exit_code == 0 and "┤" in r.stdout, r.output


def test_a_run_named_with_undecodable_bytes_prints_on_a_strict_utf8_terminal(tiny, tmp_path):
    """V2: a run directory named b"run\\xff" is the str "run\\udcff" (surrogateescape); the safe path let the
    lone surrogate through, and `info` and `runs` failed with UnicodeEncodeError on a strict UTF-8 stdout."""
    root = tmp_path / "ckpts"
    run = Path(os.fsdecode(bytes(root) + b"/run\xff"))
    run.mkdir(parents=True)
    (run / OLD_LAST).write_bytes(tiny.read_bytes())
    env = {**os.environ, "PYTHONIOENCODING": "utf-8", "CHARLM_DEBUG": ""}
    for args in (["info", str(run)], ["runs", str(root)]):
        proc = subprocess.run([sys.executable, "-m", "charlm", *args], capture_output=True, text=True, env=env)
        assert proc.returncode == 0, proc.stderr
        assert "run\\udcff" in proc.stdout.replace("\n", "") or "run\\udcff" in proc.stdout, proc.stdout


# ---- sampling -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "logits, wanted",
    [
        ([0.0, math.nan, 1.0, 0.0], {0, 2, 3}),  # NaN has no mass
        ([0.0, math.inf, 1.0, math.inf], {1, 3}),  # the +inf ones share all of it
        ([3e38, -3e38, 0.0, 1.0], {0}),  # finite, but 3e38 / 0.8 overflowed to inf: NaN probabilities
        ([-math.inf, math.nan, -math.inf, -math.inf], {0, 1, 2, 3}),  # no token has any: every token alike
    ],
    ids=["nan", "inf", "huge", "none"],
)
@pytest.mark.parametrize(
    "settings",
    [SampleConfig(), SampleConfig(top_p=0.5), SampleConfig(top_k=2), SampleConfig(repetition_penalty=1.5)],
    ids=["plain", "top-p", "top-k", "penalty"],
)
def test_logits_that_are_not_all_numbers_still_give_a_token(logits, wanted, settings):
    """The sampler's property test: a model whose (finite) weights are huge overflows to inf or NaN logits. With top-p,
    sample_next_token raised IndexError ("unexpected ... please report it" in sample and chat); elsewhere it
    drew from NaN probabilities (any token, the last most often) with a RuntimeWarning on the terminal."""
    logits = torch.tensor(logits)
    probs = sampling_probs(logits, settings, torch.tensor([1, 2]))
    assert abs(float(probs.sum()) - 1) < 1e-6 and set(torch.nonzero(probs).flatten().tolist()) <= wanted
    generator = torch.Generator().manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        drawn = {sample_next_token(logits, settings, generator, torch.tensor([1, 2])) for _ in range(20)}
    assert drawn <= wanted and all(probs[i] > 0 for i in drawn)


def test_a_top_p_below_float32s_smallest_keeps_the_first_token(tiny):
    """The sampler property test: a top_p of 1e-50 is valid (in (0, 1]) but 0 in float32, so no token was kept:
    IndexError ("unexpected ... please report it" in `charlm sample --top-p 1e-50`)."""
    probs = sampling_probs(torch.tensor([0.0, 1.0, 0.5]), SampleConfig(top_p=1e-50))
    assert probs.tolist() == [0.0, 1.0, 0.0]
    r = cli("sample", tiny, "-n", "3", "--top-p", "1e-50", "--seed", "0")
    assert r.exit_code == 0, r.output
