"""A reader that goes away (`charlm sample RUN | head -c 50`) ends a command quietly with the shell's
convention for SIGPIPE, 128 + 13 = 141, as coreutils do: not an error (exit 1), not a traceback. Each
command here writes into a pipe whose reading end is already closed, in a real process."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def closed_pipe_run(*args, cwd=None) -> subprocess.CompletedProcess:
    read, write = os.pipe()
    os.close(read)  # nobody will ever read: the first write fails with EPIPE
    try:
        return subprocess.run(
            [sys.executable, "-m", "charlm", *map(str, args)],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            cwd=cwd,
            timeout=120,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
    finally:
        os.close(write)


@pytest.mark.parametrize(
    "command",
    [
        ["sample", "{tf}", "-n", "200", "--device", "cpu"],
        ["eval", "{tf}", "{text}", "--json", "--device", "cpu"],
        ["eval", "{tf}", "{text}", "--device", "cpu"],
        ["compare", "{tf}", "{lstm}", "-n", "20", "--device", "cpu"],
        ["compare", "{tf}", "{lstm}", "-n", "20", "--json", "--device", "cpu"],
        ["attn", "{tf}", "-p", "the cat"],
        ["info", "{tf}"],
        ["info", "{tf}", "--json"],
        ["runs", "{root}"],
        ["plot", "{tf}"],
        ["lab"],
        ["--help"],
    ],
    ids=lambda c: " ".join(w for w in c if not w.startswith(("{", "-")) or w in ("--json", "--help")),
)
def test_a_closed_pipe_stops_a_command_quietly(cmp_runs, cmp_corpus, command):
    names = {"tf": cmp_runs["tf"], "lstm": cmp_runs["lstm"], "root": cmp_runs["tf"].parent, "text": cmp_corpus}
    proc = closed_pipe_run(*(w.format(**names) for w in command))
    assert proc.returncode == 141, proc.stderr
    assert proc.stderr == "", proc.stderr
