"""A run directory belongs to one run: its .lock is never followed through a link and never hides the run's own
error, another run's metrics.jsonl is never rewritten, and `train --resume` refuses in one line what is not its
own (a damaged or foreign checkpoint beside it, a crafted training state, flags that do not apply), keeping
what it can read. Each test names the finding it guards (issues 10 and 26)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from click.testing import CliRunner
from conftest import TINY, cli, one_line_error, train_ok

from charlm.cli import main
from charlm.storage import checkpoint
from charlm.storage.checkpoint import BEST, LAST

# ---- 6, 14: the lock ------------------------------------------------------------------------------------------


def test_a_planted_lock_link_is_refused_and_its_target_untouched(corpus, tmp_path):
    """Regression (item 6): a .lock symlink planted in a run directory made `train --resume` truncate its
    target and write a process id into it. The lock is opened with O_NOFOLLOW: refused in one line."""
    out = tmp_path / "run"
    train_ok(corpus, out)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (out / ".lock").symlink_to(victim)
    one_line_error(cli("train", corpus, "--out", out, "--resume", "--steps", "4"), ".lock")
    assert victim.read_text() == "precious\n"


def test_a_lock_that_cannot_be_removed_does_not_hide_the_run_error(tmp_path):
    """Regression (item 14): a run directory made unwritable mid-run (chattr +i) ended in "unexpected
    PermissionError: .lock": removing the lock on the way out raised, hiding "cannot write best.pt". The
    release now lets such an error go (the kernel drops the flock with the process anyway)."""
    from charlm.storage.runs import RunLock

    out = tmp_path / "run"
    lock = RunLock(out)
    (out / ".lock").unlink()
    (out / ".lock").mkdir()  # unlink() of it now fails, as in a directory made immutable
    lock.release()  # no exception
    assert lock.file.closed


# ---- 8, 17: metrics.jsonl of another run, damaged, or not a file -----------------------------------------


def test_a_new_run_never_rewrites_another_runs_metrics(corpus, tmp_path):
    """Regression (item 8): a new run into a directory holding another run's metrics.jsonl (and no last.pt)
    deleted every line with step > 0 and every non-JSON line, then mixed its own lines with the rest. It is
    now refused in one line, and the file is untouched."""
    out = tmp_path / "run"
    out.mkdir()
    theirs = b'{"step": 100, "train_loss": 1, "val_loss": 1, "val_bpc": 1, "elapsed": 1}\nnotes\n'
    (out / "metrics.jsonl").write_bytes(theirs)
    one_line_error(cli("train", corpus, *TINY, "--steps", "2", "--out", out), "metrics.jsonl")
    assert (out / "metrics.jsonl").read_bytes() == theirs and not (out / LAST).exists()


def test_resume_keeps_undecodable_metrics_lines_and_refuses_a_directory(corpus, tmp_path):
    """Regression (item 17): `train --resume` with a 0xff byte in metrics.jsonl crashed (UnicodeDecodeError;
    plot tolerates it), and with a metrics.jsonl that is a directory (IsADirectoryError). Now the line stays
    (plot skips it) and the run resumes; a directory is one line."""
    out = tmp_path / "run"
    train_ok(corpus, out, "--eval-interval", "1")
    log = out / "metrics.jsonl"
    log.write_bytes(log.read_bytes() + b"\xff\xfe not text\n")
    r = cli("train", corpus, "--out", out, "--resume", "--steps", "3")
    assert r.exit_code == 0, r.output
    assert b"\xff\xfe not text\n" in log.read_bytes()
    assert [int(line.split(b'"step": ')[1].split(b",")[0]) for line in log.read_bytes().splitlines()
            if line.startswith(b"{")] == [1, 2, 3]  # fmt: skip
    log.unlink()
    log.mkdir()
    one_line_error(cli("train", corpus, "--out", out, "--resume", "--steps", "4"), "metrics.jsonl")


# ---- 11, 18, 21: resume from crafted or foreign checkpoints ------------------------------------------------


def test_resume_beside_another_models_best_pt_is_refused(corpus, tmp_path):
    """Regression (item 11): --resume beside a newer best.pt of another model family adopted its best loss,
    so the run never wrote its own best.pt again and `sample` used the foreign one. Now refused in one line;
    and a damaged best.pt beside a good last.pt says to move best.pt away (item 21), not "train again"."""
    out, other = tmp_path / "run", tmp_path / "other"
    train_ok(corpus, out)
    train_ok(corpus, other, "--model", "lstm")
    (out / BEST).write_bytes((other / BEST).read_bytes())
    one_line_error(cli("train", corpus, "--out", out, "--resume", "--steps", "4"), f"{BEST} is not this run's")
    (out / BEST).write_bytes(b"PK\x03\x04 damaged")
    err = one_line_error(cli("train", corpus, "--out", out, "--resume", "--steps", "4"), BEST)
    assert f"{LAST} may be intact: use it, or move {BEST} away, then resume" in err


@pytest.mark.parametrize("what", ["lstm optimizer", "3-byte rng", "rng without data", "wrong-shape state", "nan state"])
def test_resume_from_a_crafted_training_state_is_one_line(corpus, tmp_path, what):
    """Regression (item 18): `train --resume` on a crafted last.pt crashed: an LSTM's optimizer state in a
    Transformer run (ValueError), a 3-byte RNG state (RuntimeError), RNG state without "data" (KeyError).
    Every part of the training state is now checked against the model before use: one line naming the file."""
    import torch

    out, other = tmp_path / "run", tmp_path / "other"
    train_ok(corpus, out)
    saved = checkpoint.read(out / LAST)
    if what == "lstm optimizer":
        train_ok(corpus, other, "--model", "lstm")
        change = {"optimizer": checkpoint.read(other / LAST).optimizer}
    elif what == "3-byte rng":
        change = {"rng": {**saved.rng, "data": torch.zeros(3, dtype=torch.uint8)}}
    elif what == "rng without data":
        change = {"rng": {"torch": saved.rng["torch"]}}
    else:
        state = saved.optimizer
        inner = state["optimizers"][-1]["state"]
        key = next(iter(inner))
        name = "exp_avg" if "exp_avg" in inner[key] else next(iter(inner[key]))
        inner[key][name] = torch.zeros(3) if what == "wrong-shape state" else inner[key][name] * float("nan")
        change = {"optimizer": state}
    checkpoint.save(replace(saved, **change), out / LAST)
    err = one_line_error(cli("train", corpus, "--out", out, "--resume", "--steps", "4"), f"{LAST} cannot be resumed")
    assert "unexpected" not in err


# ---- resume: flags that mean nothing for the run ------------------------------------------------------------


@pytest.mark.parametrize(
    "model,args,message",
    [
        ("lstm", ["--heads", "4"], "--resume: --heads applies to transformer runs only, and this run is lstm; drop it"),
        ("lstm", ["--positions", "learned"], "--positions applies to transformer runs only, and this run is lstm"),
        (
            "transformer",
            ["--vocab-size", "1024"],
            "--resume: --vocab-size applies to bpe runs only, and this run is char; drop it",
        ),
    ],
    ids=["heads on an lstm", "positions on an lstm", "vocab size on a char run"],
)
def test_resume_refuses_flags_that_do_not_apply(corpus, tmp_path, model, args, message):
    """Regression: resume accepted (or blamed on another value) flags that mean nothing for the run."""
    out = tmp_path / "run"
    assert (
        CliRunner()
        .invoke(main, ["train", str(corpus), *TINY, "--model", model, "--out", str(out), "--steps", "2"])
        .exit_code
        == 0
    )
    one_line_error(
        CliRunner().invoke(main, ["train", str(corpus), "--out", str(out), "--steps", "4", "--resume", *args]), message
    )
    assert checkpoint.read(out / LAST).step == 2
