"""A full disk, for real: a small tmpfs mounted for the test (as root; skipped where mounting is not
allowed), filled by the real write path. Checkpoints, the token cache and chat's /save each report it in
one line that says where, keep what was written before intact and leave no partial or temp file."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pexpect
import pytest
from click.testing import CliRunner
from conftest import CITIZENS, TINY

from charlm.cli import main
from charlm.storage import checkpoint
from charlm.storage.checkpoint import BEST, LAST


@pytest.fixture
def small_disk(tmp_path):
    """mount(size) -> a directory on a fresh tmpfs of that many bytes; unmounted after the test."""
    mounted = []

    def mount(size: int) -> Path:
        where = tmp_path / f"disk{len(mounted)}"
        where.mkdir()
        r = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True, text=True
        )
        if r.returncode != 0:
            pytest.skip(f"cannot mount a small tmpfs here ({r.stderr.strip() or r.returncode}): needs root")
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(disk: Path) -> None:
    """Take every free byte of disk."""
    with open(disk / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass


def charlm(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def one_line_error(r, *fragments: str) -> str:
    assert r.exit_code == 1, (r.exit_code, r.output)
    err = r.stderr.strip()
    assert err.startswith("error: ") and "\n" not in err and "please report" not in err, repr(r.stderr)
    for fragment in fragments:
        assert fragment in err, (fragment, err)
    return err


def test_a_full_disk_while_saving_checkpoints(corpus, tmp_path, small_disk):
    """Regression: a full disk while writing a checkpoint was "unexpected RuntimeError: [enforce fail at
    inline_container.cc...] please report it". The disk here holds the first evaluation's best.pt and
    last.pt and little more, so the second evaluation's write fails: one line saying where, what was
    written before is intact (and agrees: metrics.jsonl logs the first evaluation only), no temp file is
    left, and with some space freed the run resumes."""
    probe = tmp_path / "probe"
    assert charlm("train", corpus, *TINY, "--steps", 5, "--eval-interval", 5, "--out", probe).exit_code == 0
    size = (probe / LAST).stat().st_size + (probe / BEST).stat().st_size  # (best holds no training state)
    disk = small_disk(int(1.25 * size) // 4096 * 4096)
    out = disk / "run"
    err = one_line_error(
        charlm("train", corpus, *TINY, "--steps", 20, "--eval-interval", 5, "--out", out),
        f"no space left on device writing {out}; the checkpoints already in it are intact",
        f"resume with: charlm train {corpus} --out {out} --resume",
    )
    assert sorted(p.name for p in out.iterdir()) == [BEST, LAST, "metrics.jsonl"], err
    last, best = checkpoint.load(out / LAST), checkpoint.load(out / BEST)
    assert last.saved.step == best.saved.step == 5
    logged = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [step for step in logged if step <= 5] == [5]  # (a line beyond last.pt's step is dropped on resume)

    shutil.move(str(out), tmp_path / "moved")  # space again: the run goes on where it stopped
    r = charlm("train", corpus, "--out", tmp_path / "moved", "--resume")
    assert r.exit_code == 0, r.output
    assert checkpoint.read(tmp_path / "moved" / LAST).step == 20


def test_a_full_disk_while_encoding_the_corpus(corpus, tmp_path, small_disk, monkeypatch):
    """Regression: a token cache on a full disk was "unexpected OSError ... please report it"."""
    cache = small_disk(64 * 1024)
    monkeypatch.setenv("CHARLM_CACHE", str(cache))
    big = tmp_path / "big.txt"
    big.write_text(CITIZENS * 40, encoding="utf-8")  # 200 KB of text: 400 KB of token ids
    one_line_error(
        charlm("train", big, *TINY, "--steps", 1, "--out", tmp_path / "run"),
        f"no space left on device writing {cache / 'tokens'} (the token cache): free some space, "
        "or set CHARLM_CACHE to a disk with room",
    )
    assert list((cache / "tokens").iterdir()) == []  # no temp file left
    assert not (tmp_path / "run").exists()


def test_chat_save_on_a_full_disk_leaves_no_file(gen_runs, chat_pty, small_disk):
    """Regression: /save on a full disk left an empty file behind. Now the file appears whole or not at
    all, and chat says why and goes on."""
    disk = small_disk(64 * 1024)
    fill(disk)
    child = chat_pty(gen_runs["tf"], "--temperature", "0", "--max-tokens", "40")
    child.expect_exact(">>> ")
    child.sendline("ROMEO:")
    child.expect_exact(">>> ")
    child.sendline(f"/save {disk / 'talk.txt'}")
    child.expect_exact(">>> ")
    assert sorted(p.name for p in disk.iterdir()) == ["filler"]  # neither an empty talk.txt nor a temp file
    said = " ".join(re.sub(r"\x1b\[[0-9;]*m", "", child.before).split())  # (a long line wraps)
    assert f"no space left on device writing {disk}" in said, said
    (disk / "filler").unlink()
    child.sendline(f"/save {disk / 'talk.txt'}")
    child.expect_exact("saved 1 turn")
    assert (disk / "talk.txt").read_text(encoding="utf-8").startswith(">>> ROMEO:\nROMEO:")
    child.sendline("/quit")
    child.expect(pexpect.EOF)
