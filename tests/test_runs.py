"""Runs (issue 13, part 5): `charlm runs` lists the run directories newest first, as a table or JSON;
training names each silent phase, evaluates early without --eval-interval, says "train longer" when a
run has barely learned, and its summary's time adds up to the wait."""

from __future__ import annotations

import io
import itertools
import json
import math
import os
import re
import shutil
import time

import pytest
from click.testing import CliRunner
from conftest import TINY, TINY_MODEL, cli, tiny_train
from rich.console import Console

from charlm.cli import main
from charlm.config import ModelConfig
from charlm.settings import parse_duration
from charlm.storage import checkpoint, runs
from charlm.storage.checkpoint import BEST, LAST
from charlm.training.events import Phase
from charlm.training.trainer import Trainer
from charlm.views.progress import TrainView
from charlm.views.runs import age, duration, render_runs

TEXT = "the cat sat on the mat, and the dog ran to the log.\n" * 60


def charlm(*args):
    return CliRunner().invoke(main, [str(a) for a in args], prog_name="charlm")


@pytest.fixture
def folder(gen_runs, cmp_runs, tmp_path):
    """A folder of three real runs (a BPE one among them), oldest to newest: tf, bpe, lstm."""
    root = tmp_path / "runs"
    for i, (name, src) in enumerate((("tf", gen_runs["tf"]), ("bpe", cmp_runs["bpe"]), ("lstm", gen_runs["lstm"]))):
        shutil.copytree(src, root / name)
        os.utime(root / name / LAST, (time.time() - 3600 * (3 - i), time.time() - 3600 * (3 - i)))
    return root


def test_runs_table_newest_first(folder):
    r = charlm("runs", folder)
    assert r.exit_code == 0 and r.stderr == ""
    out = r.stdout
    assert out.index("lstm") < out.index("bpe") < out.index("\ntf")  # newest first
    assert "3 runs in" in out
    for name in ("tf", "bpe", "lstm"):
        saved = checkpoint.read(folder / name / LAST)
        row = out[out.index(f"\n{name} ") :].split("\n")[1]
        assert f"{saved.params / 1e6:.2f}M" in row and f"{saved.step:,}" in row and f"{saved.best_val_bpc:.3f}" in row
        assert saved.model_config.kind in row
    assert "1h ago" in out and "3h ago" in out
    assert out.count("corpus.txt") == 3  # the corpus each run was trained on


def test_runs_json_and_one_run_directory(folder):
    r = charlm("runs", folder, "--json")
    rows = json.loads(r.stdout)
    assert [row["run"] for row in rows] == ["lstm", "bpe", "tf"]
    bpe = rows[1]
    saved = checkpoint.read(folder / "bpe" / LAST)
    assert bpe["tokenizer"] == "bpe" and bpe["model"] == "transformer" and bpe["steps"] == saved.step
    assert bpe["best_val_bpc"] == saved.best_val_bpc and bpe["params"] == saved.params and bpe["corpus"] == "corpus.txt"
    assert {"path", "train_seconds", "modified", "layers", "d_model", "vocab_size"} <= bpe.keys()
    assert [row["run"] for row in json.loads(charlm("runs", folder / "tf", "--json").stdout)] == ["tf"]


def test_runs_defaults_to_checkpoints_and_says_when_there_are_none(folder, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = charlm("runs")
    assert (
        r.exit_code == 1 and r.stderr.startswith("error: no checkpoints/ folder here yet") and r.stderr.count("\n") == 1
    )
    (tmp_path / "checkpoints").mkdir()
    r = charlm("runs")
    assert r.exit_code == 0 and r.stdout == "" and "no runs in checkpoints" in r.stderr
    assert charlm("runs", "--json").stdout.strip() == "[]"
    shutil.move(folder / "tf", tmp_path / "checkpoints" / "tf")
    assert "1 run in checkpoints" in charlm("runs").stdout
    r = charlm("runs", tmp_path / "nowhere")
    assert r.exit_code == 1 and r.stderr.startswith("error: no directory") and r.stderr.count("\n") == 1


def test_a_damaged_run_is_a_row_not_a_crash(folder):
    (folder / "bpe" / LAST).write_bytes(b"not a checkpoint")
    r = charlm("runs", folder)
    assert r.exit_code == 0
    out = "".join(r.stdout.split())  # the message folds in the run column
    assert "notacharlmcheckpoint" in out and "unreadable" in out and "lstm" in out and "tf" in out
    rows = {row["run"]: row for row in json.loads(charlm("runs", folder, "--json").stdout)}
    assert "not a charlm checkpoint" in rows["bpe"]["error"] and "error" not in rows["tf"]


def test_runs_table_fits_60_columns_with_every_column(folder):
    console = Console(file=io.StringIO(), width=60)
    render_runs(console, [runs.describe(p) for p in runs.find_runs(folder)], "3 runs")
    out = console.file.getvalue()
    assert max(len(line) for line in out.splitlines()) <= 60
    for header in ("run", "model", "params", "steps", "time", "bits/", "when"):
        assert header in out, header


def test_runs_table_uses_120_columns_one_line_a_run(folder):
    """Issue 37: at 120 columns the header still wrapped over three lines (val / bits/ / char) and each run
    took two. Where the width allows, a run is one line and every header one word or two."""
    console = Console(file=io.StringIO(), width=120)
    render_runs(console, [runs.describe(p, folder) for p in runs.find_runs(folder)], "3 runs")
    lines = console.file.getvalue().splitlines()
    assert max(len(line) for line in lines) <= 120
    header = lines[1].split()
    assert header == ["run", "corpus", "model", "size", "params", "steps", "time", "val", "bits/char", "when"]
    assert len(lines) == 3 + 3 and [line.split()[0] for line in lines[3:]] == ["lstm", "bpe", "tf"]


def test_age_and_duration():
    assert [age(s) for s in (5, 61, 3 * 3600 + 5, 2 * 86400)] == ["now", "1m ago", "3h ago", "2d ago"]
    assert [duration(s) for s in (44.6, 120.2, 3900)] == ["45s", "2m00s", "1h05m"]


# ---- training: phases, early evaluation, "train longer", the summary's time ---------------------


def test_the_live_bar_names_each_phase(tmp_path):
    """The bar's label says what the run is doing between steps (it sat silent before)."""
    corpus = tmp_path / "c.txt"
    corpus.write_text(TEXT, encoding="utf-8")
    events = []
    console = Console(file=io.StringIO(), force_terminal=True, width=100)
    view = TrainView(console)
    labels = []

    def on_event(e):
        events.append(e)
        view(e)
        if view.train_task is not None:
            labels.append(view.progress.tasks[view.train_task].description)

    cfg = tiny_train(4, sample_tokens=10, eval_interval=2)
    trainer = Trainer(
        corpus, ModelConfig(n_layers=1, d_model=16, n_heads=2, context=16), cfg, tmp_path / "run", on_event=on_event
    )
    view.finish(trainer.fit())
    phases = [e.name for e in events if isinstance(e, Phase)]
    assert phases[:3] == ["evaluating", "saving", "sampling"]  # one evaluation: loss, checkpoint, sample
    assert {"training", "evaluating", "saving", "sampling"} <= set(labels)
    assert labels[labels.index("evaluating") + 1 :].count("training") >= 1  # the next step says training again


@pytest.mark.parametrize("live", [True, False])
def test_progress_shows_from_the_first_step_before_the_first_evaluation(tmp_path, live):
    """Issue 37: the first progress came with the first evaluation (57 s of an empty bar on a loaded machine;
    a log printed nothing until step 50). The bar says it is at its first step, then shows step 1's loss; a
    log has a line for step 1; both before the first evaluation."""
    from charlm.training.events import Evaluated, Started, Stepped
    from charlm.views.progress import FIRST_STEP

    corpus = tmp_path / "c.txt"
    corpus.write_text(TEXT, encoding="utf-8")
    console = Console(file=io.StringIO(), force_terminal=live, width=100)
    view = TrainView(console, log_every=50)
    seen = []  # (event, the bar's words after it, or the log so far)

    def on_event(e):
        view(e)
        if not live:
            shown = console.file.getvalue()
        else:
            shown = None if view.train_task is None else view.progress.tasks[view.train_task].fields["info"]
        seen.append((type(e), shown))

    cfg = tiny_train(6, sample_tokens=0, eval_interval=3)
    trainer = Trainer(
        corpus, ModelConfig(n_layers=1, d_model=16, n_heads=2, context=16), cfg, tmp_path / "run", on_event=on_event
    )
    view.finish(trainer.fit())
    kinds = [kind for kind, _ in seen]
    first_eval = kinds.index(Evaluated)
    assert kinds.index(Stepped) < first_eval
    after_started, after_step_1 = seen[kinds.index(Started)][1], seen[kinds.index(Stepped)][1]
    if live:
        assert after_started == FIRST_STEP and after_step_1.startswith("step 1 · loss ")
    else:
        assert re.search(r"^step 1 · loss \d\.\d{3} · [\d,]+ tok/s · ", after_step_1, re.M), after_step_1
        assert "eval" not in after_step_1


def test_without_eval_interval_the_first_evaluation_comes_early(tmp_path):
    """Regression: with the old default of every 250 steps, a short run showed no validation loss until
    its end. Now the first comes after 5% of the budget, and the next at least 5% apart."""
    corpus = tmp_path / "c.txt"
    corpus.write_text(TEXT, encoding="utf-8")
    cfg = tiny_train(60, eval_interval=None)
    Trainer(corpus, ModelConfig(n_layers=1, d_model=16, n_heads=2, context=16), cfg, tmp_path / "run").fit()
    steps = [json.loads(line)["step"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    # (how many come between depends on what an evaluation costs against a step: at most ~5% of the time)
    assert steps[0] == 3 and steps[-1] == 60
    assert all(b - a >= 3 for a, b in itertools.pairwise(steps[:-1]))  # (the last one closes the run, always)


def test_a_timed_run_shows_a_validation_loss_before_its_end(tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text(TEXT, encoding="utf-8")
    cfg = tiny_train(10**9, eval_interval=None, max_time=4.0)
    Trainer(corpus, ModelConfig(n_layers=1, d_model=16, n_heads=2, context=16), cfg, tmp_path / "run").fit()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) >= 2 and rows[0]["step"] < rows[-1]["step"] and rows[-1]["elapsed"] >= 4.0


def test_a_run_too_short_to_learn_says_train_longer_and_the_time_adds_up(tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text(TEXT, encoding="utf-8")
    t0 = time.perf_counter()
    r = charlm("train", corpus, *TINY, "--out", tmp_path / "run", "--steps", 2)
    waited = time.perf_counter() - t0
    assert r.exit_code == 0, r.output
    out = " ".join(r.stdout.replace("│", " ").split())  # the summary table's cells wrap
    assert "train longer:" in out and f"--out {tmp_path / 'run'} --resume --max-time" in out
    m = re.search(
        r"time (\S+) training, evaluations included · (\S+) in all: (\S+) to set up and "
        r"encode, (\S+) for the last evaluation and sample",
        out,
    )
    assert m, out
    # as views.text.duration wrote them ('0.0s' too: parse_duration takes only a budget, above 0)
    training, total, setup, after = (0.0 if d == "0.0s" else parse_duration(d) for d in m.groups())
    rounding = sum(0.05 if "." in d else 0.5 for d in m.groups())  # 9.7s to a tenth, 12s to a second
    assert total == pytest.approx(training + setup + after, abs=rounding + 0.05) and total <= waited + 0.5
    assert training == pytest.approx(checkpoint.read(tmp_path / "run" / LAST).train_seconds, abs=0.5)


def test_a_run_that_learned_gives_the_usual_hints_only(tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text(TEXT, encoding="utf-8")
    r = charlm(
        "train",
        corpus,
        *TINY,
        "--lr",
        "0.01",
        "--steps",
        60,
        "--out",
        tmp_path / "run",
    )
    assert r.exit_code == 0, r.output
    best = checkpoint.read(tmp_path / "run" / BEST).best_val_loss
    assert best < 0.6 * math.log(len(set(TEXT)))
    assert "train longer" not in r.stdout and "try next:" in r.stdout


@pytest.mark.parametrize("load,busy", [(1.0, False), (2.9, False), (9.0, True)])
def test_the_summary_says_when_a_busy_cpu_slowed_the_run(tmp_path, monkeypatch, load, busy):
    """Issue 19: a first run on a busy machine gave 3.12 bits/char and left the user to wonder why. The
    summary now says the CPU was busy (the median load over the steps, against the cores this process may
    use), with the speed the run got."""
    from charlm.training.events import Result, Started, Stepped

    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1}, raising=False)
    console = Console(file=io.StringIO(), width=100)
    view = TrainView(console)
    cfg = tiny_train(50)
    view(Started(out_dir=tmp_path, device="cpu", params=1000, model_config=ModelConfig(vocab_size=10), train_config=cfg,
                 start_step=0, train_tokens=1000, val_tokens=100, vocab_size=10))  # fmt: skip
    for step in range(1, 21):
        view(Stepped(step=step, loss=2.0, lr=1e-3, tokens_per_s=5000.0, elapsed=step / 10, load=load))
    view.finish(Result(out_dir=tmp_path, step=20, stopped="steps", train_seconds=2.0, best_val_loss=None,
                       best_val_bpc=None, last_val_loss=None, params=1000))  # fmt: skip
    out = " ".join(console.file.getvalue().split())
    assert "5,000 tokens/s" in out
    assert ("the CPU was busy: load 9.0 on 2 cores, so this run had about 22% of it" in out) == busy, out


def test_a_run_much_slower_than_this_machine_usually_trains_says_so(tmp_path):
    """Issue 19 §3, measured: with one of two cores busy, the first run trained at 3,179 tokens/s against
    10,586 quiet, and the load note did not fire (load 2.7: the 1-minute average lags, and counts the run's
    own threads). The summary compares the run's speed with the fastest this machine trained the same set-up."""
    from charlm.storage.runs import usual_speed
    from charlm.training.events import Result

    speeds = tmp_path / "speeds.json"
    assert usual_speed("a", 10_000.0, speeds) is None  # the first time: nothing to compare with
    assert usual_speed("a", 3_000.0, speeds) == 10_000.0 and usual_speed("a", 12_000.0, speeds) == 10_000.0
    assert usual_speed("a", None, speeds) == 12_000.0 and usual_speed("b", 5.0, speeds) is None  # per set-up
    for damaged in (b"\xff{", b"[1, 2]", b'{"a": "fast"}', b'{"a": NaN}'):
        speeds.write_bytes(damaged)
        assert usual_speed("a", 7.0, speeds) is None and usual_speed("a", 1.0, speeds) == 7.0

    def summary(now, usual):
        console = Console(file=io.StringIO(), width=100)
        TrainView(console).finish(Result(out_dir=tmp_path, step=20, stopped="time", train_seconds=120.0,
                                         best_val_loss=None, best_val_bpc=None, last_val_loss=None, params=1000,
                                         tokens_per_s=now, usual_tokens_per_s=usual))  # fmt: skip
        return " ".join(console.file.getvalue().split())

    slow = "this run trained at 3,179 tokens/s, 3.3x slower than this machine has trained the same model before"
    assert slow in summary(3_179.0, 10_586.0)
    for now, usual in ((9_000.0, 10_586.0), (3_179.0, None), (None, 10_586.0)):
        assert "slower than this machine" not in summary(now, usual)


def test_training_records_its_speed_in_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CHARLM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr("charlm.commands.train.SPEED_STEPS", 2)  # (50 steps in use: a short run's is noise)
    corpus = tmp_path / "c.txt"
    corpus.write_text(TEXT, encoding="utf-8")
    for k in (1, 2):
        r = cli("train", corpus, *TINY_MODEL, "--steps", "3", "--out", tmp_path / f"run{k}", "--device", "cpu")
        assert r.exit_code == 0, r.output
    speeds = json.loads((tmp_path / "cache" / "speeds.json").read_text())
    ((key, best),) = speeds.items()  # one set-up, both runs
    assert "threads" in key and "batch" in key and best > 0


def test_every_run_charlm_writes_is_listed_and_opens_by_name(gen_runs, tmp_path, monkeypatch):
    """Issue 37: a compressed run (compress --to checkpoints/NAME writes best.pt only) and lab runs (in
    checkpoints/lab/) were missing from `charlm runs`, and `charlm sample tt-int8` said "no such checkpoint"."""
    from charlm.lab.training import LAB_DIR

    monkeypatch.chdir(tmp_path)
    shutil.copytree(gen_runs["tf"], "checkpoints/tt")
    shutil.copytree(gen_runs["lstm"], LAB_DIR / "copy-lstm-s0")  # where `charlm lab` trains its models
    r = charlm("compress", "tt", "--to", "checkpoints/tt-int8", "--bits", "8", "--tokens", "256")
    assert r.exit_code == 0, r.output
    rows = json.loads(charlm("runs", "--json").stdout)
    assert sorted(row["run"] for row in rows) == ["lab/copy-lstm-s0", "tt", "tt-int8"]
    assert all("error" not in row for row in rows)
    table = charlm("runs").stdout
    assert "3 runs in checkpoints" in table and "tt-int8" in table and "lab/copy-lstm-s0" in table
    for name in ("tt-int8", "copy-lstm-s0", "lab/copy-lstm-s0", "lab/copy"):
        r = charlm("sample", name, "-p", "ROMEO:", "-n", "10", "--seed", "1")
        assert r.exit_code == 0 and r.stdout.strip(), (name, r.output)
    assert "int8" in charlm("info", "tt-int8").stdout
    r = charlm("sample", "t", "-n", "5")  # two runs start with it: say which
    assert r.exit_code != 0 and "could be 2 runs" in r.stderr and "tt-int8" in r.stderr


def test_a_link_to_a_run_is_listed_and_a_link_loop_is_not_followed(gen_runs, tmp_path):
    """The listing walks checkpoints/ at any depth (compressed and lab runs); a link to a run directory is
    still listed, as the old one-level listing did, and a link back to a parent is never walked."""
    shutil.copytree(gen_runs["lstm"], tmp_path / "elsewhere" / "kept")
    root = tmp_path / "checkpoints"
    shutil.copytree(gen_runs["tf"], root / "deep" / "er" / "tf")
    (root / "linked").symlink_to(tmp_path / "elsewhere" / "kept")
    (root / "deep" / "loop").symlink_to(root)
    assert sorted(runs.run_name(p, root) for p in runs.find_runs(root)) == ["deep/er/tf", "linked"]
