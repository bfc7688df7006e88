"""Hostile inputs, round four (issue 26): runs that exited 0 but could not be opened, a token cache that
lied, files charlm wrote through links and onto devices, resumes from crafted checkpoints. Each test names
the finding it guards; signals in every phase are in test_signals.py."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import fields, replace
from pathlib import Path

import pytest
from conftest import CITIZENS, TINY, cli, one_line_error

from charlm import checkpoint
from charlm.checkpoint import BEST, LAST
from charlm.config import ModelConfig, TrainConfig
from charlm.errors import ConfigError


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "citizens.txt"
    path.write_text(CITIZENS, encoding="utf-8")
    return path


# ---- 1: every number a flag accepts is one a checkpoint can hold ------------------------------------------


def whole_number_fields(cls):
    return [f for f in fields(cls) if str(f.type).removesuffix(" | None") == "int"]


@pytest.mark.parametrize("kind", ["transformer", "lstm"])
def test_no_config_accepts_a_number_a_checkpoint_cannot_hold(kind):
    """Regression (issue 26 item 1): --warmup 18446744073709551616 (or --eval-interval that large, or --steps
    of 20 digits with --max-time) trained and said "training done", and then info, sample and --resume all
    refused best.pt ("it holds a number of 65 bits"): the whole run was lost. Every whole-number field of the
    configs a checkpoint records now has an upper bound below 2^64, for every model kind, so the flags refuse
    such numbers before any work."""
    model = ModelConfig(kind=kind, vocab_size=65)
    for f in whole_number_fields(ModelConfig):
        with pytest.raises(ConfigError):
            replace(model, **{f.name: 2**64}).validate()
    for tokenizer in ("char", "bpe"):
        train = TrainConfig(tokenizer=tokenizer)
        for f in whole_number_fields(TrainConfig):
            with pytest.raises(ConfigError):
                replace(train, **{f.name: 2**64}).validate()
    with pytest.raises(ConfigError):
        replace(TrainConfig(), max_time=float("inf")).validate()


@pytest.mark.parametrize(
    "flags",
    [
        ["--warmup", "18446744073709551616"],
        ["--eval-interval", "18446744073709551616"],
        ["--steps", "99999999999999999999", "--max-time", "15s"],
        ["--max-time", "9" * 400],
        ["--eval-iters", "1000000000"],
        ["--sample-tokens", "1000000000"],
    ],
)
def test_a_run_with_a_number_no_checkpoint_holds_is_refused_before_any_work(corpus, tmp_path, flags):
    out = tmp_path / "run"
    r = cli("train", corpus, *TINY, "--steps", "3", "--out", out, *flags)
    one_line_error(r, flags[0])
    assert not out.exists()


# ---- 2, 3, 12: the token cache holds what its name says, or is rebuilt ------------------------------------


def cache_entry(tmp_path):
    (npy,) = (tmp_path / "cache" / "tokens").glob("*.npy")
    return npy


def train_ok(corpus, out, *extra):
    r = cli("train", corpus, *TINY, "--steps", "2", "--out", out, *extra)
    assert r.exit_code == 0, r.output
    return r


def test_a_corpus_replaced_while_it_is_read_is_never_cached_under_the_old_hash(corpus, tmp_path, monkeypatch):
    """Regression (item 2): the corpus was hashed, then read again to be encoded; replaced in between (`mv B A`,
    as editors and git checkout save), B's tokens were cached under A's hash, and every later run of A
    trained on B's tokens. Now the bytes encoded are hashed in the same pass: a mismatch caches nothing and
    says what happened."""
    from charlm import data

    other = "Another text entirely, with its own letters: zebra quiz.\n" * 40
    real = data.iter_corpus

    def replaced_after_hashing(path, *args, **kw):  # the file changes between the hash and the encoding
        corpus.write_text(other, encoding="utf-8")
        return real(path, *args, **kw)

    monkeypatch.setattr(data, "iter_corpus", replaced_after_hashing)
    sha = data.corpus_sha256(corpus)
    tok = data.CharTokenizer.train([CITIZENS + other])
    with pytest.raises(data.CorpusError, match="changed while charlm read it"):
        data.encode_corpus(corpus, tok, sha256=sha)
    assert list((tmp_path / "cache").rglob("*.npy")) == []  # nothing cached under the old hash


@pytest.mark.parametrize(
    "damage",
    ["short", "float32", "ids beyond the vocabulary", "other ids", "2-D", "truncated", "garbage", "empty", "object"],
)
def test_a_damaged_cache_entry_is_never_used_but_rebuilt(corpus, tmp_path, damage):
    """Regression (items 3, 10, 12): a damaged token-cache entry was used unchecked (a 5,000-token array under
    a corpus's key trained on "4,500 train tokens"; a float32 array was cast silently) or crashed without
    naming the cache file (ids beyond the vocabulary: IndexError; a truncated .npy: mmap length; garbage:
    pickle ValueError; an empty file: "interrupted", exit 130). Each entry is now checked on read (its
    record, length, dtype, shape, id range) and rebuilt when it is not what its name says."""
    import numpy as np

    train_ok(corpus, tmp_path / "first")
    npy = cache_entry(tmp_path)
    want = np.load(npy).copy()
    if damage == "short":
        np.save(npy, want[:-50])
    elif damage == "float32":
        np.save(npy, want.astype(np.float32))
    elif damage == "ids beyond the vocabulary":
        bad = want.copy()
        bad[5] = 60000
        np.save(npy, bad)
    elif damage == "other ids":  # same length, dtype and id range: only the record's sha256 tells
        np.save(npy, want[::-1].copy())
    elif damage == "2-D":
        np.save(npy, np.stack([want, want]))
    elif damage == "truncated":
        npy.write_bytes(npy.read_bytes()[:200])
    elif damage == "garbage":
        npy.write_bytes(b"\x93NUMPY garbage" * 10)
    elif damage == "empty":
        npy.write_bytes(b"")
    elif damage == "object":
        np.save(npy, np.array([{"a": 1}] * 3, dtype=object), allow_pickle=True)
    r = train_ok(corpus, tmp_path / "second")
    assert f"{len(want) - int(len(want) * 0.1):,} train" in r.output  # the whole corpus, not the damaged entry
    rebuilt = np.load(npy)
    assert rebuilt.dtype == want.dtype and np.array_equal(rebuilt, want)  # rebuilt


def test_a_stale_or_damaged_tokenizer_cache_is_retrained(corpus, tmp_path):
    """Regression (items 12, 21): tokenizer-cache JSON garbage crashed without naming the file, and a stale
    cached tokenizer on a new run said "…instead of resuming". Either is now trained again."""
    train_ok(corpus, tmp_path / "first")
    (tok,) = (tmp_path / "cache" / "tokenizers").glob("*.json")
    for text in ("{garbage", '{"kind": "char", "chars": ["a", "b"]}'):
        tok.write_text(text, encoding="utf-8")
        for npy in (tmp_path / "cache" / "tokens").glob("*"):
            npy.unlink()
        train_ok(corpus, tmp_path / f"again-{len(text)}")


def test_a_cache_that_cannot_be_written_is_named_with_the_real_reason(corpus, tmp_path, monkeypatch):
    """Regression (items 13, 21): CHARLM_CACHE pointing at a plain file or a symlink loop crashed with
    NotADirectoryError or ELOOP from the temp-file clean-up, which hid the real error; a cache that cannot be
    written said "free some space" whatever the reason. Now: one line naming the path, with the advice that
    fits (space only for a full disk)."""
    plain = tmp_path / "plain"
    plain.write_text("x")
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    for cache in (plain, loop):
        monkeypatch.setenv("CHARLM_CACHE", str(cache))
        err = one_line_error(cli("train", corpus, *TINY, "--steps", "1", "--out", tmp_path / "run"), str(cache))
        assert "free some space" not in err and "unexpected" not in err


# ---- 6, 7, 14: no write through a link, onto a device, and no lock error hiding the real one -------------


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


def test_nothing_charlm_writes_replaces_a_fifo_or_follows_a_link(tmp_path):
    """Regression (item 7): chat's /save onto a FIFO or a device node replaced it with a regular file (as
    root, /save /dev/null replaced the system's /dev/null). Every file charlm writes goes through
    files.atomic_write or files.append_line, which now refuse anything but a regular file."""
    import os
    import stat

    from charlm import files

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "target")
    for path in (fifo, link):
        with pytest.raises(files.WriteError, match="not a regular file"):
            files.atomic_write(path, lambda f: f.write(b"x"))
        with pytest.raises(files.WriteError):
            files.append_line(path, "x")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and link.is_symlink() and not (tmp_path / "target").exists()


def test_chat_save_onto_a_fifo_is_refused(gen_runs, tmp_path):
    import os
    import stat

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    r = cli("chat", gen_runs["lstm"], "-n", "2", input=f"/save {fifo}\n")
    assert "not a regular file" in r.output, r.output
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_lock_that_cannot_be_removed_does_not_hide_the_run_error(tmp_path):
    """Regression (item 14): a run directory made unwritable mid-run (chattr +i) ended in "unexpected
    PermissionError: .lock": removing the lock on the way out raised, hiding "cannot write best.pt". The
    release now lets such an error go (the kernel drops the flock with the process anyway)."""
    from charlm.runs import RunLock

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


def test_sample_of_a_run_whose_best_pt_is_damaged_points_at_last_pt(gen_runs, tmp_path):
    """Regression (item 21): a damaged best.pt beside a good last.pt said "train again", with no word of
    last.pt (which `sample RUN` passes over for best.pt)."""
    run = tmp_path / "run"
    shutil.copytree(gen_runs["lstm"], run)
    (run / BEST).write_bytes(b"PK\x03\x04 damaged")
    one_line_error(cli("sample", run, "-n", "2"), f"{run / LAST} may be intact: use it, or move {BEST} away")
    assert cli("sample", run / LAST, "-n", "2").exit_code == 0


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


# ---- 9, 10, 15, 16, 19, 21: the lab -------------------------------------------------------------------------


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


# ---- 20: endless inputs ---------------------------------------------------------------------------------------


def test_endless_prompts_end_in_one_line(gen_runs, tmp_path):
    """Regression (item 20): `sample --prompt-file /dev/zero` and `yes | charlm sample` read until memory ran
    out. A prompt is read up to 16 MB (far beyond any context), then refused in one line."""
    one_line_error(cli("sample", gen_runs["lstm"], "--prompt-file", "/dev/zero"), "more than 16 MB")
    one_line_error(cli("attn", gen_runs["tf"], "--prompt-file", "/dev/zero"), "more than 16 MB")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CHARLM_CACHE": str(tmp_path / "cache")}
    r = subprocess.run(
        f"yes | {shlex.quote(sys.executable)} -m charlm sample {shlex.quote(str(gen_runs['lstm']))}",
        shell=True,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.returncode == 1 and r.stderr.startswith("error: ") and "more than 16 MB" in r.stderr, r.stderr


# ---- 22: compare labels, plot legends, huge metrics ------------------------------------------------------


def test_compare_labels_best_and_last_of_one_run_apart(gen_runs):
    """Regression (item 22): `compare runs/x/best.pt runs/x/last.pt` labelled both rows by the run's name only."""
    run = gen_runs["tf"]
    r = cli("compare", run / BEST, run / LAST, "-n", "3", "-p", "RO", "--seed", "0")
    assert r.exit_code == 0, r.output
    assert f"{run.name} ({BEST})" in r.output and f"{run.name} ({LAST})" in r.output


def metrics_line(step: int) -> str:
    return json.dumps({"step": step, "train_loss": 2.0, "val_loss": 2.1, "val_bpc": 3.0, "elapsed": step / 10})


def test_plot_of_many_runs_keeps_its_legend(tmp_path):
    """Regression (item 22): `plot` with 9 or more runs dropped the legend without a word (plotext leaves it
    out when it does not fit inside the chart). It now follows the chart."""
    dirs = []
    for i in range(10):
        d = tmp_path / f"run{i:02d}"
        d.mkdir()
        (d / "metrics.jsonl").write_text("".join(metrics_line(s) + "\n" for s in (10, 20, 30)))
        dirs.append(d)
    r = cli("plot", *dirs)
    assert r.exit_code == 0, r.output
    for d in dirs:
        assert f"{d.name} val" in r.output and f"{d.name} train" in r.output


def test_a_huge_metrics_file_is_read_from_its_end_only(tmp_path):
    """Regression (item 22): a 400 MB metrics.jsonl made `info` and `plot` take 70 s and 3.3 GB. At most its
    last 16 MB are read (about 120,000 evaluations; a run writes ~20), and a note says so."""
    from charlm import runs

    run = tmp_path / "run"
    run.mkdir()
    line = metrics_line(1) + "\n"
    with open(run / "metrics.jsonl", "w") as f:
        f.write(line * ((20 << 20) // len(line)))
    metrics = runs.read_metrics(run)
    assert 0 < len(metrics.rows) <= (16 << 20) // len(line) and metrics.skipped == 0
    assert "read only the last 16 MB" in metrics.note
    r = cli("plot", run)
    assert r.exit_code == 0 and "read only the last 16 MB" in r.output, r.output


# ---- issue 28: the progress bar after an evaluation -------------------------------------------------------


def test_the_progress_bar_shows_the_latest_evaluation_at_once():
    """Regression (issue 28, "Silence"): after the final evaluation the bar still showed the val loss of the
    evaluation before (it was only redrawn at the next step, and there is none after the last)."""
    import io

    from rich.console import Console

    from charlm.config import ModelConfig, TrainConfig
    from charlm.events import Evaluated, Started, Stepped
    from charlm.views.progress import TrainView

    view = TrainView(Console(file=io.StringIO(), force_terminal=True, width=120))
    started = dict(out_dir=Path("run"), device="cpu", params=1, start_step=0, train_tokens=1, val_tokens=1)
    view(Started(model_config=ModelConfig(), train_config=TrainConfig(steps=10), vocab_size=3, **started))
    view(Stepped(step=5, loss=2.0, lr=0.1, tokens_per_s=100, elapsed=1.0))
    view(Evaluated(step=5, train_loss=2.0, val_loss=3.874, val_bpc=5.5, is_best=True))
    view(Stepped(step=10, loss=1.5, lr=0.1, tokens_per_s=100, elapsed=2.0))
    view(Evaluated(step=10, train_loss=1.5, val_loss=1.234, val_bpc=1.8, is_best=True))  # the final one
    (task,) = view.progress.tasks
    view.close()
    assert "val 1.234" in task.fields["info"] and "3.874" not in task.fields["info"], task.fields["info"]
