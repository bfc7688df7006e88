"""A checkpoint is named by a run's name, its directory or a file: an empty or blank name is none of them
(issue 38 item 6), in every command that takes one."""

from __future__ import annotations

import shutil

import pytest
from conftest import cli, one_line_error

EMPTY = "the checkpoint name is empty: give a run's name, its directory or a checkpoint file"


@pytest.mark.parametrize("name", ["", "  ", "\t"])
@pytest.mark.parametrize(
    "command",
    [
        ["sample", "{}", "-p", "the", "-n", "2"],
        ["eval", "{}", "rhymes.txt"],
        ["compress", "{}", "--to", "small"],
        ["info", "{}"],
    ],
    ids=["sample", "eval", "compress", "info"],
)
def test_an_empty_checkpoint_name_is_refused(cmp_runs, cmp_corpus, tmp_path, monkeypatch, name, command):
    """Regression: `charlm sample '' -p X`, `eval ''` and `compress '' --to ...` ran on whatever run was in the
    current directory (Path("") is "."), exit 0."""
    for f in cmp_runs["tf"].iterdir():  # a run right here, which '' used to open
        shutil.copy(f, tmp_path / f.name)
    shutil.copy(cmp_corpus, tmp_path / "rhymes.txt")
    monkeypatch.chdir(tmp_path)
    one_line_error(cli(*[name if a == "{}" else a for a in command]), EMPTY)
    assert not (tmp_path / "small").exists()


def test_a_blank_teacher_is_refused(cmp_corpus, tmp_path):
    one_line_error(cli("train", cmp_corpus, "--teacher", " ", "--out", tmp_path / "run"), EMPTY)


def test_a_model_is_named_by_its_run_name(view_runs, tmp_path, monkeypatch):
    """Found: `charlm sample tinyshakespeare-transformer-char` (the name charlm runs prints) said "no such
    checkpoint"."""
    import shutil

    monkeypatch.chdir(tmp_path)
    for name, run in [("rhymes-transformer-char", view_runs["tf"]), ("rhymes-lstm-char", view_runs["lstm"])]:
        shutil.copytree(run, tmp_path / "checkpoints" / name)
    r = cli("sample", "rhymes-transformer-char", "-p", "ROMEO:", "-n", "5", "--seed", "1")
    assert r.exit_code == 0 and r.stdout.startswith("ROMEO:"), r.output
    assert cli("info", "rhymes-lstm", "--json").exit_code == 0  # a unique start of a name
    one_line_error(cli("sample", "rhymes", "-p", "x"), "could be 2 runs", "rhymes-lstm-char, rhymes-transformer-char")
    one_line_error(cli("sample", "sonnets", "-p", "x"), "no such checkpoint or run: sonnets", "charlm runs")
