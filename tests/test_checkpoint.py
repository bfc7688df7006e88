"""Checkpoints: save/load equality, atomic writes, safe loading (a crafted file never runs code), a clear
one-line CheckpointError for every unusable file (safetensors files, and an older charlm's .pt), and never a
torch.compile wrapper."""

from __future__ import annotations

import json
import os
import pickle
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from conftest import legacy_payload, one_line_error, run_limited, tampered
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from charlm.cli import main
from charlm.config import ModelConfig, TrainConfig
from charlm.errors import CheckpointError
from charlm.models import build_model
from charlm.storage import checkpoint
from charlm.storage.checkpoint import BEST, LAST, OLD_BEST, OLD_LAST
from charlm.tokenizer import CharTokenizer
from charlm.training.trainer import Trainer

TEXT = "O Romeo, Romeo! wherefore art thou Romeo?\nDeny thy father and refuse thy name.\n" * 30


def trainer(tmp_path: Path, kind: str = "transformer", out: str = "run", model: dict | None = None, **train) -> Trainer:
    corpus = tmp_path / "romeo.txt"
    corpus.write_text(TEXT, encoding="utf-8")
    model_cfg = ModelConfig(kind=kind, n_layers=1, d_model=32, n_heads=2, context=16, **(model or {}))
    train_cfg = TrainConfig(
        **{
            **dict(steps=50, batch_size=4, warmup=2, eval_interval=50, eval_iters=1, sample_tokens=0, device="cpu"),
            **train,
        }
    )
    return Trainer(corpus, model_cfg, train_cfg, tmp_path / out)


def raw(path: Path) -> dict:
    """An older charlm's .pt of the same contents, as plain values, to tamper with and torch.save."""
    return legacy_payload(path)


def tensors_and_metadata(path: Path) -> tuple[dict, dict]:
    """A safetensors file's contents, as the safetensors library gives them, to tamper with and save_file."""
    with safe_open(path, "pt") as f:
        return load_file(path), f.metadata()


@pytest.fixture
def saved(tmp_path) -> Path:
    """A real last checkpoint (and best) after 3 steps."""
    trainer(tmp_path).fit(until=3)
    return tmp_path / "run" / LAST


# ---- save / load ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kind,model",
    [("transformer", {}), ("transformer", dict(qk_norm=True, smear=True)), ("lstm", {}), ("gru", {})],
    ids=["transformer", "transformer-qk-norm-smear", "lstm", "gru"],
)
def test_loaded_model_gives_the_same_logits(tmp_path, kind, model):
    run = trainer(tmp_path, kind, model=model)
    run.fit(until=3)
    ckpt = checkpoint.load(tmp_path / "run" / LAST)
    assert not ckpt.model.training
    assert ckpt.model_config == run.model_cfg and ckpt.train_config == run.cfg
    assert ckpt.tokenizer.to_json() == run.tokenizer.to_json()
    assert ckpt.saved.step == 3 and ckpt.saved.params == run.params and ckpt.name == "run"
    x = torch.tensor([run.tokenizer.encode("Deny thy father")])
    run.model.eval()
    assert torch.equal(ckpt.model(x)[0], run.model(x)[0])
    for name, tensor in run.model.state_dict().items():
        assert torch.equal(ckpt.model.state_dict()[name], tensor), name


def test_tokenizer_and_configs_are_stored_as_plain_data(saved):
    tensors, meta = tensors_and_metadata(saved)
    assert json.loads(meta["tokenizer"])["kind"] == "char"  # the tokenizer's own JSON, as it is
    assert json.loads(meta["model_config"])["kind"] == "transformer" and "lr" in json.loads(meta["train_config"])
    assert json.loads(meta["format"]) == checkpoint.FORMAT and json.loads(meta["version"]) == checkpoint.VERSION
    assert json.loads(meta["step"]) == 3 and json.loads(meta["corpus"])["name"] == "romeo.txt"
    # the weights under their own names; the training state beside them, its structure in the metadata
    assert tensors["tok_emb.weight"].shape == (23, 32) and tensors["tok_emb.weight"].dtype == torch.float32
    assert "head.weight" not in tensors and json.loads(meta["model"]) == {"head.weight": {"@tensor": "tok_emb.weight"}}
    assert tensors["rng.data"].dtype == torch.uint8 and "rng" in meta and "optimizer" in meta
    assert any(k.startswith("optimizer.") and k.endswith(".exp_avg") for k in tensors)


def test_the_best_checkpoint_holds_no_training_state(saved):
    tensors, meta = tensors_and_metadata(saved.parent / BEST)
    assert set(tensors) == set(checkpoint.read(saved).model) - {"head.weight"}  # the weights alone
    assert json.loads(meta["optimizer"]) is None and json.loads(meta["rng"]) is None


def test_run_directory_resolves_to_best_then_last(saved):
    run = saved.parent
    assert checkpoint.resolve(run) == run / BEST
    (run / BEST).unlink()
    assert checkpoint.resolve(run) == run / LAST
    assert checkpoint.load(run).path == run / LAST


def test_run_directory_of_an_older_charlm_resolves_to_its_pt_files(saved, tmp_path):
    old = tmp_path / "old"
    old.mkdir()
    torch.save(raw(saved), old / OLD_LAST)
    assert checkpoint.resolve(old) == old / OLD_LAST
    torch.save(raw(saved.parent / BEST), old / OLD_BEST)
    assert checkpoint.resolve(old) == old / OLD_BEST
    assert checkpoint.load(old).saved.step == checkpoint.load(saved.parent / BEST).saved.step
    r = CliRunner().invoke(main, ["runs", str(tmp_path), "--json"])
    assert r.exit_code == 0 and {row["run"] for row in json.loads(r.stdout)} == {"run", "old"}


def test_interop_the_weights_open_with_safetensors_alone(saved):
    """docs/train.md's three lines, as they are there (the path replaced): a run's weights in any safetensors
    reader, without charlm."""
    doc = (Path(__file__).resolve().parent.parent / "docs" / "train.md").read_text(encoding="utf-8")
    code = doc.split("**Any tool reads them.**", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    assert len([line for line in code.splitlines() if line]) == 3 and "charlm" not in code.replace(
        "checkpoints/tinyshakespeare-transformer-char", ""
    )
    code = code.replace("checkpoints/tinyshakespeare-transformer-char/best.safetensors", str(saved.parent / BEST))
    code += "import sys; assert not any(m.startswith('charlm') for m in sys.modules)\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "'tok_emb.weight': (23, 32)" in out.stdout and "'blocks.0.attn.qkv.weight': (96, 32)" in out.stdout


def test_an_int8_run_holds_int8_tensors_as_any_safetensors_reader_sees_them(saved, tmp_path):
    """charlm compress --bits 8 writes int8 matrices with float32 scales beside them: what safetensors' numpy
    reader (no torch, no charlm) finds in the file."""
    from safetensors.numpy import load_file as load_numpy

    from charlm.commands.compress import compress
    from charlm.options import CompressOptions

    compress(
        str(saved.parent),
        CompressOptions(to=str(tmp_path / "int8"), bits=8, tokens=256, text=str(tmp_path / "romeo.txt")),
    )
    arrays = load_numpy(tmp_path / "int8" / BEST)
    values, scales = (
        arrays["quantized.blocks.0.attn.qkv.weight.values"],
        arrays["quantized.blocks.0.attn.qkv.weight.scales"],
    )
    assert values.dtype == np.int8 and values.shape == (96, 32) and scales.dtype == np.float32 and scales.shape == (96,)
    assert "blocks.0.attn.qkv.weight" not in arrays and arrays["norm.weight"].dtype == np.float32  # norms stay float
    w = checkpoint.load(tmp_path / "int8").model.state_dict()["blocks.0.attn.qkv.weight"].numpy()
    np.testing.assert_allclose(w, values * scales[:, None], rtol=1e-6)  # what every command computes with


def test_save_is_atomic(saved):
    """A save that fails half-way leaves the previous file byte for byte, and no temp file behind."""
    before = saved.read_bytes()
    listing = sorted(p.name for p in saved.parent.iterdir())
    with pytest.raises(Exception):  # noqa: B017 (whatever is raised: the point is what is left on disk)
        checkpoint.save({"model": {"w": torch.zeros(1000)}, "oops": lambda: None}, saved)
    assert saved.read_bytes() == before
    assert sorted(p.name for p in saved.parent.iterdir()) == listing
    checkpoint.load(saved)


def test_saved_files_get_normal_permissions(tmp_path):
    """Regression: files were written through mkstemp, which makes them 0600 whatever the umask."""
    old = os.umask(0o022)
    try:
        checkpoint.save({"x": 1}, tmp_path / "a.pt")
    finally:
        os.umask(old)
    assert (tmp_path / "a.pt").stat().st_mode & 0o777 == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["a.pt"]


def test_never_saves_the_compile_wrapper(tmp_path):
    """nanoGPT's sore point: saving torch.compile's wrapper gives keys prefixed with '_orig_mod.' that a
    plain model cannot load. The compiled module is only called, never run here: compiling even a tiny
    model costs ~60 s on a cold 2-core CPU, and what is saved does not depend on it having run."""
    run = trainer(tmp_path, compile=True)
    assert any(k.startswith("_orig_mod.") for k in run.forward.state_dict())  # the trap is real
    run.fit(until=0)  # evaluates and saves without a training step
    saved = checkpoint.read(tmp_path / "run" / LAST)
    assert saved.train_config.compile is True
    assert not any("_orig_mod" in k for k in saved.model)
    assert set(saved.model) == set(run.model.state_dict())
    checkpoint.load(tmp_path / "run")


# ---- unusable files: one clear line each --------------------------------------------------------


def _legacy(saved: Path, tmp: Path) -> Path:
    """The same checkpoint as an older charlm wrote it (torch.save's zip archive)."""
    p = tmp / "legacy.pt"
    torch.save(raw(saved), p)
    return p


def _truncated(saved: Path, tmp: Path) -> Path:
    saved = _legacy(saved, tmp)
    p = tmp / "truncated.pt"
    p.write_bytes(saved.read_bytes()[: saved.stat().st_size // 2])
    return p


def _corrupt_weights(saved: Path, tmp: Path) -> Path:
    """Zeroes bytes inside a weight tensor: torch.load alone would load this without a word."""
    saved = _legacy(saved, tmp)
    with zipfile.ZipFile(saved) as z:
        info = max((i for i in z.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    raw = bytearray(saved.read_bytes())
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra) + 64
    raw[start : start + 256] = bytes(256)
    p = tmp / "corrupt.pt"
    p.write_bytes(bytes(raw))
    return p


def _corrupt_header(saved: Path, tmp: Path) -> Path:
    raw = bytearray(_legacy(saved, tmp).read_bytes())
    raw[100:400] = os.urandom(300)
    p = tmp / "header.pt"
    p.write_bytes(bytes(raw))
    return p


def _text(saved: Path, tmp: Path) -> Path:
    p = tmp / "notes.pt"
    p.write_text("just some notes, not a model\n")
    return p


def _empty(saved: Path, tmp: Path) -> Path:
    p = tmp / "empty.pt"
    p.touch()
    return p


def _foreign_dict(saved: Path, tmp: Path) -> Path:
    p = tmp / "nanogpt.pt"
    torch.save({"model": {"wte.weight": torch.randn(4, 4)}, "model_args": {"n_layer": 1}, "iter_num": 5}, p)
    return p


def _foreign_tensor(saved: Path, tmp: Path) -> Path:
    p = tmp / "tensor.pt"
    torch.save(torch.randn(3, 3), p)
    return p


def _newer(saved: Path, tmp: Path) -> Path:
    p = tmp / "future.pt"
    torch.save({**raw(saved), "version": checkpoint.VERSION + 1}, p)
    return p


def _incomplete(saved: Path, tmp: Path) -> Path:
    p = tmp / "incomplete.pt"
    data = raw(saved)
    del data["tokenizer"]
    torch.save(data, p)
    return p


def _incompatible(saved: Path, tmp: Path) -> Path:
    """Weights that do not fit the recorded model config."""
    p = tmp / "incompatible.pt"
    data = raw(saved)
    data["model_config"]["d_model"] = 64
    torch.save(data, p)
    return p


def _bad_tokenizer(saved: Path, tmp: Path) -> Path:
    p = tmp / "badtok.pt"
    torch.save({**raw(saved), "tokenizer": "{not json"}, p)
    return p


BAD_FILES = [
    (_truncated, "truncated or corrupt"),
    (_corrupt_weights, "is corrupt (legacy/data/"),
    (_corrupt_header, "corrupt"),
    (_text, "is not a charlm checkpoint (neither a safetensors file nor a PyTorch archive)"),
    (_empty, "is not a charlm checkpoint"),
    (_foreign_dict, "is not a charlm checkpoint (a PyTorch file written by something else)"),
    (_foreign_tensor, "is not a charlm checkpoint"),
    (_newer, "was written by a newer charlm"),
    (_incomplete, "incomplete charlm checkpoint (missing tokenizer)"),
    (
        _incompatible,
        "its weights do not match its config (transformer, layers 1, d_model 64: tok_emb.weight is (23, 32), "
        "the config needs (23, 64))",
    ),
    (_bad_tokenizer, "incompatible charlm checkpoint"),
]


# ---- the same, as safetensors files: what the header says is checked before anything is allocated ----------


def _st(saved: Path, tmp: Path, name: str, tensors=None, meta=None, **changes) -> Path:
    """The checkpoint rewritten by the safetensors library, with tensors or metadata fields changed."""
    t, m = tensors_and_metadata(saved)
    m = {**m, **{k: v if isinstance(v, str) else json.dumps(v) for k, v in changes.items()}}
    m = {k: v for k, v in m.items() if v != "<drop>"}
    p = tmp / name
    save_file(tensors(t) if tensors else t, p, metadata=meta(m) if meta else m)
    return p


def _header_edit(saved: Path, tmp: Path, name: str, edit) -> Path:
    """The checkpoint with its JSON header edited by hand (what no safetensors writer would write)."""
    data = saved.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    edit(header)
    new = json.dumps(header).encode()
    p = tmp / name
    p.write_bytes(struct.pack("<Q", len(new)) + new + data[8 + n :])
    return p


def _biggest(header: dict) -> str:
    return max((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][1])


def _st_truncated(saved, tmp):
    p = tmp / "truncated.safetensors"
    p.write_bytes(saved.read_bytes()[: saved.stat().st_size // 2])
    return p


def _st_header_cut(saved, tmp):
    p = tmp / "cut.safetensors"
    p.write_bytes(saved.read_bytes()[:200])
    return p


def _st_lying_offsets(saved, tmp):
    return _header_edit(saved, tmp, "offsets.safetensors", lambda h: h[_biggest(h)].update(data_offsets=[0, 8]))


def _st_past_the_end(saved, tmp):
    def edit(h):
        b, e = h[_biggest(h)]["data_offsets"]
        h[_biggest(h)]["data_offsets"] = [b + 4, e + 4]

    return _header_edit(saved, tmp, "past.safetensors", edit)


def _st_huge_shape(saved, tmp):
    return _header_edit(saved, tmp, "huge.safetensors", lambda h: h["tok_emb.weight"].update(shape=[2**40, 2**40]))


def _st_huge_header(saved, tmp):
    p = tmp / "claims.safetensors"
    p.write_bytes(struct.pack("<Q", 2**62) + b"{}")
    return p


def _st_header_not_json(saved, tmp):
    data = saved.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    p = tmp / "garbled.safetensors"
    p.write_bytes(data[:9] + b"\xff" * (n - 1) + data[8 + n :])
    return p


def _st_dtype_not_text(saved, tmp):
    """Regression (the fuzzer, in its first minute): a dtype that is a list raised TypeError (unhashable)."""
    return _header_edit(saved, tmp, "dtype.safetensors", lambda h: h["norm.weight"].update(dtype=["F32"]))


def _st_foreign(saved, tmp):
    p = tmp / "model.safetensors"
    save_file({"wte.weight": torch.randn(4, 4)}, p)
    return p


def _st_nan(saved, tmp):
    def nan(t):
        t["blocks.0.mlp.fc.weight"][3, 5] = float("nan")
        return t

    return _st(saved, tmp, "nan.safetensors", tensors=nan)


def _st_wrong_dtype(saved, tmp):
    return _st(saved, tmp, "ints.safetensors", tensors=lambda t: {**t, "norm.weight": t["norm.weight"].long()})


BAD_ST = [
    (_st_truncated, "is truncated or corrupt (entry "),
    (_st_header_cut, "is truncated or corrupt (its header claims"),
    (_st_lying_offsets, "byte range does not fit its shape"),
    (_st_past_the_end, "ends 4 bytes past the end of the file); train again or use another checkpoint"),
    (_st_huge_shape, "tok_emb.weight's byte range does not fit its shape"),
    (_st_huge_header, "is truncated or corrupt (its header claims 4,611,686,018,427,387,904 bytes of a 10-byte"),
    (_st_header_not_json, "its header is not JSON"),
    (_text, "is not a charlm checkpoint (neither a safetensors file nor a PyTorch archive)"),
    (_empty, "is not a charlm checkpoint (neither a safetensors file nor a PyTorch archive)"),
    (_st_dtype_not_text, 'entry norm.weight holds ["F32"] values, which charlm never stores'),
    (_st_foreign, "is not a charlm checkpoint (a safetensors file written by something else)"),
    (lambda s, t: _st(s, t, "future.safetensors", version=checkpoint.VERSION + 1), "was written by a newer charlm"),
    (
        lambda s, t: _st(s, t, "incomplete.safetensors", tokenizer="<drop>"),
        "incomplete charlm checkpoint (missing tokenizer)",
    ),
    (lambda s, t: _st(s, t, "notjson.safetensors", step="three"), "(step is not JSON: JSONDecodeError"),
    (lambda s, t: _st(s, t, "mistyped.safetensors", step=json.dumps("three")), "step should be int, not str"),
    (
        lambda s, t: _st(s, t, "nan-json.safetensors", train_seconds="NaN"),
        "(train_seconds is not JSON: ValueError: NaN",
    ),
    (
        lambda s, t: _st(s, t, "alias.safetensors", model={"head.weight": {"@tensor": "nope"}}),
        "its metadata's model should name weights",
    ),
    (
        lambda s, t: _st(s, t, "tree.safetensors", rng={"data": {"@tensor": "nope"}}),
        "names a tensor the file does not hold",
    ),
    (
        lambda s, t: _st(
            s,
            t,
            "incompatible.safetensors",
            model_config=json.loads(tensors_and_metadata(s)[1]["model_config"]) | {"d_model": 64},
        ),
        "its weights do not match its config (transformer, layers 1, d_model 64: tok_emb.weight is (23, 32), "
        "the config needs (23, 64))",
    ),
    (lambda s, t: _st(s, t, "badtok.safetensors", tokenizer="{not json"), "incompatible charlm checkpoint"),
    (_st_nan, "holds damaged weights: blocks.0.mlp.fc.weight has NaN or infinite values"),
    (_st_wrong_dtype, "norm.weight holds long values, not floats"),
]


@pytest.mark.parametrize("make,message", BAD_ST, ids=[f"st{i}" for i in range(len(BAD_ST))])
def test_unusable_safetensors_file_gives_one_clear_line(saved, tmp_path, make, message):
    bad = make(saved, tmp_path)
    for read in (checkpoint.load, checkpoint.read_header):
        with pytest.raises(CheckpointError) as e:
            read(bad)
        assert message in str(e.value)
        assert str(bad) in str(e.value) and "\n" not in str(e.value)
    r = CliRunner().invoke(main, ["info", str(bad)])
    assert r.exit_code == 1 and r.stdout == ""
    assert r.stderr.startswith("error: ") and r.stderr.strip().count("\n") == 0 and "Traceback" not in r.stderr
    assert message in r.stderr


def test_a_fifo_or_a_link_to_one_never_hangs(saved, tmp_path):
    run = tmp_path / "fifo-run"
    run.mkdir()
    os.mkfifo(run / LAST)
    (tmp_path / "link.safetensors").symlink_to(run / LAST)
    for target in (run / LAST, tmp_path / "link.safetensors"):
        with pytest.raises(CheckpointError, match="is not a regular file"):
            checkpoint.load(target)
    with pytest.raises(CheckpointError, match="holds no checkpoint"):
        checkpoint.load(run)
    (tmp_path / "good.safetensors").symlink_to(saved)  # a link to a real checkpoint is read through
    assert checkpoint.load(tmp_path / "good.safetensors").saved.step == 3


@pytest.mark.parametrize("make,message", BAD_FILES, ids=[f.__name__.strip("_") for f, _ in BAD_FILES])
def test_unusable_file_gives_one_clear_line(saved, tmp_path, make, message):
    bad = make(saved, tmp_path)
    with pytest.raises(CheckpointError) as e:
        checkpoint.load(bad)
    assert message in str(e.value)
    assert str(bad) in str(e.value) and "\n" not in str(e.value)
    # and the same through the CLI
    r = CliRunner().invoke(main, ["info", str(bad)])
    assert r.exit_code == 1 and r.stdout == ""
    assert r.stderr.startswith("error: ") and r.stderr.strip().count("\n") == 0 and "Traceback" not in r.stderr
    assert message in r.stderr


def test_missing_path_and_empty_directory(tmp_path):
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        checkpoint.load(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match=r"holds no checkpoint \(best.safetensors or last.safetensors\)"):
        checkpoint.load(tmp_path / "empty")


class Evil:
    """Unpickling this calls os.mkdir(marker): a stand-in for any code a crafted file could run."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


@pytest.mark.parametrize("container", ["torch.save", "pickle"])
def test_loading_never_runs_code_from_the_file(tmp_path, container):
    marker, proof = tmp_path / "pwned", tmp_path / "proof"
    evil = tmp_path / "evil.pt"
    if container == "torch.save":  # the real format, with a checkpoint-looking payload
        torch.save({"format": checkpoint.FORMAT, "version": 1, "model": Evil(marker)}, evil)
        torch.save({"format": checkpoint.FORMAT, "version": 1, "model": Evil(proof)}, tmp_path / "proof.pt")
        torch.load(tmp_path / "proof.pt", weights_only=False)  # an unsafe load really runs it
    else:
        evil.write_bytes(pickle.dumps({"model": Evil(marker)}, protocol=2))
        pickle.loads(pickle.dumps(Evil(proof), protocol=2))
    assert proof.exists(), "the crafted file must be able to run code when loaded unsafely"
    with pytest.raises(CheckpointError, match="is not a charlm checkpoint"):
        checkpoint.load(evil)
    r = CliRunner().invoke(main, ["info", str(evil)])
    assert r.exit_code == 1 and "is not a charlm checkpoint" in r.stderr
    assert not marker.exists(), "loading a checkpoint executed code from it"


# ---- the schema: format 1 still loads, a damaged field is one line -------------------------------


def _v1(saved: Path, tmp: Path) -> Path:
    """A checkpoint as charlm wrote it in format 1, built by hand: inf for "not evaluated yet" and the
    process count inside a "distributed" dict."""
    data = raw(saved)
    v1 = {k: v for k, v in data.items() if k not in ("world_size", "weights_sha256", "metrics", "scaler")}
    v1.update(
        version=1,
        best_val_loss=float("inf"),
        best_val_bpc=float("inf"),
        metrics={"step": data["step"]},
        distributed={"world_size": 1, "weights_sha256": ["ab" * 32]},
    )
    p = tmp / "v1.pt"
    torch.save(v1, p)
    return p


def test_a_format_1_checkpoint_still_loads(saved, tmp_path):
    p = _v1(saved, tmp_path)
    ckpt = checkpoint.load(p)
    assert ckpt.saved.best_val_loss is None and ckpt.saved.best_val_bpc is None  # inf meant: no evaluation yet
    assert ckpt.saved.world_size == 1 and ckpt.saved.weights_sha256 == ["ab" * 32]
    assert ckpt.saved.step == 3 and ckpt.saved.corpus.name == "romeo.txt"
    assert ckpt.model_config == checkpoint.load(saved).model_config
    r = CliRunner().invoke(main, ["info", str(p), "--json"])
    assert r.exit_code == 0 and '"best_val_loss": null' in r.stdout
    assert checkpoint.read(p).optimizer["optimizers"]  # its training state reads too


def test_resuming_an_older_charlms_last_pt_is_one_clear_line(saved, tmp_path):
    """An older charlm's run opens in every command, but is not resumed (docs/train.md says why)."""
    old = tmp_path / "old"
    old.mkdir()
    torch.save(raw(saved), old / OLD_LAST)
    r = CliRunner().invoke(main, ["train", str(tmp_path / "romeo.txt"), "--out", str(old), "--resume"])
    assert r.exit_code == 1 and "Traceback" not in r.stderr and r.stderr.strip().count("\n") == 0
    assert f"{old / OLD_LAST} was written by an earlier charlm (before safetensors)" in r.stderr
    assert "not resumed; train a new run with another --out" in r.stderr
    r = CliRunner().invoke(main, ["train", str(tmp_path / "romeo.txt"), "--out", str(old)])  # nor a new run into it
    assert (
        r.exit_code == 1
        and f"{old} already holds a run of an earlier charlm (last.pt): choose another --out" in r.stderr
    )
    assert sorted(p.name for p in old.iterdir()) == [OLD_LAST]  # nothing written beside it


def test_a_checkpoint_that_stored_the_bpe_target_as_vocab_size_still_reads(saved, tmp_path):
    """TrainConfig.vocab_size (the BPE target) was renamed bpe_vocab, apart from ModelConfig.vocab_size (the
    tokenizer's real size): a file written before keeps its BPE target, and --vocab-size is still the flag."""
    data = raw(saved)
    old = {k: v for k, v in data["train_config"].items() if k != "bpe_vocab"}
    old["vocab_size"] = 777
    torch.save({**data, "train_config": old}, tmp_path / "old.pt")
    header = checkpoint.read_header(tmp_path / "old.pt")
    assert header.train_config.bpe_vocab == 777 and header.model_config.vocab_size == data["model_config"]["vocab_size"]
    assert "vocab_size" not in checkpoint.read(saved).train_config.to_dict()
    assert "--vocab-size" in CliRunner().invoke(main, ["train", "--help"]).stdout


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("step", "three", "step should be int, not str"),
        ("best_val_loss", "low", "best_val_loss should be int or float, not str"),
        ("train_seconds", [1.0], "train_seconds should be int or float, not list"),
        ("model_config", "transformer", "model_config should be dict, not str"),
        ("corpus", {"name": "romeo.txt"}, "incompatible charlm checkpoint (TypeError"),
    ],
)
def test_a_mistyped_field_is_one_line(saved, tmp_path, field, value, message):
    p = tmp_path / "mistyped.pt"
    torch.save({**raw(saved), field: value}, p)
    with pytest.raises(CheckpointError) as e:
        checkpoint.read(p)
    assert message in str(e.value) and str(p) in str(e.value) and "\n" not in str(e.value)
    r = CliRunner().invoke(main, ["info", str(p)])  # info never crashes on a bad metric
    assert r.exit_code == 1 and r.stderr.startswith("error: ") and message in r.stderr and "Traceback" not in r.stderr


def test_a_missing_field_is_one_line(saved, tmp_path):
    p = tmp_path / "missing.pt"
    torch.save({k: v for k, v in raw(saved).items() if k != "step"}, p)
    with pytest.raises(CheckpointError, match=r"incomplete charlm checkpoint \(missing step\)$"):
        checkpoint.read(p)


def test_a_huge_config_over_small_weights_allocates_nothing(saved, tmp_path):
    """Regression: the model was built from the file's config before the weights' shapes were checked, so
    a small file claiming 8 layers × 16384 made `info` allocate ~100 GB. Now the shapes are compared first."""
    bad = tampered(saved, tmp_path / "huge.pt", model_config=dict(n_layers=8, d_model=16384, n_heads=16))
    for command in ("info", "sample"):
        proc = run_limited([command, str(bad)] + (["-n", "1", "--device", "cpu"] if command == "sample" else []))
        assert proc.returncode == 1 and proc.stdout == "", proc.stderr
        err = proc.stderr.strip()
        assert err.startswith("error: ") and "\n" not in err, err
        assert (
            "is an inconsistent charlm checkpoint: its weights do not match its config (transformer, layers 8, "
            "d_model 16384: missing blocks.1." in err
        )


def test_weights_that_do_not_hold_their_data_are_refused(tmp_path):
    """A crafted file whose config and shapes agree on a big model, but whose tensors are zero-stride views
    of one number (a few bytes on disk): loading it would allocate the full model. Refused before."""
    cfg = ModelConfig(kind="lstm", vocab_size=4, n_layers=2, d_model=8192, context=16)
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in build_model(cfg).state_dict().items()}
    tok = CharTokenizer.train(["abcd"])
    train_cfg = TrainConfig(steps=10, device="cpu")
    saved = checkpoint.Saved(
        run_name="crafted",
        model_config=cfg,
        train_config=train_cfg,
        tokenizer=tok.to_json(),
        model={k: torch.zeros(()).expand(s) for k, s in shapes.items()},
        step=1,
        train_seconds=1.0,
        best_val_loss=None,
        best_val_bpc=None,
    )
    bad = tmp_path / "expanded.pt"
    torch.save(saved.to_payload(), bad)
    assert bad.stat().st_size < 100_000
    proc = run_limited(["sample", str(bad), "-n", "1"], headroom_mb=900)
    assert proc.returncode == 1, proc.stderr
    assert (
        "inconsistent charlm checkpoint: its weights do not match its config (lstm, layers 2, d_model 8192: "
        "tok_emb.weight does not hold its 32,768 values)" in proc.stderr
    )


def test_a_tokenizer_of_another_size_is_refused_on_load(saved, tmp_path):
    """Regression: a tokenizer larger than the model's vocabulary failed mid-stream with an IndexError."""
    other = CharTokenizer.train([TEXT + "XYZ"])
    bad = tampered(saved, tmp_path / "tok.pt", tokenizer=other.to_json())
    with pytest.raises(
        CheckpointError, match=f"its tokenizer has {other.vocab_size} tokens, its model {other.vocab_size - 3}"
    ):
        checkpoint.load(bad)
    for args in (["info", bad], ["sample", bad, "-p", "XYZ", "-n", "5"]):
        one_line_error(
            CliRunner().invoke(main, [str(a) for a in args]), "is an inconsistent charlm checkpoint: its tokenizer has"
        )


@pytest.mark.parametrize(
    "changes,message",
    [
        (dict(metrics={"step": 3, "val_loss": "low"}), "metric val_loss should be a number, not str"),
        (dict(best_val_loss=1.5, best_val_bpc=None), "best_val_loss and best_val_bpc should both be numbers"),
    ],
    ids=["string metric", "half a best"],
)
def test_a_non_numeric_metric_is_one_line(saved, tmp_path, changes, message):
    """Regression: `info` crashed formatting a best_val_bpc that was missing while best_val_loss was set."""
    bad = tampered(saved, tmp_path / "metric.pt", **changes)
    one_line_error(CliRunner().invoke(main, ["info", str(bad)]), "is a damaged charlm checkpoint", message)


@pytest.mark.parametrize("field", ["qk_norm", "smear"])
def test_a_newer_switch_is_read_as_saved_and_absent_means_off(saved, tmp_path, field):
    """ModelConfig.qk_norm and .smear: a checkpoint from before them (no such field) is a model without them, and a
    field that is not true or false is a one-line error, not a model built on a guess."""
    t, m = tensors_and_metadata(saved)
    cfg = json.loads(m["model_config"])
    older = _st(saved, tmp_path, "older.safetensors", model_config={k: v for k, v in cfg.items() if k != field})
    assert getattr(checkpoint.read(older).model_config, field) is False
    for value in ("yes", 1):
        bad = _st(saved, tmp_path, "bad.safetensors", model_config=cfg | {field: value})
        r = CliRunner().invoke(main, ["info", str(bad)])
        flag = "--" + field.replace("_", "-")  # named as the user knows it (the path holds the test's name)
        assert r.exit_code == 1 and r.stderr.startswith("error: ") and f"{flag} must be true or false" in r.stderr
        assert "Traceback" not in r.stderr and r.stderr.count("\n") == 1
