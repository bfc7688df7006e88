"""Loss curves (issue 13, part 5): `charlm plot RUN...` draws train and val loss or bits/char against
steps or time from metrics.jsonl, one run or several overlaid; piped or under NO_COLOR it is plain
characters; --json gives the numbers; `charlm info` shows the curve too."""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner
from conftest import (
    charlm_pty,
    cli,
    tiny_train,
)

from charlm.cli import main
from charlm.config import ModelConfig
from charlm.data import bits_per_char
from charlm.storage import checkpoint, runs
from charlm.storage.checkpoint import BEST, LAST
from charlm.training.trainer import Trainer
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


def metrics_line(step: int) -> str:
    return json.dumps({"step": step, "train_loss": 2.0, "val_loss": 2.1, "val_bpc": 3.0, "elapsed": step / 10})


def test_plot_of_many_runs_keeps_its_legend(tmp_path):
    """Regression (item 22): `plot` with 9 or more runs dropped the legend without a word (plotext leaves it
    out when it does not fit inside the chart). It now follows the chart."""
    dirs = []
    for i in range(10):
        d = tmp_path / f"run{i:02d}"
        d.mkdir()
        (d / "metrics.jsonl").write_text("".join(metrics_line(s) + "\n" for s in (10, 20, 30)))
        dirs.append(d)
    r = cli("plot", *dirs)
    assert r.exit_code == 0, r.output
    for d in dirs:
        assert f"{d.name} val" in r.output and f"{d.name} train" in r.output


def test_a_huge_metrics_file_is_read_from_its_end_only(tmp_path):
    """Regression (item 22): a 400 MB metrics.jsonl made `info` and `plot` take 70 s and 3.3 GB. At most its
    last 16 MB are read (about 120,000 evaluations; a run writes ~20), and a note says so."""
    from charlm.storage import runs

    run = tmp_path / "run"
    run.mkdir()
    line = metrics_line(1) + "\n"
    with open(run / "metrics.jsonl", "w") as f:
        f.write(line * ((20 << 20) // len(line)))
    metrics = runs.read_metrics(run)
    assert 0 < len(metrics.rows) <= (16 << 20) // len(line) and metrics.skipped == 0
    assert "read only the last 16 MB" in metrics.note
    r = cli("plot", run)
    assert r.exit_code == 0 and "read only the last 16 MB" in r.output, r.output


def test_a_damaged_metrics_file_is_read_as_far_as_it_goes(tmp_path):
    """Issue 20's defect: a metrics.jsonl ending in a torn or binary line made info and plot say "unexpected
    UnicodeDecodeError ... please report it". read_metrics skips and counts what it cannot read."""
    good = [{"step": s, "train_loss": 2.0, "val_loss": 2.1, "val_bpc": 3.0, "elapsed": s / 10} for s in (10, 20)]
    lines = [json.dumps(r).encode() for r in good]
    (tmp_path / "metrics.jsonl").write_bytes(b"\n".join([lines[0], b"\xff\xfe binary", lines[1], b'{"step": 3'][:4]))
    m = runs.read_metrics(tmp_path)
    assert m.rows == good and m.skipped == 2
    assert m.note == f"skipped 2 unreadable lines of {tmp_path / 'metrics.jsonl'}"
    r = cli("plot", tmp_path, "--json")
    assert r.exit_code == 0 and [p["step"] for p in json.loads(r.stdout)[0]["evaluations"]] == [10, 20], r.output
    assert r.stderr.strip() == m.note  # said once, on stderr: the JSON on stdout stays JSON
    r = cli("plot", tmp_path)
    assert r.exit_code == 0 and "┤" in r.stdout and r.stderr.strip() == m.note


def test_a_validation_loss_of_zero_plots(tmp_path):
    """V1, found writing the metrics property: a val_loss of 0.0 (a text the model predicts exactly) made
    `plot` divide by zero turning the training loss into bits per character."""
    rows = [
        {"step": s, "train_loss": t, "val_loss": 0.0, "val_bpc": 0.0, "elapsed": s} for s, t in ((1, 0.5), (2, 0.0))
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = cli("plot", tmp_path, "--y", "bpc")
    assert r.exit_code == 0 and "┤" in r.stdout, r.output
