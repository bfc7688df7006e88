"""Start-up (issue 19): help, argument errors and the commands that only read files never import torch,
the part of every command that costs seconds. Checked in a fresh process, by what is in sys.modules after
the command ran, not by timing it (timings: benchmarks/HISTORY.md, "Start-up")."""

from __future__ import annotations

import io
import re
import subprocess
import sys

import pexpect
import pytest
from conftest import charlm_pty, imported, strip_ansi
from rich.console import Console

from charlm.cli import main
from charlm.views.text import Loading


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


def test_loading_draws_at_once_on_a_terminal_and_nothing_in_a_pipe():
    screen = io.StringIO()
    with Loading("loading run", Console(file=screen, force_terminal=True, width=60)):
        drawn = screen.getvalue()  # before the block's work: the spinner is already there
    assert "loading run" in drawn
    piped = io.StringIO()
    with Loading("loading run", Console(file=piped, width=60)):
        pass
    assert piped.getvalue() == ""


@pytest.mark.parametrize("command", ["sample", "attn", "eval", "chat"])
def test_model_commands_say_they_are_loading_before_anything_else(command, view_runs, cmp_corpus, tmp_path):
    """Found: chat, compare, eval and sample showed a blank screen for seconds while torch and the model loaded."""
    run = view_runs["tf"]
    args = {
        "sample": ["sample", run, "-p", "ROMEO:", "-n", "5"],
        "attn": ["attn", run, "-p", "ROMEO:"],
        "eval": ["eval", run, cmp_corpus, "--unknown", "drop"],
        "chat": ["chat", run],
    }[command]
    child = charlm_pty(tmp_path, *args, size=(80, 24))
    child.expect("loading")
    assert not re.search(r"\w", strip_ansi(child.before))  # the first thing on the screen (after the spinner)
    if command == "chat":
        child.expect_exact(">>> ")
        child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0, child.before


def test_the_command_line_draws_before_numpy_or_torch_load():
    """What runs before the first spinner frame: the command line itself, which imported numpy (0.2-0.6 s on a
    busy 2-core machine) through charlm.commands' error list."""

    probe = "import sys, charlm.cli; print(sorted(m for m in ('numpy', 'torch') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
