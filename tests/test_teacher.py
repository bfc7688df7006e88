"""A distilled run's teacher is one file, identified by its absolute path and its sha256: a resume, from any
directory, distils from that file, and refuses in one line when it is gone or has changed (issue 38 item 3).
"""

from __future__ import annotations

import hashlib
import math
import os
import shutil

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from charlm.config import ModelConfig
from charlm.errors import ConfigError
from charlm.storage import checkpoint
from charlm.training.distill import _identify
from charlm.training.resume import resume_run
from charlm.training.trainer import Trainer
from tests.conftest import TINY, cli, one_line_error, tiny_train

STUDENT = ModelConfig(kind="transformer", n_layers=1, d_model=32, n_heads=2, context=32)


@pytest.fixture
def two_k7(cmp_runs, tmp_path):
    """Two directories, each with a run named k7: a Transformer in a/, an LSTM (same tokenizer) in b/."""
    for where, run in (("a", "tf"), ("b", "lstm")):
        shutil.copytree(cmp_runs[run], tmp_path / where / "k7")
    return tmp_path / "a", tmp_path / "b"


def sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def distil(cmp_corpus, out, steps: int, *extra):
    return cli("train", cmp_corpus, *TINY, "--steps", steps, "--eval-interval", 3, "--out", out, *extra)


def test_a_resume_elsewhere_distils_from_the_recorded_teacher(two_k7, cmp_corpus, tmp_path, monkeypatch):
    """Regression: `train --teacher k7` stored "k7" as typed and resolved it again on every --resume, against
    the current directory: resumed from b/, the run distilled from b/k7 (an LSTM), exit 0."""
    a, b = two_k7
    monkeypatch.chdir(a)
    r = distil(cmp_corpus, tmp_path / "student", 3, "--teacher", "k7")
    assert r.exit_code == 0, r.output
    teacher = (a / "k7" / "best.safetensors").resolve()
    recorded = checkpoint.read_header(tmp_path / "student" / "last.safetensors").train_config
    assert (recorded.teacher, recorded.teacher_sha256) == (str(teacher), sha256(teacher))

    monkeypatch.chdir(b)
    resumed = resume_run(tmp_path / "student", cmp_corpus, STUDENT, tiny_train(6), given={"steps"})
    trainer = Trainer(cmp_corpus, resumed.model_cfg, resumed.train_cfg, tmp_path / "student", resume=resumed)
    assert trainer.teacher.file == teacher  # a/k7's Transformer, not b/k7's LSTM
    want = checkpoint.load(teacher).model.state_dict()
    got = trainer.teacher.ck.model.state_dict()
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    r = distil(cmp_corpus, tmp_path / "student", 6, "--resume")
    assert r.exit_code == 0, r.output
    after = checkpoint.read_header(tmp_path / "student" / "last.safetensors")
    assert after.step == 6 and after.train_config.teacher == str(teacher)
    assert math.isfinite(after.best_val_loss)


def test_a_teacher_named_again_must_be_the_recorded_file(two_k7, cmp_corpus, tmp_path, monkeypatch):
    a, b = two_k7
    monkeypatch.chdir(a)
    assert distil(cmp_corpus, tmp_path / "student", 3, "--teacher", "k7").exit_code == 0
    # the same file, named as it was: resumes; named from b/ it is another file: refused
    assert distil(cmp_corpus, tmp_path / "student", 6, "--resume", "--teacher", "k7").exit_code == 0
    monkeypatch.chdir(b)
    one_line_error(
        distil(cmp_corpus, tmp_path / "student", 9, "--resume", "--teacher", "k7"),
        f"this run was trained with --teacher {(a / 'k7' / 'best.safetensors').resolve()}, not {(b / 'k7' / 'best.safetensors').resolve()}",
    )
    # and a Python caller's config naming another teacher is refused alike
    with pytest.raises(ConfigError, match="this run was trained with --teacher"):
        resume_run(tmp_path / "student", cmp_corpus, STUDENT, tiny_train(9, teacher="k7"), given={"teacher", "steps"})


def test_a_replaced_or_missing_teacher_is_refused_on_resume(two_k7, cmp_corpus, tmp_path, monkeypatch):
    a, b = two_k7
    monkeypatch.chdir(a)
    assert distil(cmp_corpus, tmp_path / "student", 3, "--teacher", "k7").exit_code == 0
    teacher = (a / "k7" / "best.safetensors").resolve()
    shutil.copy(b / "k7" / "best.safetensors", teacher)  # same place, other bytes (the LSTM)
    one_line_error(
        distil(cmp_corpus, tmp_path / "student", 6, "--resume"),
        f"--resume: the teacher at {teacher} is not the one this run distils from (its sha256 is {sha256(teacher)[:12]}",
        "put the original back, or train a new run with another --out",
    )
    shutil.rmtree(a / "k7")
    one_line_error(
        distil(cmp_corpus, tmp_path / "student", 6, "--resume"),
        f"this run distils from the teacher {teacher}, which is no longer there: put it back",
    )
    assert checkpoint.read_header(tmp_path / "student" / "last.safetensors").step == 3  # nothing trained meanwhile


def test_a_temperature_too_low_for_float32_is_refused(cmp_runs, cmp_corpus):
    """Regression (issue 38): --distill-temperature 1e-40 passed validation and the first step's loss was NaN
    (logits / T overflow), with the hint "try a lower --lr". The floor is 0.1, where a step is finite."""
    for t in ("1e-40", "0.05", "0", "101"):
        one_line_error(
            cli("train", cmp_corpus, *TINY, "--teacher", cmp_runs["tf"], "--distill-temperature", t),
            "--distill-temperature must be between 0.1 and 100",
        )


def test_the_lowest_temperature_gives_a_finite_loss(cmp_runs, cmp_corpus, tmp_path):
    trainer = Trainer(
        cmp_corpus, STUDENT, tiny_train(1, teacher=str(cmp_runs["tf"]), distill_temperature=0.1), tmp_path / "run"
    )
    x, y = trainer.batches.get_batch("train", 4, torch.Generator().manual_seed(0), "cpu")
    logits, ce = trainer.model(x, y)
    assert math.isfinite(float(trainer.teacher.loss(x, y, logits * 1000, ce).detach()))  # even far from the teacher


FUZZING = "CHARLM_HYPOTHESIS_EXAMPLES" in os.environ  # a long run: more examples, fresh ones each run
EXAMPLES = int(os.environ.get("CHARLM_HYPOTHESIS_EXAMPLES", 100))  # more for a long fuzzing run (RESULTS.md)


@settings(max_examples=EXAMPLES, deadline=None, derandomize=not FUZZING, database=None)
@given(
    what=st.sampled_from(["same", "flipped", "cut", "grown", "gone", "dir", "fifo", "link to same", "other run"]),
    at=st.integers(0, 10**9),
    recorded=st.sampled_from(["true", "other"]) | st.text("0123456789abcdef", min_size=64, max_size=64),
)
def test_any_teacher_on_resume_is_the_recorded_bytes_or_one_line(cmp_runs, tmp_path_factory, what, at, recorded):
    """Whatever is at the recorded path on resume, and whatever hash the run recorded: the teacher is used
    only when its bytes are the ones recorded; else one line that names the file and says what to do."""
    original = (cmp_runs["tf"] / "best.safetensors").read_bytes()
    true_sha = hashlib.sha256(original).hexdigest()
    sha = {"true": true_sha, "other": hashlib.sha256(b"other").hexdigest()}.get(recorded, recorded)
    d = tmp_path_factory.mktemp("teacher")
    path = d / "best.safetensors"
    if what in ("same", "flipped", "cut", "grown"):
        data = bytearray(original)
        if what == "flipped":
            data[at % len(data)] ^= 1 << (at % 8)
        elif what == "cut":
            del data[at % len(data) :]
        elif what == "grown":
            data += b"\0"
        path.write_bytes(bytes(data))
    elif what == "dir":
        path.mkdir()
    elif what == "fifo":
        os.mkfifo(path)
    elif what == "link to same":
        (d / "real.pt").write_bytes(original)
        path.symlink_to(d / "real.pt")
    elif what == "other run":
        shutil.copy(cmp_runs["lstm"] / "best.safetensors", path)
    cfg = tiny_train(2, teacher=str(path), teacher_sha256=sha)
    try:
        file, got = _identify(cfg)
    except ConfigError as e:
        text = str(e)
        assert "\n" not in text and str(path) in text and "another --out" in text, text
        assert not (what in ("same", "link to same") and sha == true_sha)
        return
    assert got == sha == true_sha and file == path and file.read_bytes() == original
