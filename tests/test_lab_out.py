"""charlm lab --out DIR never deletes or replaces what is at DIR/<run name> unless it is the lab's own earlier run
of that name (issue 38, item 1): a link there is refused, so is another run or any other file; a run that a
training holds is refused by its run lock. Each refusal is one line, exit 1, before any training."""

import json

import pytest
from click.testing import CliRunner

from charlm.cli import main
from charlm.errors import ConfigError
from charlm.lab import capacity
from charlm.lab.training import MARK
from charlm.storage.runs import RunLock

TINY = dict(hidden=(8,), longest=2, grid=(1, 2), steps=4, train_chars=2000, eval_examples=10)


def refused(out) -> str:
    result = CliRunner().invoke(main, ["lab", "recall", "--quick", "--out", str(out)])
    assert result.exit_code == 1, result.output
    assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output
    return result.output


def test_a_link_where_a_lab_run_goes_is_refused_and_its_target_kept(tmp_path):
    other = tmp_path / "another-run"
    other.mkdir()
    (other / "best.safetensors").write_bytes(b"someone else's model")
    out = tmp_path / "lab"
    out.mkdir()
    (out / "recall-transformer-s0").symlink_to(other)
    assert "is a link" in refused(out)
    assert (other / "best.safetensors").read_bytes() == b"someone else's model" and sorted(
        p.name for p in other.iterdir()
    ) == ["best.safetensors"]


def test_another_run_where_a_lab_run_goes_is_refused_and_kept(tmp_path):
    run = tmp_path / "lab" / "recall-lstm-s0"
    run.mkdir(parents=True)
    (run / "best.safetensors").write_bytes(b"a run of its own")
    assert "not this lab run's earlier result" in refused(tmp_path / "lab")
    assert (run / "best.safetensors").read_bytes() == b"a run of its own"
    assert not (tmp_path / "lab" / "recall-transformer-s0").exists()  # refused before any training


def test_a_lab_run_of_another_name_moved_there_is_refused(tmp_path):
    run = tmp_path / "lab" / "recall-lstm-s0"
    run.mkdir(parents=True)
    (run / MARK).write_text(json.dumps({"lab_run": "recall-lstm-s1"}))
    assert "not this lab run's earlier result" in refused(tmp_path / "lab")


def test_the_lab_replaces_its_own_earlier_run_and_nothing_else(tmp_path):
    first = capacity.run(tmp_path, seed=5, progress=lambda m: None, **TINY)
    again = capacity.run(tmp_path, seed=5, progress=lambda m: None, **TINY)
    assert first.results == again.results  # the rerun replaced it: the same run again
    run = tmp_path / "capacity-lstm-h8-s5"
    assert json.loads((run / MARK).read_text()) == {"lab_run": run.name}


def test_a_lab_run_that_a_training_holds_is_refused(tmp_path):
    run = tmp_path / "capacity-lstm-h8-s5"
    lock = RunLock(run, "charlm train")
    try:
        with pytest.raises(ConfigError, match="is in use"):
            capacity.run(tmp_path, seed=5, progress=lambda m: None, **TINY)
    finally:
        lock.release()
