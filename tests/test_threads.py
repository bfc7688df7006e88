"""A busy CPU (issue 40): torch's threads fitted to the cores other programs leave, and the training summary says what other
programs took and what the run got. Speeds: benchmarks/bench_busy.py (RESULTS.md, "Speed, round five")."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from conftest import tiny_train
from rich.console import Console

from charlm.config import ModelConfig
from charlm.runtime import CpuShare, threads_for
from charlm.training.events import Result, Started, Stepped
from charlm.views.progress import TrainView


@contextmanager
def spinning(n: int, nice: int = 0):
    """n CPU-bound processes (niced by `nice`) for the block, up 0.3 s before it starts, killed after."""
    pre = (lambda: os.nice(nice)) if nice else None
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=pre) for _ in range(n)]
    try:
        time.sleep(0.3)
        yield spinners
    finally:
        for s in spinners:
            s.kill()
            s.wait()


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="readings come from /proc/stat")
def test_the_reading_sees_other_programs_keep_the_cores_busy():
    """With a CPU-bound program on every core, the reading says the others kept most of the machine busy, and
    this process (asleep) next to nothing."""
    cores = os.cpu_count() or 1
    with spinning(cores):
        share = CpuShare(every=0.5)
        time.sleep(0.6)
        share.tick()
        assert share.others >= 0.6 * cores, share.others
        assert 0 <= share.own < 0.2


def test_charlm_leaves_openmp_its_own_wait_policy():
    """The last round set OMP_WAIT_POLICY=PASSIVE: it survived a busy CPU but ran no faster than one thread on a
    quiet one (15.3k against spinning threads' 24.3k tokens/s, RESULTS.md). Threads are fitted instead."""
    probe = "import os, charlm, torch; print(os.environ.get('OMP_WAIT_POLICY'))"
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    assert subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True).stdout == "None\n"


@pytest.mark.parametrize("rivals,most,want", [(0.0, 2, 2), (0.4, 2, 2), (0.6, 2, 1), (2.0, 2, 1), (0.0, 1, 1)])
def test_threads_are_the_cores_other_programs_leave(monkeypatch, rivals, most, want):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert threads_for(rivals, most) == want


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="readings come from /proc/stat")
def test_beside_programs_on_every_core_torch_runs_one_thread_and_gets_its_threads_back():
    """Spinning OpenMP threads beside CPU-bound programs wait on a descheduled partner (a run did 1 step where
    hundreds were due): inside fitted_threads a reading that finds the cores taken drops torch to one thread;
    leaving it restores the count the caller had."""
    cores = os.cpu_count() or 1
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with spinning(cores):
            share = CpuShare(every=0.5)
            with share.fitted_threads():
                time.sleep(0.6)
                share.tick()
                assert share.rivals >= 0.6 * cores, share.rivals
                assert torch.get_num_threads() == 1
            assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def _cpu_seconds(pid: int) -> float:
    """A process's CPU time (user + system) from /proc/PID/stat: the kernel's own count, independent of CpuShare."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="readings come from /proc/stat")
def test_niced_programs_are_no_rivals():
    """A niced program gives way to this one: its cores count in `others` (the summary's word) but not in
    `rivals` (what torch's threads are fitted to). The gap between the two is the CPU the niced spinners got,
    as the kernel counts it for each of them (whatever else the machine runs meanwhile)."""
    cores = os.cpu_count() or 1
    with spinning(cores, nice=19) as spinners:
        share = CpuShare(every=1.0)
        before = sum(_cpu_seconds(s.pid) for s in spinners)
        t0 = time.perf_counter()
        time.sleep(1.2)
        share.tick()
        niced = (sum(_cpu_seconds(s.pid) for s in spinners) - before) / (time.perf_counter() - t0)
        assert abs((share.others - share.rivals) - niced) < 0.3, (share.others, share.rivals, niced)


def _summary(tmp_path, others: float, own: float, threads: int, **result) -> str:
    """The training view's text after 20 steps on a 2-core machine with these readings, then `result`."""
    console = Console(file=io.StringIO(), width=100)
    view = TrainView(console)
    view(Started(out_dir=tmp_path, device="cpu", params=1000, model_config=ModelConfig(vocab_size=10),
                 train_config=tiny_train(50), start_step=0, train_tokens=1000, val_tokens=100, vocab_size=10))  # fmt: skip
    for step in range(1, 21):
        view(Stepped(step=step, loss=2.0, lr=1e-3, tokens_per_s=5000.0, elapsed=step / 10, load=0.5,
                     others=others, own=own, threads=threads))  # fmt: skip
    view.finish(Result(out_dir=tmp_path, step=20, stopped="steps", train_seconds=2.0, best_val_loss=None,
                       best_val_bpc=None, last_val_loss=None, params=1000, **result))  # fmt: skip
    return console.file.getvalue()


@pytest.mark.parametrize("others,busy", [(0.1, False), (1.4, True)])
def test_the_summary_says_what_other_programs_took(tmp_path, monkeypatch, others, busy):
    """Issue 40: under load a run's summary blamed its share of the load average (24 %) where two threads
    waiting on each other had lost 30x. The summary now reads what the trainer measured: the cores other
    programs kept busy, the cores the run used and its threads."""
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    out = " ".join(_summary(tmp_path, others, 2 - others, 1 if busy else 2).split())
    said = "other programs kept 1.4 of its 2 cores busy, so this run used 0.6 (30% of the machine, torch on 1 thread)"
    assert (said in out) == busy, out
    assert "the CPU was busy" in out if busy else "busy" not in out


@pytest.mark.parametrize("width", [60, 80, 120])
def test_the_summary_breaks_the_checkpoints_line_between_names(tmp_path, width):
    """Found in the tour at 80 columns: the summary's checkpoints row broke inside a file name
    ('best.safetensor' / 's, last.safetensors'). Each file's name now stays whole on its line."""
    from charlm.storage.checkpoint import BEST, LAST

    console = Console(file=io.StringIO(), width=width)
    view = TrainView(console)
    out_dir = Path("checkpoints/tinyshakespeare-transformer-char")  # as the real run prints it
    view(Started(out_dir=out_dir, device="cpu", params=1000, model_config=ModelConfig(vocab_size=10),
                 train_config=tiny_train(5), start_step=0, train_tokens=1000, val_tokens=100, vocab_size=10))  # fmt: skip
    view.finish(Result(out_dir=out_dir, step=5, stopped="steps", train_seconds=1.0, best_val_loss=1.6116,
                       best_val_bpc=2.325, last_val_loss=1.6116, params=1000))  # fmt: skip
    table = console.file.getvalue()
    assert BEST in table and LAST in table, table


def test_no_busy_note_when_the_run_kept_its_usual_speed(tmp_path, monkeypatch):
    """Found in the tour: beside three niced processes (they give way) a run trained at its quiet speed, yet its
    summary said it "did fewer steps than this machine can alone". At 0.9x its usual speed or better, no note."""
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    out = _summary(tmp_path, 0.8, 1.2, 2, tokens_per_s=5000.0, usual_tokens_per_s=5100.0)
    assert "the CPU was busy" not in out
