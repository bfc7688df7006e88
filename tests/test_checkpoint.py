"""Checkpoints: save/load equality, atomic writes, safe loading (weights_only: a crafted file never runs
code), a clear one-line CheckpointError for every unusable file, and never a torch.compile wrapper."""

from __future__ import annotations

import os
import pickle
import zipfile
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from charlm import checkpoint
from charlm.cli import main
from charlm.config import ModelConfig, TrainConfig
from charlm.errors import CheckpointError
from charlm.train import Trainer

TEXT = "O Romeo, Romeo! wherefore art thou Romeo?\nDeny thy father and refuse thy name.\n" * 30


def trainer(tmp_path: Path, kind: str = "transformer", out: str = "run", **train) -> Trainer:
    corpus = tmp_path / "romeo.txt"
    corpus.write_text(TEXT, encoding="utf-8")
    model_cfg = ModelConfig(kind=kind, n_layers=1, d_model=32, n_heads=2, context=16)
    train_cfg = TrainConfig(
        **{
            **dict(steps=50, batch_size=4, warmup=2, eval_interval=50, eval_iters=1, sample_tokens=0, device="cpu"),
            **train,
        }
    )
    return Trainer(corpus, model_cfg, train_cfg, tmp_path / out)


def raw(path: Path) -> dict:
    """The file's plain contents, to tamper with (the schema's own reader would refuse the results)."""
    return torch.load(path, weights_only=True)


@pytest.fixture
def saved(tmp_path) -> Path:
    """A real last.pt (and best.pt) after 3 steps."""
    trainer(tmp_path).fit(until=3)
    return tmp_path / "run" / "last.pt"


# ---- save / load ----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["transformer", "lstm", "gru"])
def test_loaded_model_gives_the_same_logits(tmp_path, kind):
    run = trainer(tmp_path, kind)
    run.fit(until=3)
    ckpt = checkpoint.load(tmp_path / "run" / "last.pt")
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
    data = raw(saved)
    assert isinstance(data["tokenizer"], str)  # JSON text, never a pickled object
    assert isinstance(data["model_config"], dict) and isinstance(data["train_config"], dict)
    assert data["format"] == checkpoint.FORMAT and data["version"] == checkpoint.VERSION
    # the archive's pickle names no class outside torch's tensor machinery
    with zipfile.ZipFile(saved) as z:
        pkl = z.read(next(n for n in z.namelist() if n.endswith("data.pkl")))
    assert b"charlm" not in pkl.replace(b"charlm-checkpoint", b"")


def test_run_directory_resolves_to_best_then_last(saved):
    run = saved.parent
    assert checkpoint.resolve(run) == run / "best.pt"
    (run / "best.pt").unlink()
    assert checkpoint.resolve(run) == run / "last.pt"
    assert checkpoint.load(run).path == run / "last.pt"


def test_save_is_atomic(saved):
    """A save that fails half-way leaves the previous file byte for byte, and no temp file behind."""
    before = saved.read_bytes()
    listing = sorted(p.name for p in saved.parent.iterdir())
    with pytest.raises(Exception):  # noqa: B017 (whatever torch raises: the point is what is left on disk)
        # tensors first, then an object pickle refuses: the failure comes after bytes were written
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
    saved = checkpoint.read(tmp_path / "run" / "last.pt")
    assert saved.train_config.compile is True
    assert not any("_orig_mod" in k for k in saved.model)
    assert set(saved.model) == set(run.model.state_dict())
    checkpoint.load(tmp_path / "run")


# ---- unusable files: one clear line each --------------------------------------------------------


def _truncated(saved: Path, tmp: Path) -> Path:
    p = tmp / "truncated.pt"
    p.write_bytes(saved.read_bytes()[: saved.stat().st_size // 2])
    return p


def _corrupt_weights(saved: Path, tmp: Path) -> Path:
    """Zeroes bytes inside a weight tensor: torch.load alone would load this without a word."""
    with zipfile.ZipFile(saved) as z:
        info = max((i for i in z.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    raw = bytearray(saved.read_bytes())
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra) + 64
    raw[start : start + 256] = bytes(256)
    p = tmp / "corrupt.pt"
    p.write_bytes(bytes(raw))
    return p


def _corrupt_header(saved: Path, tmp: Path) -> Path:
    raw = bytearray(saved.read_bytes())
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
    (_corrupt_weights, "is corrupt (archive/data/"),
    (_corrupt_header, "corrupt"),
    (_text, "is not a charlm checkpoint (not a PyTorch archive)"),
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
    with pytest.raises(CheckpointError, match=r"holds no checkpoint \(best.pt or last.pt\)"):
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
    # and its training state resumes: a format-1 run continues
    tmp = tmp_path / "old"
    tmp.mkdir()
    (tmp / "last.pt").write_bytes(p.read_bytes())
    corpus = tmp_path / "romeo.txt"
    train_cfg = checkpoint.read(p).train_config
    resumed = Trainer(corpus, checkpoint.read(p).model_config, train_cfg, tmp, resume=True)
    assert resumed.step == 3 and resumed.best_val_loss is None
    resumed.fit(until=4)
    assert checkpoint.read(tmp / "last.pt").step == 4
    assert torch.load(tmp / "last.pt", weights_only=True)["version"] == checkpoint.VERSION


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
