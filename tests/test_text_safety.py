"""The safe path (views/text.py): every outside string - a file or run name, a checkpoint's fields - reaches the
terminal as visible text, never as Rich markup or a raw escape sequence, on a real pty and on a strict UTF-8 terminal."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pexpect
from conftest import CITIZENS, TINY, charlm_pty

from charlm.storage import checkpoint
from charlm.storage.checkpoint import BEST, LAST, OLD_LAST

HOSTILE = "[blink]x\x1b[2J\x07"  # Rich markup (a file name cannot hold "[/blink]"), "clear the screen", a bell


def pty_run(args: list, tmp_path: Path, intr_after: str | None = None) -> str:
    """Run `charlm ARGS` in a real 200 × 40 pseudo-terminal; what the terminal received, raw. intr_after:
    press Ctrl-C once this pattern has appeared."""
    # wide: long temporary paths stay on one line
    child = charlm_pty(tmp_path, *args, size=(200, 40), timeout=120, codec_errors="replace")
    try:
        if intr_after:
            child.expect(intr_after)
            child.sendintr()
        child.expect(pexpect.EOF)
        seen = (child.before or "") if not intr_after else child.before
    finally:
        child.close()
    return seen


def assert_harmless(screen: str, *shown: str) -> None:
    assert "\x1b[2J" not in screen and "\x07" not in screen, "a raw escape from a name reached the terminal"
    assert "\x1b[5m" not in screen, "a name was read as Rich markup ([blink])"
    joined = re.sub(r" \\\r\n +", " ", screen)  # a command broken to fit the terminal, read as the shell reads it
    for text in shown:
        assert text in joined, (text, screen[-2000:])


def test_names_full_of_markup_and_escapes_reach_the_terminal_harmlessly(tmp_path):
    """A corpus file and an --out directory named with markup, ESC[2J and BEL: train's header, table, hints and
    interrupt message, eval's header and info (also a checkpoint whose device and run name are hostile)
    show them as visible text, never raw escapes and never markup."""
    corpus = tmp_path / f"{HOSTILE}.txt"
    corpus.write_text(CITIZENS, encoding="utf-8")
    out = tmp_path / f"out{HOSTILE}"
    visible = "[blink]x\\x1b[2J\\x07"

    done = pty_run(["train", corpus, *TINY, "--steps", 4, "--eval-interval", 2, "--out", out], tmp_path)
    assert "training done" in done
    assert_harmless(
        done,
        f"saving to {tmp_path}/out{visible}",
        f"{tmp_path}/out{visible}/",  # the summary's checkpoints row: the directory, then (best, last)
        f"({BEST}, {LAST})",
        f"charlm chat $'{tmp_path}/out{visible}'",
    )

    stopped = pty_run(
        ["train", corpus, *TINY, "--steps", 1000000, "--eval-interval", 2, "--out", tmp_path / f"b{HOSTILE}"],
        tmp_path,
        intr_after="step 2:",
    )
    assert_harmless(
        stopped,
        f"saved {tmp_path}/b{visible}/{LAST}",
        f"resume with: charlm train $'{tmp_path}/{visible}.txt' --out $'{tmp_path}/b{visible}' --resume",
    )

    assert_harmless(pty_run(["eval", out, corpus], tmp_path), f"out{visible} on {visible}.txt")

    info = pty_run(["info", out], tmp_path)
    assert_harmless(info, f"out{visible}", f"{visible}.txt (sha256")
    crafted = checkpoint.read(out / LAST)
    crafted.device, crafted.run_name = f"cuda{HOSTILE}", f"name{HOSTILE}"
    checkpoint.save(crafted, tmp_path / "crafted.pt")
    assert_harmless(pty_run(["info", tmp_path / "crafted.pt"], tmp_path), f"on cuda{visible}", f"name{visible}")


def test_a_run_named_with_undecodable_bytes_prints_on_a_strict_utf8_terminal(old_pt, tmp_path):
    """V2: a run directory named b"run\\xff" is the str "run\\udcff" (surrogateescape); the safe path let the
    lone surrogate through, and `info` and `runs` failed with UnicodeEncodeError on a strict UTF-8 stdout."""
    root = tmp_path / "ckpts"
    run = Path(os.fsdecode(bytes(root) + b"/run\xff"))
    run.mkdir(parents=True)
    (run / OLD_LAST).write_bytes(old_pt.read_bytes())
    env = {**os.environ, "PYTHONIOENCODING": "utf-8", "CHARLM_DEBUG": ""}
    for args in (["info", str(run)], ["runs", str(root)]):
        proc = subprocess.run([sys.executable, "-m", "charlm", *args], capture_output=True, text=True, env=env)
        assert proc.returncode == 0, proc.stderr
        assert "run\\udcff" in proc.stdout.replace("\n", "") or "run\\udcff" in proc.stdout, proc.stdout
