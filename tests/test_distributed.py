"""Training with several processes (torchrun + DistributedDataParallel, gloo on CPU) and gradient
accumulation: real `python -m torch.distributed.run` subprocesses with 2 CPU processes, checked against
a single-process reference computed here; exact resume of a distributed run; a failing rank stopping
the whole run; and the CLI's one-line errors.

This file doubles as the torchrun worker of test_ddp_matches_one_process_and_resumes_exactly:
torchrun runs it as a script (see _ddp_worker at the bottom)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from conftest import CITIZENS, TINY_MODEL

from charlm.cli import main
from charlm.config import ModelConfig, TrainConfig
from charlm.data import Batches, load_tokens, prepare
from charlm.models import build_model
from charlm.storage import checkpoint
from charlm.storage.checkpoint import BEST, LAST
from charlm.training.optim import make_optimizer
from charlm.training.schedule import lr_at
from charlm.training.trainer import Trainer

TINY = [*TINY_MODEL, "--eval-iters", "3", "--warmup", "2", "--device", "cpu"]


@pytest.fixture(autouse=True)
def no_torchrun_env(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):  # in case pytest itself runs under torchrun
        monkeypatch.delenv(name, raising=False)


def write_corpus(path: Path) -> Path:
    path.write_text(CITIZENS, encoding="utf-8")
    return path


def launch(args: list[str], cwd: Path, cache: Path, timeout: float = 90) -> subprocess.CompletedProcess:
    """Run a command in a subprocess the way a user would: one thread per process (2 shared cores)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CHARLM_CACHE": str(cache), "PYTHONUNBUFFERED": "1"}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(name, None)
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *args]


def sha256_of_weights(state: dict[str, torch.Tensor]) -> str:
    """Written here independently of charlm.training.distributed: names and raw bytes, in key order."""
    h = hashlib.sha256()
    for name, t in state.items():
        h.update(name.encode())
        h.update(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


# ---- torchrun -m charlm train --------------------------------------------------------------------


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory):
    """A real `torchrun --nproc-per-node 2 -m charlm train` of 8 steps (2 micro-batches each)."""
    root = tmp_path_factory.mktemp("ddp-cli")
    corpus = write_corpus(root / "citizens.txt")
    start = time.perf_counter()
    proc = launch(
        torchrun(
            "-m",
            "charlm",
            "train",
            str(corpus),
            *TINY,
            "--steps",
            "8",
            "--grad-accum",
            "2",
            "--eval-interval",
            "4",
            "--sample-tokens",
            "20",
            "--out",
            str(root / "run"),
        ),
        cwd=root,
        cache=root / "cache",
    )
    return root, corpus, proc, time.perf_counter() - start


def test_torchrun_trains_with_two_processes(cli_run):
    root, corpus, proc, seconds = cli_run
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    # only rank 0 prints: each line once
    assert out.count("charlm train transformer") == 1
    assert "batch 8 × 2 accum × 2 processes = 32" in out
    assert out.count("eval step 4:") == 1 and out.count("eval step 8:") == 1
    assert out.count("training done") == 1
    # ... and only rank 0 writes the metrics log: one line per evaluation, not one per rank
    lines = [json.loads(line) for line in (root / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [4, 8]


def test_distributed_checkpoint_loads_in_one_process_with_both_ranks_weights(cli_run):
    root, corpus, proc, _ = cli_run
    assert proc.returncode == 0, proc.stderr
    ckpt = checkpoint.load(root / "run" / LAST)  # a plain single-process load, on CPU
    state = ckpt.model.state_dict()
    # the unwrapped module was saved: the keys of a freshly built model, no "module." / "_orig_mod."
    assert list(state) == list(build_model(ckpt.model_config).state_dict())
    assert ckpt.saved.step == 8 and ckpt.train_config.grad_accum == 2
    assert ckpt.saved.world_size == 2
    # each rank reported a digest of its own weights when saving: rank 1's equals the saved weights
    assert ckpt.saved.weights_sha256 == [sha256_of_weights(state)] * 2
    # each rank sampled its own batches: their data generators are in different states
    ranks = ckpt.saved.rng["ranks"]
    assert len(ranks) == 2 and not torch.equal(ranks[0]["data"], ranks[1]["data"])


def test_resuming_a_two_process_run_needs_two_processes(cli_run):
    root, corpus, proc, _ = cli_run
    assert proc.returncode == 0, proc.stderr
    run = root / "run"
    r = CliRunner().invoke(main, ["train", str(corpus), "--out", str(run), "--resume", "--steps", "12"])
    assert r.exit_code == 1
    assert r.stderr.strip() == (
        f"error: --resume: {run} was trained with 2 process(es), not 1; "
        "resume it with --nproc 2 (or torchrun --nproc-per-node 2)"
    )
    r = CliRunner().invoke(main, ["train", str(corpus), "--out", str(run), "--resume", "--steps", "12", "--nproc", "3"])
    assert r.exit_code == 1
    assert r.stderr.strip() == (
        f"error: --resume: {run} was trained with 2 process(es), not 3; "
        "resume it with --nproc 2 (or torchrun --nproc-per-node 2)"
    )


# ---- one failing rank ----------------------------------------------------------------------------


def test_one_failing_rank_stops_the_whole_run(tmp_path):
    """A directory named best.pt in the run directory: only rank 0 writes checkpoints, so only rank 0
    fails (at the first evaluation that improves). Rank 1 must not wait for it forever: torchrun sees
    rank 0 exit and stops rank 1. Also goes through --nproc, which re-executes itself via torchrun."""
    corpus = write_corpus(tmp_path / "citizens.txt")
    (tmp_path / "run" / BEST).mkdir(parents=True)
    proc = launch(
        [
            sys.executable,
            "-m",
            "charlm",
            "train",
            str(corpus),
            *TINY,
            "--sample-tokens",
            "0",
            "--steps",
            "1000",
            "--eval-interval",
            "2",
            "--out",
            str(tmp_path / "run"),
            "--nproc",
            "2",
        ],
        cwd=tmp_path,
        cache=tmp_path / "cache",
        timeout=120,
    )
    assert proc.returncode != 0  # within launch's timeout: nobody waited for the process-group timeout (30 minutes)
    launched = proc.stderr.split("launching: ")[1].splitlines()[0]  # the command --nproc re-executed
    assert " -m torch.distributed.run --standalone --nproc-per-node=2 -m charlm train " in launched
    assert " --nproc " not in launched and launched.endswith(f"--out {tmp_path / 'run'}")
    assert "error: rank 0: cannot write" in proc.stderr and f"{BEST}: it is a directory" in proc.stderr
    assert "please report it" not in proc.stderr  # rank 1 only lost its peer: not a bug to report
    assert "Root Cause" in proc.stderr  # torchrun's report names the rank that failed first


# ---- DDP == one process with the same effective batch; exact resume --------------------------------


def tiny_configs(**train) -> tuple[ModelConfig, TrainConfig]:
    model = ModelConfig(
        kind="transformer", n_layers=1, d_model=32, n_heads=2, context=16, dropout=train.pop("dropout", 0.0)
    )
    cfg = TrainConfig(
        **{
            **dict(
                steps=6,
                batch_size=4,
                grad_accum=2,
                lr=1e-2,
                warmup=2,
                eval_interval=2,
                eval_iters=2,
                sample_tokens=0,
                device="cpu",
            ),
            **train,
        }
    )
    return model, cfg


# the run compared with the float32 reference below (fp32: bf16 autocast would round differently)
REF = dict(steps=3, optimizer="adamw", eval_interval=3, precision="fp32")
RESUMED = dict(dropout=0.1)  # the runs compared with each other (Muon, dropout: every RNG matters)


def test_a_torchrun_process_ends_with_its_exit_code_and_all_its_output(tmp_path):
    """python -m charlm as one of several ranks ends through distributed.exit_process (no interpreter
    finalization): the exit code and every line it printed still arrive."""
    env = {**os.environ, "WORLD_SIZE": "2", "RANK": "1"}
    ok = subprocess.run([sys.executable, "-m", "charlm", "lab"], cwd=tmp_path, env=env, capture_output=True, text=True)
    from charlm.lab import EXPERIMENTS

    listed = [line.split()[0] for line in ok.stdout.splitlines()[1:] if line[:1].strip()]
    assert ok.returncode == 0 and listed == list(EXPERIMENTS), ok.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "charlm", "runs", "nowhere"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert (
        bad.returncode == 1
        and bad.stderr.strip() == "error: rank 1: no directory nowhere: give a folder that holds run directories"
    )


def test_ddp_matches_one_process_and_resumes_exactly(tmp_path):
    """Also: Ctrl-C on one rank and --max-time stop all ranks at the same step (see _ddp_worker)."""
    corpus = write_corpus(tmp_path / "citizens.txt")
    proc = launch(torchrun(__file__, str(tmp_path), str(corpus)), cwd=tmp_path, cache=tmp_path / "cache")
    assert proc.returncode == 0, proc.stderr[-3000:]

    # 1. Two ranks × 2 micro-batches of 4 == one process on the 16 windows at once, drawn from the
    # generators seeded seed + 0 and seed + 1, with a plain mean loss (DDP averages the gradients).
    model_cfg, cfg = tiny_configs(**REF)
    tok, tokens_path, _ = prepare(corpus, "char", None)
    model_cfg.vocab_size = tok.vocab_size
    batches = Batches(load_tokens(tokens_path), context=model_cfg.context, val_fraction=cfg.val_fraction)
    torch.manual_seed(cfg.seed)
    model = build_model(model_cfg)
    opt = make_optimizer(model, cfg, "cpu")
    gens = [torch.Generator().manual_seed(cfg.seed + rank) for rank in range(2)]
    for step in range(cfg.steps):
        opt.set_lr(lr_at(cfg, step, 0.0))
        windows = [batches.get_batch("train", cfg.batch_size, g) for g in gens for _ in range(cfg.grad_accum)]
        _, loss = model(torch.cat([x for x, _ in windows]), torch.cat([y for _, y in windows]))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        opt.zero_grad()
    ddp = checkpoint.load(tmp_path / "ref" / LAST).model.state_dict()
    for name, want in model.state_dict().items():
        torch.testing.assert_close(ddp[name], want, atol=2e-5, rtol=1e-4, msg=lambda m, name=name: f"{name}: {m}")

    # 2. 3 steps, a new Trainer resuming from the checkpoint, 3 more == 6 steps at once, bit for bit
    full = checkpoint.read(tmp_path / "full" / LAST)
    half = checkpoint.read(tmp_path / "half" / LAST)
    assert half.step == full.step == 6
    assert full.model.keys() == half.model.keys()
    for name in full.model:
        assert torch.equal(full.model[name], half.model[name]), name
    for a, b in zip(full.rng["ranks"], half.rng["ranks"]):
        assert torch.equal(a["data"], b["data"]) and torch.equal(a["torch"], b["torch"])

    # 3. the time budget stopped both ranks at the same step, with the same weights
    timed = checkpoint.read(tmp_path / "timed" / LAST)
    assert 0 < timed.step < 10**6 and timed.train_seconds >= 1.0
    assert len(set(timed.weights_sha256)) == 1


# ---- gradient accumulation in one process ----------------------------------------------------------


def test_grad_accum_averages_the_micro_batches(tmp_path):
    """K micro-batches of B windows give the gradient of one batch of K*B windows."""
    corpus = write_corpus(tmp_path / "citizens.txt")
    model_cfg, cfg = tiny_configs(
        steps=2, grad_accum=3, optimizer="adamw", eval_interval=2, precision="fp32"
    )  # the reference below runs in float32
    run = Trainer(corpus, model_cfg, cfg, tmp_path / "run")
    torch.manual_seed(cfg.seed)
    model = build_model(run.model_cfg)  # the trainer's copy, with the tokenizer's vocabulary size
    assert sha256_of_weights(model.state_dict()) == sha256_of_weights(run.model.state_dict())  # same start
    run.fit()
    opt = make_optimizer(model, cfg, "cpu")
    gen = torch.Generator().manual_seed(cfg.seed)
    for step in range(cfg.steps):
        opt.set_lr(lr_at(cfg, step, 0.0))
        windows = [run.batches.get_batch("train", cfg.batch_size, gen) for _ in range(cfg.grad_accum)]
        _, loss = model(torch.cat([x for x, _ in windows]), torch.cat([y for _, y in windows]))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        opt.zero_grad()
    for name, want in model.state_dict().items():
        torch.testing.assert_close(run.model.state_dict()[name], want, atol=1e-5, rtol=1e-4)


def test_grad_accum_resume_is_exact(tmp_path):
    corpus = write_corpus(tmp_path / "citizens.txt")
    model_cfg, cfg = tiny_configs(steps=4, dropout=0.1)
    one = Trainer(corpus, model_cfg, cfg, tmp_path / "one")
    one.fit()
    model_cfg, cfg = tiny_configs(steps=4, dropout=0.1)
    Trainer(corpus, model_cfg, cfg, tmp_path / "two").fit(until=2)
    model_cfg, cfg = tiny_configs(steps=4, dropout=0.1)
    two = Trainer(corpus, model_cfg, cfg, tmp_path / "two", resume=True)
    two.fit()
    a, b = one.model.state_dict(), two.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_tokens_per_second_counts_the_effective_batch(tmp_path, monkeypatch):
    """Throughput is per optimizer step: batch × grad_accum × context tokens (× processes). On a clock that
    moves one second per forward and backward pass and stands still otherwise, tokens/s is exactly the
    tokens of one step (counting one micro-batch instead would give a third), whatever the machine's speed."""
    corpus = write_corpus(tmp_path / "citizens.txt")
    clock = [1000.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    one_pass = Trainer.forward_backward

    def one_second(self):
        clock[0] += 1.0
        return one_pass(self)

    monkeypatch.setattr(Trainer, "forward_backward", one_second)
    events = []
    model_cfg, cfg = tiny_configs(steps=4, grad_accum=3, eval_interval=4)
    Trainer(corpus, model_cfg, cfg, tmp_path / "run", on_event=events.append).fit()
    steps = [e for e in events if type(e).__name__ == "Stepped"]
    tokens = cfg.batch_size * cfg.grad_accum * model_cfg.context
    assert [e.tokens_per_s for e in steps] == [tokens] * 4
    assert [e.elapsed for e in steps] == [1.0, 2.0, 3.0, 4.0]


# ---- CLI errors ----------------------------------------------------------------------------------


def test_cli_refuses_bad_grad_accum_and_nproc(tmp_path):
    corpus = write_corpus(tmp_path / "citizens.txt")
    out = str(tmp_path / "run")
    r = CliRunner().invoke(main, ["train", str(corpus), *TINY, "--steps", "2", "--grad-accum", "0", "--out", out])
    assert r.exit_code == 1 and r.stderr.strip() == "error: --grad-accum must be between 1 and 65536, got 0"
    r = CliRunner().invoke(main, ["train", str(corpus), *TINY, "--steps", "2", "--nproc", "0", "--out", out])
    assert r.exit_code == 1 and r.stderr.strip() == "error: --nproc must be at least 1, got 0"
    env = {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"}  # what torchrun sets
    r = CliRunner(env=env).invoke(main, ["train", str(corpus), *TINY, "--steps", "2", "--nproc", "2", "--out", out])
    assert r.exit_code == 1
    assert r.stderr.strip() == "error: rank 1: --nproc starts torchrun itself: drop it when running under torchrun"
    assert not (tmp_path / "run").exists()


def test_cli_grad_accum_is_part_of_the_run(tmp_path):
    corpus = write_corpus(tmp_path / "citizens.txt")
    out = str(tmp_path / "run")
    r = CliRunner().invoke(
        main,
        [
            "train",
            str(corpus),
            *TINY,
            "--sample-tokens",
            "0",
            "--steps",
            "2",
            "--eval-interval",
            "2",
            "--grad-accum",
            "2",
            "--nproc",
            "1",
            "--out",
            out,
        ],
    )
    assert r.exit_code == 0, r.output
    assert "batch 8 × 2 accum × 1 processes = 16" in r.stdout
    r = CliRunner().invoke(main, ["train", str(corpus), "--out", out, "--resume", "--steps", "4", "--grad-accum", "3"])
    assert r.exit_code == 1
    assert r.stderr.startswith("error: --resume: this run was trained with --grad-accum 2, not 3;")


# ---- the torchrun worker ---------------------------------------------------------------------------


def _ddp_worker(root: Path, corpus: Path) -> None:
    """Four runs, as each of torchrun's processes: "ref" (compared with a one-process reference);
    "full" (6 steps); "half", where rank 1 alone gets a real SIGINT after step 3 (both ranks must stop
    and save at step 3), then a new Trainer resumes it to 6; "timed", a 1-second --max-time budget
    (both ranks must stop at the same step, or the next collective would hang or fail)."""
    import signal

    from charlm.training import distributed
    from charlm.training.events import Stepped, TrainingInterrupted

    torch.set_num_threads(1)
    rank = distributed.env().rank

    def ctrl_c_on_rank_1(event) -> None:
        if isinstance(event, Stepped) and event.step == 3 and rank == 1:
            os.kill(os.getpid(), signal.SIGINT)

    try:
        Trainer(corpus, *tiny_configs(**REF), root / "ref").fit()
        Trainer(corpus, *tiny_configs(**RESUMED), root / "full").fit()
        try:
            Trainer(corpus, *tiny_configs(**RESUMED), root / "half", on_event=ctrl_c_on_rank_1).fit()
            raise AssertionError(f"rank {rank} was not interrupted")
        except TrainingInterrupted as e:
            assert e.result.step == 3, f"rank {rank} stopped at step {e.result.step}"
        Trainer(corpus, *tiny_configs(**RESUMED), root / "half", resume=True).fit()
        Trainer(corpus, *tiny_configs(steps=10**6, max_time=1.0, eval_interval=10**6), root / "timed").fit()
    finally:
        distributed.close()


if __name__ == "__main__":  # ends as charlm's own torchrun processes do (distributed.exit_process says why)
    from charlm.training import distributed

    try:
        _ddp_worker(Path(sys.argv[1]), Path(sys.argv[2]))
    except BaseException:
        traceback.print_exc()
        distributed.exit_process(1)
    distributed.exit_process(0)
