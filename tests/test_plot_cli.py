"""Loss curves (issue 13, part 5): `charlm plot RUN...` draws train and val loss or bits/char against
steps or time from metrics.jsonl, one run or several overlaid; piped or under NO_COLOR it is plain
characters; --json gives the numbers; `charlm info` shows the curve too."""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner
from conftest import charlm_pty, tiny_train

from charlm import checkpoint
from charlm.checkpoint import BEST, LAST
from charlm.cli import main
from charlm.config import ModelConfig
from charlm.data import bits_per_char
from charlm.train import Trainer
from charlm.views.runs import train_bpc

TEXT = "the cat sat on the mat, and the dog ran to the log.\n" * 60


def charlm(*args):
    return CliRunner().invoke(main, [str(a) for a in args], prog_name="charlm")


@pytest.fixture(scope="module")
def curves(tmp_path_factory):
    """Two runs with 6 evaluations each: a char Transformer and a char LSTM."""
    root = tmp_path_factory.mktemp("curves")
    corpus = root / "cats.txt"
    corpus.write_text(TEXT, encoding="utf-8")
    size = dict(n_layers=1, d_model=24, n_heads=2, context=24)
    for kind in ("transformer", "lstm"):
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("CHARLM_CACHE", str(root / "cache"))
            Trainer(corpus, ModelConfig(kind=kind, **size), tiny_train(30, eval_interval=5), root / kind).fit()
    return root


def metrics(run) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_one_run_piped_is_plain_characters(curves):
    r = charlm("plot", curves / "transformer", "--width", 70, "--height", 16)
    assert r.exit_code == 0 and r.stderr == ""
    out = r.stdout
    assert "\x1b" not in out  # piped: no escape codes at all
    lines = out.splitlines()
    assert len(lines) == 16 and max(map(len, lines)) <= 70
    assert "** train" in out and "++ val" in out  # the series told apart by their markers
    assert "bits/char" in out and "step" in out
    points = metrics(curves / "transformer")
    assert [p["step"] for p in points] == [5, 10, 15, 20, 25, 30]
    assert "30" in lines[-2]  # the last step is on the x axis


def test_several_runs_overlaid_loss_against_time(curves):
    r = charlm("plot", curves / "transformer", curves / "lstm" / BEST, "--y", "loss", "--x", "time")
    assert r.exit_code == 0
    for legend in ("** transformer train", "++ transformer val", "oo lstm train", "xx lstm val"):
        assert legend in r.stdout, legend
    assert "loss (nats/token)" in r.stdout and "training time" in r.stdout


def test_json_gives_the_numbers(curves):
    r = charlm("plot", curves / "transformer", curves / "lstm", "--json")
    data = json.loads(r.stdout)
    assert [d["run"] for d in data] == ["transformer", "lstm"]
    assert data[1]["evaluations"] == metrics(curves / "lstm")


def test_train_bits_per_char_uses_the_runs_characters_per_token(curves):
    """metrics.jsonl logs val bits/char but only the train loss: the plot derives train bits/char."""
    saved = checkpoint.read(curves / "lstm" / LAST)
    for point in metrics(curves / "lstm"):
        assert train_bpc(point) == pytest.approx(bits_per_char(point["train_loss"], saved.corpus.chars_per_token))


def test_same_names_are_told_apart_by_their_paths(curves, tmp_path):
    shutil.copytree(curves / "lstm", tmp_path / "transformer")
    r = charlm("plot", curves / "transformer", tmp_path / "transformer", "--json")
    assert [d["run"] for d in json.loads(r.stdout)] == [str(curves / "transformer"), str(tmp_path / "transformer")]


def test_bad_runs_are_one_line_errors(curves, tmp_path):
    for args, fragment in (
        ([tmp_path / "nowhere"], "no run directory"),
        ([tmp_path], "has no metrics.jsonl"),
        ([curves / "lstm", "--width", 10], "--width must be at least 30"),
    ):
        r = charlm("plot", *args)
        assert r.exit_code == 1 and r.stderr.startswith("error: ") and r.stderr.count("\n") == 1, r.output
        assert fragment in r.stderr
    r = charlm("plot")
    assert r.exit_code == 2 and "Usage: charlm plot" in r.stderr


def test_info_shows_the_curve(curves):
    r = charlm("info", curves / "lstm")
    assert r.exit_code == 0
    assert "bits/char while training" in r.stdout and "** train" in r.stdout and "++ val" in r.stdout
    assert "\x1b" not in r.stdout
    assert "bits/char while training" not in charlm("info", curves / "lstm", "--json").stdout


@pytest.mark.parametrize("no_color", [False, True])
def test_a_terminal_gets_colour_unless_no_color(curves, tmp_path, no_color):
    child = charlm_pty(tmp_path, "plot", curves / "transformer", env={"NO_COLOR": "1" if no_color else None})
    out = child.read()
    child.close()
    assert child.exitstatus == 0, out
    assert ("\x1b[" in out) is not no_color
    assert "train" in out and "val" in out
