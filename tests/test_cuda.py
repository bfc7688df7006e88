"""CUDA paths, skipped without a GPU: a bf16 autocast train step (fp16 + GradScaler where the GPU has
no bf16), checkpoints moving between CUDA and CPU, --compile saving the plain module, and NCCL across
two GPUs with torchrun."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from conftest import TINY_MODEL

from charlm.cli import main
from charlm.config import ModelConfig, TrainConfig
from charlm.models import build_model
from charlm.storage import checkpoint
from charlm.storage.checkpoint import LAST
from charlm.training.events import Stepped
from charlm.training.trainer import Trainer

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

TEXT = "But soft, what light through yonder window breaks?\nIt is the east, and Juliet is the sun.\n" * 40
TINY = [*TINY_MODEL, "--eval-iters", "2", "--sample-tokens", "0", "--warmup", "2"]  # on the default device


@pytest.fixture
def corpus(tmp_path) -> Path:
    path = tmp_path / "juliet.txt"
    path.write_text(TEXT, encoding="utf-8")
    return path


def make(corpus, out, device="cuda", resume=False, on_event=None, **train) -> Trainer:
    model_cfg = ModelConfig(kind="transformer", n_layers=1, d_model=32, n_heads=2, context=16)
    cfg = TrainConfig(
        **{
            **dict(
                steps=4, batch_size=4, lr=1e-2, warmup=2, eval_interval=2, eval_iters=2, sample_tokens=0, device=device
            ),
            **train,
        }
    )
    return Trainer(corpus, model_cfg, cfg, out, resume=resume, on_event=on_event)


def logits(model, device) -> torch.Tensor:
    idx = torch.arange(12).remainder(model.cfg.vocab_size).view(1, 12).to(device)
    with torch.no_grad():
        return model(idx)[0].float().cpu()


def test_bf16_autocast_train_step_and_cuda_checkpoint_on_cpu(corpus, tmp_path):
    events = []
    run = make(corpus, tmp_path / "run", on_event=events.append)
    want = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    assert run.autocast.fast_dtype == want
    assert (run.scaler is None) == (want == torch.bfloat16)
    x, _ = run.batches.get_batch("train", 4, torch.Generator().manual_seed(0), "cuda")
    assert x.is_cuda and x.dtype == torch.int64
    run.fit()
    losses = [e.loss for e in events if isinstance(e, Stepped)]
    assert len(losses) == 4 and all(torch.isfinite(torch.tensor(losses)))
    # autocast computes in low precision, but the weights (and so the checkpoint) stay float32
    assert all(p.is_cuda and p.dtype == torch.float32 for p in run.model.parameters())

    cpu = checkpoint.load(tmp_path / "run" / LAST, device="cpu")  # CUDA -> CPU via map_location
    assert all(p.device.type == "cpu" for p in cpu.model.parameters())
    for name, t in run.model.state_dict().items():
        assert torch.equal(cpu.model.state_dict()[name], t.cpu()), name
    torch.testing.assert_close(logits(cpu.model, "cpu"), logits(run.model.eval(), "cuda"), atol=1e-4, rtol=1e-4)


def test_fp16_with_grad_scaler_where_bf16_is_missing(corpus, tmp_path, monkeypatch):
    """Older GPUs (V100, T4) have no bf16: fp16 autocast with a GradScaler, whose state is saved and resumed."""
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    run = make(corpus, tmp_path / "run")
    assert run.autocast.fast_dtype == torch.float16 and run.scaler is not None
    run.fit(until=2)
    saved = checkpoint.read(tmp_path / "run" / LAST)
    assert saved.scaler["scale"] == run.scaler.get_scale()
    resumed = make(corpus, tmp_path / "run", resume=True)
    assert resumed.scaler.get_scale() == run.scaler.get_scale()
    resumed.fit()
    assert resumed.step == 4
    assert all(torch.isfinite(p).all() for p in resumed.model.parameters())


def test_cpu_checkpoint_loads_on_cuda(corpus, tmp_path):
    run = make(corpus, tmp_path / "run", device="cpu", steps=2)
    run.fit()
    gpu = checkpoint.load(tmp_path / "run", device="cuda")
    assert all(p.is_cuda for p in gpu.model.parameters())
    torch.testing.assert_close(logits(gpu.model, "cuda"), logits(run.model.eval(), "cpu"), atol=1e-4, rtol=1e-4)


def test_compile_on_cuda_saves_the_plain_module(corpus, tmp_path):
    out = tmp_path / "run"
    r = CliRunner().invoke(
        main,
        [
            "train",
            str(corpus),
            *TINY,
            "--steps",
            "3",
            "--eval-interval",
            "3",
            "--device",
            "cuda",
            "--compile",
            "--out",
            str(out),
        ],
    )
    assert r.exit_code == 0, r.output
    ckpt = checkpoint.load(out / LAST)
    assert list(ckpt.saved.model) == list(build_model(ckpt.model_config).state_dict())  # no "_orig_mod."
    assert ckpt.saved.device == "cuda" and ckpt.train_config.compile


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_nccl_on_two_gpus(corpus, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CHARLM_CACHE": str(tmp_path / "cache")}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "charlm",
        "train",
        str(corpus),
        *TINY,
        "--steps",
        "6",
        "--eval-interval",
        "3",
        "--device",
        "cuda",
        "--out",
        str(tmp_path / "run"),
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ckpt = checkpoint.load(tmp_path / "run")
    assert ckpt.saved.world_size == 2 and len(set(ckpt.saved.weights_sha256)) == 1
