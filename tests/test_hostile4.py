"""Hostile inputs, round four (issue 26): runs that exited 0 but could not be opened, a token cache that
lied, files charlm wrote through links and onto devices, resumes from crafted checkpoints. Each test names
the finding it guards; signals in every phase are in test_signals.py."""

from __future__ import annotations

from dataclasses import fields, replace

import pytest
from conftest import CITIZENS, TINY, cli, one_line_error

from charlm import checkpoint
from charlm.config import ConfigError, ModelConfig, TrainConfig


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
    assert np.array_equal(np.load(npy), want)  # rebuilt


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
    assert (out / "metrics.jsonl").read_bytes() == theirs and not (out / "last.pt").exists()


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
    (out / "best.pt").write_bytes((other / "best.pt").read_bytes())
    one_line_error(cli("train", corpus, "--out", out, "--resume", "--steps", "4"), "best.pt is not this run's")
    (out / "best.pt").write_bytes(b"PK\x03\x04 damaged")
    err = one_line_error(cli("train", corpus, "--out", out, "--resume", "--steps", "4"), "best.pt")
    assert "last.pt may be intact: use it, or move best.pt away, then resume" in err


def crafted(out, **changes):
    """Rewrite out/last.pt with some of its tensor fields changed (a crafted or damaged file)."""
    import torch

    saved = checkpoint.read(out / "last.pt")
    checkpoint.save(replace(saved, **changes), out / "last.pt")
    return torch


@pytest.mark.parametrize("what", ["lstm optimizer", "3-byte rng", "rng without data", "wrong-shape state", "nan state"])
def test_resume_from_a_crafted_training_state_is_one_line(corpus, tmp_path, what):
    """Regression (item 18): `train --resume` on a crafted last.pt crashed: an LSTM's optimizer state in a
    Transformer run (ValueError), a 3-byte RNG state (RuntimeError), RNG state without "data" (KeyError).
    Every part of the training state is now checked against the model before use: one line naming the file."""
    import torch

    out, other = tmp_path / "run", tmp_path / "other"
    train_ok(corpus, out)
    saved = checkpoint.read(out / "last.pt")
    if what == "lstm optimizer":
        train_ok(corpus, other, "--model", "lstm")
        change = {"optimizer": checkpoint.read(other / "last.pt").optimizer}
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
    checkpoint.save(replace(saved, **change), out / "last.pt")
    err = one_line_error(cli("train", corpus, "--out", out, "--resume", "--steps", "4"), "last.pt cannot be resumed")
    assert "unexpected" not in err
