"""Threads on a busy CPU (issue 40): torch's thread count follows the cores other programs leave free, and the
training summary says what the run really got. Speeds: benchmarks/bench_busy.py (RESULTS.md, "Busy CPU")."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest
import torch
from conftest import tiny_train
from rich.console import Console

from charlm.config import ModelConfig
from charlm.events import Result, Started, Stepped
from charlm.runtime import Threads
from charlm.views.progress import TrainView


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="readings come from /proc/stat")
def test_a_cpu_kept_busy_by_other_programs_gets_one_thread_and_the_count_comes_back():
    """With every core busy with a CPU-bound program, a second torch thread would wait at each barrier for a
    core it does not get: one thread. On leaving, torch has the threads it had before."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)]
    try:
        with Threads() as threads:
            threads.start(least=0.5)  # a longer reading than the first one: the spinners have started by now
            assert torch.get_num_threads() == 1
            assert threads.others >= 0.6 * (os.cpu_count() or 1), threads.others
            assert 0 <= threads.own < 1
        assert torch.get_num_threads() == 2
    finally:
        for s in spinners:
            s.kill()
            s.wait()
        torch.set_num_threads(before)


def test_one_thread_asked_for_stays_one():
    """OMP_NUM_THREADS=1 or a caller's set_num_threads(1) (the lab) is a ceiling: never more threads."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with Threads() as threads:
            threads.tick(force=True)
            assert torch.get_num_threads() == 1 and threads.last is None
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("others,busy", [(0.1, False), (1.4, True)])
def test_the_summary_says_what_other_programs_took(tmp_path, monkeypatch, others, busy):
    """Issue 40: under load a run's summary blamed its share of the load average (24 %) where two threads
    waiting on each other had lost 30x. The summary now reads what the trainer measured: the cores other
    programs kept busy, the cores the run used and its threads."""
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    console = Console(file=io.StringIO(), width=100)
    view = TrainView(console)
    view(Started(out_dir=tmp_path, device="cpu", params=1000, model_config=ModelConfig(vocab_size=10),
                 train_config=tiny_train(50), start_step=0, train_tokens=1000, val_tokens=100, vocab_size=10))  # fmt: skip
    for step in range(1, 21):
        view(Stepped(step=step, loss=2.0, lr=1e-3, tokens_per_s=5000.0, elapsed=step / 10, load=0.5,
                     others=others, own=2 - others, threads=1 if busy else 2))  # fmt: skip
    view.finish(Result(out_dir=tmp_path, step=20, stopped="steps", train_seconds=2.0, best_val_loss=None,
                       best_val_bpc=None, last_val_loss=None, params=1000))  # fmt: skip
    out = " ".join(console.file.getvalue().split())
    said = "other programs kept 1.4 of its 2 cores busy, so this run used 0.6 (30% of the machine, torch on 1 thread)"
    assert (said in out) == busy, out
    assert "the CPU was busy" in out if busy else "busy" not in out
