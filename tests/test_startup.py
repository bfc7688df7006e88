"""Start-up (issue 19): help, argument errors and the commands that only read files never import torch,
the part of every command that costs seconds. Checked in a fresh process, by what is in sys.modules after
the command ran, not by timing it (timings: benchmarks/HISTORY.md, "Start-up")."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from charlm.cli import main

# runs `charlm ARGS` in this fresh interpreter, then says which heavy modules it had imported
PROBE = """
import json, sys
from charlm.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print(json.dumps([m for m in ("torch", "charlm.models.transformer", "charlm.train") if m in sys.modules]))
"""


def imported(*args, cwd=None) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "CHARLM_DEBUG"}
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, *map(str, args)], capture_output=True, text=True, cwd=cwd, env=env, timeout=120
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("command", [None, *sorted(main.commands)])
def test_help_never_imports_torch(command):
    assert imported(*([command] if command else []), "--help") == []


@pytest.mark.parametrize(
    "args",
    [
        ["sample"],  # missing argument
        ["train", "corpus.txt", "--lr", "-1"],  # a bad value, refused by the config's own check
        ["train", "corpus.txt", "--d-model", "100", "--heads", "3"],  # refused by the transformer's fields
        ["chat", "run", "--temperature", "x"],  # not a number
        ["nope"],  # no such command
    ],
)
def test_argument_errors_never_import_torch(args, tmp_path):
    assert imported(*args, cwd=tmp_path) == []


def test_commands_that_only_read_files_never_import_torch(cmp_runs, tmp_path):
    run = cmp_runs["tf"]
    assert imported("runs", run.parent) == []
    assert imported("info", run) == []
    assert imported("info", run, "--json") == []
    assert imported("plot", run) == []
    # ...while a command that runs the model does, of course
    assert "torch" in imported("sample", run, "-n", "2", "--device", "cpu")
