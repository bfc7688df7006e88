"""The lab's inputs from outside: --out (two labs into one, Ctrl-C, a path that cannot be written) and lab ablate's
targets.npy and --text, each refused in one line before any work (issue 26)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from conftest import cli, one_line_error

from charlm.storage.checkpoint import LAST


def lab_process(tmp_path, *args):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CHARLM_CACHE": str(tmp_path / "cache")}
    return subprocess.Popen(
        [sys.executable, "-m", "charlm", "lab", *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def test_two_labs_into_one_out_and_ctrl_c_in_a_lab(tmp_path):
    """Regression (items 9, 15): two `lab induction --quick --out lab3` at once each deleted the other's files
    and interleaved metrics.jsonl, both exiting 0; Ctrl-C during a lab's training ended in "unexpected
    TrainingInterrupted … please report", exit 1. The lab now holds its --out with the run lock (a second
    is refused in one line), and a Ctrl-C is "interrupted", exit 130."""
    out = tmp_path / "lab3"
    first = lab_process(tmp_path, "induction", "--quick", "--out", out)
    deadline = time.monotonic() + 120
    while not list(out.glob("*/metrics.jsonl")):  # training (an evaluation was written)
        assert time.monotonic() < deadline and first.poll() is None, first.stderr.read() if first.poll() else ""
        time.sleep(0.05)
    one_line_error(cli("lab", "induction", "--quick", "--out", out), f"{out} is in use by another charlm lab")
    first.send_signal(signal.SIGINT)
    _, stderr = first.communicate(timeout=60)
    assert first.returncode == 130, stderr
    assert "interrupted" in stderr and "unexpected" not in stderr and "Traceback" not in stderr, stderr


@pytest.mark.parametrize("stop", ["SetupInterrupted", "Quit"])
def test_a_stop_signal_between_a_labs_runs_is_interrupted_with_its_exit_code(tmp_path, monkeypatch, stop):
    """Regression: a SIGINT that reached `lab induction` while its next model was being set up (no training loop to
    defer it) ended in "unexpected SetupInterrupted: 2 … please report it", exit 1. Any command that lets a
    trainer's stop escape now says "interrupted" and exits 128 + the signal (here SIGTERM's 143)."""
    from charlm.training import stopping

    def run(*args, **kwargs):
        raise getattr(stopping, stop)(signal.SIGTERM)

    monkeypatch.setattr("charlm.lab.induction.run", run)
    r = cli("lab", "induction", "--quick", "--out", tmp_path / "lab")
    assert r.exit_code == 143 and r.stderr == "interrupted\n", (r.exit_code, r.stderr)


def test_lab_out_that_cannot_be_written_is_refused_before_any_work(tmp_path):
    """Regression (item 16): `lab … --out` on a file, or a path under a file, was an unexpected OSError after
    the work began (train checks its --out first; lab did not)."""
    plain = tmp_path / "plain"
    plain.write_text("x")
    for out in (plain, plain / "under"):
        one_line_error(cli("lab", "induction", "--quick", "--out", out), "cannot write to")


@pytest.fixture
def lab_run(gen_runs, tmp_path):
    """A lab run directory as `lab ablate` reads one: a char checkpoint, its corpus.txt and targets.npy."""
    run = tmp_path / "labrun"
    run.mkdir()
    shutil.copy(gen_runs["lstm"] / LAST, run / LAST)
    (run / "corpus.txt").write_text("ROMEO:\nBut soft\n" * 5, encoding="utf-8")
    return run


def test_lab_ablate_names_a_damaged_targets_file(lab_run):
    """Regression (items 10, 19): an empty targets.npy under `lab ablate` printed "interrupted" and exited 130
    (Click took the EOFError for Ctrl-D); a garbage one or an object array was an unexpected ValueError.
    Each is one line naming the file."""
    import numpy as np

    targets = lab_run / "targets.npy"
    for damage in ("empty", "garbage", "object"):
        if damage == "object":
            np.save(targets, np.array([{"a": 1}] * 3, dtype=object), allow_pickle=True)
        else:
            targets.write_bytes(b"" if damage == "empty" else b"\x93NUMPY nonsense")
        one_line_error(cli("lab", "ablate", lab_run / LAST), "targets.npy is damaged")


def test_lab_ablate_text_that_is_a_device_is_named_so(lab_run):
    """Regression (items 20, 21): `lab ablate --text /dev/zero` said "does not exist"; it is now "not a regular
    file" (a device never ends), and a real text is read only as far as it is scored."""
    one_line_error(cli("lab", "ablate", lab_run / LAST, "--text", "/dev/zero"), "not a regular file")
