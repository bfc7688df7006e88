"""An error is one line, whatever outside text it quotes: a huge argument is cut in the middle, saying how
much (views.text.clip, on print_error's path)."""

from __future__ import annotations

import os
import subprocess
import sys

from charlm.views.text import MAX_LINE, MAX_WORD, clip


def charlm(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "charlm", *args], capture_output=True, text=True, timeout=60, env=env)


def test_help_with_a_huge_argument_is_one_short_line():
    """Regression (issue 38): `charlm help <100 KB argument>` echoed all 100 KB back in its error."""
    proc = charlm("help", "x" * 100_000)
    err = proc.stderr.strip()
    assert proc.returncode == 2 and "\n" not in err and "Traceback" not in err
    assert err.startswith("error: No such command 'xxx") and "...[99,683 characters]..." in err
    assert len(err) < 2 * MAX_WORD


def test_a_huge_flag_value_with_spaces_is_cut_too():
    proc = charlm("train", "c.txt", "--layers", "x " * 30_000)
    err = proc.stderr.strip()
    assert proc.returncode == 2 and "\n" not in err and len(err) < MAX_LINE + 100, len(err)
    assert "characters]..." in err


def test_clip_keeps_what_is_short_and_both_ends_of_what_is_not():
    path = "/home/me/" + "d/" * 100 + "best.pt"  # 300 characters: shown whole
    assert clip(f"cannot read {path}: it is a directory") == f"cannot read {path}: it is a directory"
    word = "a" * 256 + "b" * 1000 + "c" * 64
    assert clip(f"bad {word} here") == f"bad {'a' * 256}...[1,000 characters]...{'c' * 64} here"
