"""files.open_read, the one way charlm opens a file it did not just write: it never waits on a FIFO, refuses
anything but a regular file (and a link where the cache has none), reads no more than it was told, and says
why in charlm's own words (files.reason), never the system's strerror pasted into a sentence."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pexpect
import pytest
from conftest import CITIZENS, TINY
from hypothesis import given, settings
from hypothesis import strategies as st

from charlm import files

# ---- the reader --------------------------------------------------------------------------------------------


def test_a_fifo_with_no_writer_is_refused_at_once(tmp_path):
    """Regression (issue 38 item 5): read_bounded opened the path before its fstat check, and an open of a
    FIFO waits for a writer: for ever. The open is non-blocking now, so the check comes first."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    code = (
        "import sys; from charlm import files\n"
        "try:\n    files.read_bounded(sys.argv[1], 100, 'record')\n"
        "except files.ReadError as e:\n    print(e)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(fifo)], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == f"record {fifo} is a FIFO, not a regular file", proc.stderr


def test_the_reader_refuses_what_is_not_a_regular_file(tmp_path):
    target = tmp_path / "target.json"
    target.write_bytes(b"{}")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    assert files.read_bounded(link, 100, "record") == b"{}"  # a link is followed where links are allowed
    cases = [
        (link, False, f"cannot read record {link}: a symbolic link (or a loop of them) is in the way"),
        (tmp_path, True, f"record {tmp_path} is a directory, not a regular file"),
        (Path("/dev/zero"), True, "record /dev/zero is a device, not a regular file"),
        (tmp_path / "absent", True, f"cannot read record {tmp_path / 'absent'}: it does not exist"),
        (
            target / "below",
            True,
            f"cannot read record {target / 'below'}: a part of its path is a file, not a directory",
        ),
    ]
    for path, links, message in cases:
        with pytest.raises(files.ReadError) as e:
            files.read_bounded(path, 100, "record", links=links)
        assert str(e.value) == message


def test_the_reader_reads_no_more_than_its_limit(tmp_path):
    big = tmp_path / "big"
    big.write_bytes(b"x" * 101)
    assert files.read_bounded(big, 101, "record") == b"x" * 101
    with pytest.raises(files.ReadError, match="larger than 100 bytes: it cannot be what charlm wrote"):
        files.read_bounded(big, 100, "record")


def test_system_error_text_never_reads_into_our_sentences():
    """Regression (issue 38): errors read "it is Not a directory" and "cannot write X: File exists" (the
    system's strerror, capitalised, pasted into a sentence). files.reason words every errno charlm meets."""
    for code in (errno.ENOTDIR, errno.EEXIST, errno.EISDIR, errno.EACCES, errno.ENOENT, errno.EROFS, errno.ELOOP):
        words = files.reason(OSError(code, os.strerror(code)))
        assert words[0].islower() and os.strerror(code) not in words, words
    assert files.reason(OSError(errno.EPIPE, "Broken pipe")) == "broken pipe"  # unlisted: lower-cased


def test_writing_under_a_file_says_so_in_our_words(tmp_path):
    plain = tmp_path / "plain"
    plain.write_text("x")
    with pytest.raises(files.WriteError) as e:
        files.atomic_write(plain / "sub" / "f.json", lambda f: f.write(b"{}"), parents=True)
    assert str(e.value) == f"cannot write {plain / 'sub' / 'f.json'}: a part of its path is a file, not a directory"


# ---- a FIFO in the cache, through the real command -----------------------------------------------------------


def _train(tmp_path, corpus: Path, out: str, timeout: int = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CHARLM_CACHE": str(tmp_path / "cache")}
    args = ["train", corpus, "--out", tmp_path / out, *TINY, "--steps", "3", "--tokenizer", "char"]
    # a hang fails this test (TimeoutExpired) rather than the suite
    return subprocess.run(
        [sys.executable, "-m", "charlm", *map(str, args)], capture_output=True, text=True, timeout=timeout, env=env
    )


@pytest.mark.parametrize("entry", ["token record", "token ids", "tokenizer"])
def test_a_fifo_in_the_cache_never_hangs_train(tmp_path, entry):
    """Regression (issue 38 item 5): a FIFO put in the cache in place of an entry hung `train` for ever. Now
    a FIFO in place of a record or a tokenizer is an entry to rebuild, and one where the rebuilt entry must
    go is one clear line (charlm never replaces a FIFO); either way train ends at once."""
    corpus = tmp_path / "citizens.txt"
    corpus.write_text(CITIZENS, encoding="utf-8")
    first = _train(tmp_path, corpus, "a")
    assert first.returncode == 0, first.stderr
    cache = tmp_path / "cache"
    pattern = {"token record": "tokens/*.json", "token ids": "tokens/*.npy", "tokenizer": "tokenizers/*.json"}[entry]
    (path,) = cache.glob(pattern)
    path.unlink()
    os.mkfifo(path)
    again = _train(tmp_path, corpus, "b")
    if again.returncode == 0:
        assert (tmp_path / "b" / "best.safetensors").is_file()
    else:
        err = again.stderr.strip()
        assert err.startswith("error: ") and "\n" not in err, err
        assert err.endswith(
            f"cannot write {path}: it is a FIFO, not a regular file (the token cache): remove it, or set CHARLM_CACHE elsewhere"
        ), err


def test_a_fifo_as_the_speed_record_never_hangs_train(tmp_path):
    """speeds.json is read after a run of 50 steps or more: a FIFO there is a record to start afresh, and the
    run ends as usual."""
    corpus = tmp_path / "citizens.txt"
    corpus.write_text(CITIZENS, encoding="utf-8")
    (tmp_path / "cache").mkdir()
    os.mkfifo(tmp_path / "cache" / "speeds.json")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CHARLM_CACHE": str(tmp_path / "cache")}
    args = ["train", corpus, "--out", tmp_path / "run", *TINY, "--steps", "50", "--eval-interval", "50"]
    proc = subprocess.run(
        [sys.executable, "-m", "charlm", *map(str, args)], capture_output=True, text=True, timeout=240, env=env
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 50


# ---- where the cache is ------------------------------------------------------------------------------------


def test_charlm_cache_expands_a_tilde_and_refuses_a_relative_path(tmp_path, monkeypatch):
    """Regression (issue 38): CHARLM_CACHE='~/x' (quoted, so no shell expanded it) made a directory named '~'
    in the current directory. A leading ~ is now expanded; a path still relative is refused in one line (a
    relative cache would be another cache in every directory)."""
    from charlm.data import cache_dir
    from charlm.errors import ConfigError

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("CHARLM_CACHE", "~/x")
    assert cache_dir() == tmp_path / "home" / "x"
    for relative in ("cache", "./cache", "~nosuchuser0/cache"):
        monkeypatch.setenv("CHARLM_CACHE", relative)
        with pytest.raises(ConfigError) as e:
            cache_dir()
        assert (
            str(e.value)
            == f"CHARLM_CACHE must be an absolute path, got '{relative}': set it to one, e.g. ~/.cache/charlm"
        )


def test_train_with_a_quoted_tilde_cache_writes_under_home(tmp_path):
    corpus = tmp_path / "citizens.txt"
    corpus.write_text(CITIZENS, encoding="utf-8")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CHARLM_CACHE": "~/cache", "HOME": str(tmp_path / "home")}
    args = ["train", corpus, "--out", tmp_path / "run", *TINY, "--steps", "2"]
    proc = subprocess.run(
        [sys.executable, "-m", "charlm", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert any((tmp_path / "home" / "cache" / "tokens").iterdir()) and not (tmp_path / "~").exists()


# ---- properties: any file of any kind ------------------------------------------------------------------------

FUZZING = "CHARLM_HYPOTHESIS_EXAMPLES" in os.environ  # a long run: more examples, fresh ones each run
EXAMPLES = int(os.environ.get("CHARLM_HYPOTHESIS_EXAMPLES", 200))  # more for a long fuzzing run (RESULTS.md)


@settings(max_examples=EXAMPLES, deadline=None, derandomize=not FUZZING, database=None)
@given(
    kind=st.sampled_from(["file", "link", "fifo", "dir", "absent", "link to fifo", "dangling link", "under a file"]),
    data=st.binary(max_size=300),
    limit=st.integers(0, 400),
    links=st.booleans(),
)
def test_any_path_is_its_bytes_or_one_line(tmp_path_factory, kind, data, limit, links):
    """read_bounded on anything a path can be: the file's bytes when it is a regular file (through a link
    where links are allowed) no larger than the limit; else a ReadError of one line naming the path. Never
    a wait, never another exception."""
    d = tmp_path_factory.mktemp("any")
    target, path = d / "target", d / "path"
    target.write_bytes(data)
    if kind == "file":
        path.write_bytes(data)
    elif kind == "link":
        path.symlink_to(target)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "dir":
        path.mkdir()
    elif kind == "link to fifo":
        os.mkfifo(d / "fifo")
        path.symlink_to(d / "fifo")
    elif kind == "dangling link":
        path.symlink_to(d / "nothing")
    elif kind == "under a file":
        path = target / "below"
    readable = kind == "file" or (kind == "link" and links)
    try:
        got = files.read_bounded(path, limit, "record", links=links)
    except files.ReadError as e:
        assert "\n" not in str(e) and str(path) in str(e)
        assert not readable or len(data) > limit
        return
    assert readable and got == data and len(got) <= limit


def test_a_fifo_as_chat_history_never_hangs_chat(cmp_runs, chat_pty, tmp_path):
    """chat's history lives in the cache (chat_history): a FIFO there blocked readline's open before the
    first prompt, for ever. Now chat starts without a history and leaves the FIFO as it was."""
    import stat

    (tmp_path / "cache").mkdir()
    os.mkfifo(tmp_path / "cache" / "chat_history")
    child = chat_pty(cmp_runs["tf"], "--max-tokens", "3")
    child.expect_exact(">>> ", timeout=60)
    child.sendline("the")
    child.expect_exact(">>> ", timeout=60)
    child.sendeof()
    child.expect(pexpect.EOF, timeout=60)
    child.close()
    assert child.exitstatus == 0 and stat.S_ISFIFO(os.lstat(tmp_path / "cache" / "chat_history").st_mode)


def test_a_fifo_or_device_is_not_a_regular_file(tmp_path):
    """Regression: a FIFO given as a checkpoint hung for ever; as a corpus it was "empty"."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CHARLM_CACHE": str(tmp_path / "cache")}
    for args, message in [
        (["info", fifo], f"{fifo} is not a regular file: give a checkpoint file or a run directory"),
        (["train", fifo, "--out", tmp_path / "out"], f"{fifo} is not a regular file; give the path of a text file"),
        (["train", "/dev/zero", "--out", tmp_path / "out"], "/dev/zero is not a regular file"),
    ]:
        proc = subprocess.run(
            [sys.executable, "-m", "charlm", *map(str, args)], capture_output=True, text=True, timeout=60, env=env
        )
        assert proc.returncode == 1 and proc.stderr.strip() == f"error: {message}" or message in proc.stderr, (
            proc.stderr
        )
    assert not (tmp_path / "out").exists()


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
