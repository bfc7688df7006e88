"""`charlm train` and `charlm info` end to end: real runs on tiny models, resume, a real Ctrl-C in a
subprocess, and every bad input the issue lists, each a single line on stderr with nothing half-written."""

from __future__ import annotations

import ctypes
import json
import math
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from conftest import CITIZENS, TINY, cli, one_line_error, train_ok

from charlm.storage import checkpoint, runs
from charlm.storage.checkpoint import BEST, LAST, OLD_LAST
from charlm.training.trainer import Trainer


@pytest.fixture
def run(corpus, tmp_path) -> Path:
    """A finished 10-step run."""
    out = tmp_path / "run"
    train_ok(corpus, out, "--steps", 10, "--eval-interval", 5)
    return out


# ---- train and info -----------------------------------------------------------------------------


def test_train_writes_checkpoints_and_metrics_and_says_what_next(corpus, tmp_path):
    r = train_ok(corpus, tmp_path / "run", "--steps", 20, "--eval-interval", 10)
    assert r.stderr == ""
    out = r.stdout
    assert (
        "transformer (1 layer × 32, 2 heads, MLP ×3, QK-norm, smear, untied head, context 32)" in out
        and "char tokenizer" in out
    )
    assert "eval step 10:" in out and "eval step 20:" in out and "bits/char" in out
    assert "training done" in out and "20 (reached --steps)" in out
    assert f"charlm chat {tmp_path / 'run'}" in out
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [BEST, LAST, "metrics.jsonl"]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [10, 20]
    assert rows[1]["val_loss"] < math.log(len(set(CITIZENS)))  # it learned something in 20 steps


def test_info_on_a_run_directory_and_a_file(run):
    r = cli("info", run)
    assert r.exit_code == 0 and r.stderr == ""
    for text in (
        "transformer (1 layer × 32, 2 heads, MLP ×3, QK-norm, smear,",
        f"char, {len(set(CITIZENS))} tokens",
        "10 steps in",
        "nats/token",
        "bits/char",
        "citizens.txt (sha256",
        BEST,
    ):
        assert text in r.stdout, text
    assert r.stdout.count("…") == 1  # only the abbreviated hash: long values (the path) wrap, never cut off
    for target in (run, run / LAST):
        r = cli("info", target, "--json")
        assert r.exit_code == 0
        info = json.loads(r.stdout)
        assert {
            "model",
            "tokenizer",
            "vocab_size",
            "params",
            "steps",
            "train_seconds",
            "best_val_loss",
            "best_val_bpc",
        } <= info.keys()
        assert info["model"] == "transformer" and info["tokenizer"] == "char"
        assert info["vocab_size"] == len(set(CITIZENS)) and info["steps"] == 10
        assert info["params"] == sum(p.numel() for p in checkpoint.load(target).model.parameters())
        assert info["best_val_bpc"] == pytest.approx(info["best_val_loss"] / math.log(2))
        assert info["train_seconds"] > 0 and info["corpus"] == "citizens.txt"


def test_default_run_directory_is_numbered_not_clobbered(corpus, tmp_path, monkeypatch):
    """`charlm train CORPUS` with a time budget writes checkpoints/<corpus>-transformer-char/; a second
    run gets a -2 directory; --resume without --out continues the latest."""
    monkeypatch.chdir(tmp_path)
    first = cli("train", corpus.name, *TINY, "--max-time", "1s", "--sample-tokens", 40)
    assert first.exit_code == 0, first.output
    assert "saving to checkpoints/citizens-transformer-char" in first.stdout and "sample:" in first.stdout
    assert "--max-time ran out" in first.stdout
    one = tmp_path / "checkpoints" / "citizens-transformer-char"
    before = (one / LAST).read_bytes()
    second = cli("train", corpus.name, *TINY, "--steps", 3)
    assert second.exit_code == 0, second.output
    two = tmp_path / "checkpoints" / "citizens-transformer-char-2"
    assert checkpoint.load(two / LAST).saved.step == 3
    assert (one / LAST).read_bytes() == before
    third = cli("train", corpus.name, "--resume", "--steps", 5)
    assert third.exit_code == 0, third.output
    assert "resuming at step 3" in third.stdout
    assert checkpoint.load(two / LAST).saved.step == 5


def test_paths_are_shown_literally_never_as_markup(corpus, tmp_path):
    """Regression: run directories were printed as Rich markup, so '[draft]' vanished from the paths
    shown (and the suggested commands pointed elsewhere) and '[/x]' crashed the run."""
    for name in ("[draft] run", "[/x]"):  # the second is a directory "x]" inside a directory "["
        out = tmp_path / name
        r = train_ok(corpus, out, "--steps", 2)
        assert f"saving to {out}\n" in r.stdout and f"charlm chat '{out}'\n" in r.stdout
        info = cli("info", out)
        assert info.exit_code == 0 and info.stdout.startswith(out.name + " ")


def test_crlf_corpus_simply_works(tmp_path):
    crlf = tmp_path / "windows.txt"
    crlf.write_bytes(CITIZENS.replace("\n", "\r\n").encode("utf-8"))
    train_ok(crlf, tmp_path / "run", "--steps", 3)
    ckpt = checkpoint.load(tmp_path / "run")
    assert "\r" not in ckpt.tokenizer.decode(list(range(ckpt.tokenizer.vocab_size)))
    assert ckpt.tokenizer.vocab_size == len(set(CITIZENS))


# ---- resume -------------------------------------------------------------------------------------


def test_resume_continues_to_the_new_total(run, corpus):
    before = (run / "metrics.jsonl").read_text()
    r = cli("train", corpus, "--out", run, "--resume", "--steps", 20, "--eval-interval", 5)
    assert r.exit_code == 0, r.output
    assert "resuming at step 10" in r.stdout and "20 (reached --steps)" in r.stdout
    metrics = (run / "metrics.jsonl").read_text()
    assert metrics.startswith(before)
    assert [json.loads(line)["step"] for line in metrics.splitlines()] == [5, 10, 15, 20]
    assert checkpoint.read(run / LAST).step == 20


def test_resume_reads_last_pt_and_decides_once(run, corpus, monkeypatch):
    """Regression (issue 27): commands.train read the whole last.pt and applied the resume rule, then the
    Trainer did both again. Now resume.resume_run does it once and the Trainer takes its Resumed."""
    read, ruled = [], []
    real_read, real_rule = checkpoint.read, runs.resume_configs
    monkeypatch.setattr(
        checkpoint, "read", lambda path, *a, **kw: read.append(Path(path).name) or real_read(path, *a, **kw)
    )
    monkeypatch.setattr(runs, "resume_configs", lambda *a, **kw: ruled.append(1) or real_rule(*a, **kw))
    r = cli("train", corpus, "--out", run, "--resume", "--steps", 12, "--eval-interval", 6)
    assert r.exit_code == 0, r.output
    assert read == [LAST] and len(ruled) == 1
    assert real_read(run / LAST).step == 12


def test_resume_with_steps_after_a_timed_run(corpus, tmp_path):
    """Regression: a run trained with --max-time kept its time budget on `--resume --steps N`, so it
    stopped at once, as its time had already run out."""
    out = tmp_path / "run"
    train_ok(corpus, out, "--steps", 10**6, "--max-time", "0.5s")  # stopped by the clock
    reached = checkpoint.read(out / LAST).step
    r = cli("train", corpus, "--out", out, "--resume", "--steps", reached + 4)
    assert r.exit_code == 0, r.output
    saved = checkpoint.read(out / LAST)
    assert saved.step == reached + 4 and saved.train_config.max_time is None


# ---- bad input: one line each, nothing half-written ---------------------------------------------


def _latin1(tmp: Path) -> list:
    p = tmp / "latin1.txt"
    p.write_bytes(("Café crème, déjà vu.\n" * 200).encode("latin-1"))
    return ["train", p]


def _utf16(tmp: Path) -> list:
    p = tmp / "utf16.txt"
    p.write_bytes(("hello there\n" * 200).encode("utf-16"))
    return ["train", p]


def _binary(tmp: Path) -> list:
    p = tmp / "image.png"
    p.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 20)
    return ["train", p]


def _empty(tmp: Path) -> list:
    (tmp / "empty.txt").touch()
    return ["train", tmp / "empty.txt"]


def _short(tmp: Path) -> list:
    (tmp / "short.txt").write_text("To be, or not to be.\n" * 5)  # 105 chars: 10 % of it is < one window
    return ["train", tmp / "short.txt"]


def _dir(tmp: Path) -> list:
    (tmp / "adir").mkdir()
    return ["train", tmp / "adir"]


def _under_a_file(tmp: Path) -> list:
    (tmp / "afile").write_text("x")
    return ["train", tmp / "citizens.txt", "--out", tmp / "afile" / "run"]


def _one_char(tmp: Path) -> list:
    (tmp / "aaaa.txt").write_text("a" * 5000)
    return ["train", tmp / "aaaa.txt"]


def _out_is_a_file(tmp: Path) -> list:
    (tmp / "afile").write_text("x")
    return ["train", tmp / "citizens.txt", "--out", tmp / "afile"]


def plain(*args):
    return lambda tmp: ["train", tmp / "citizens.txt", *args]


BAD_INPUT = {
    "missing path": (lambda tmp: ["train", tmp / "nope.txt"], "no such file:"),
    "markup in the path": (lambda tmp: ["train", tmp / "[bold]x[/].txt"], "[bold]x[/].txt"),
    "a directory": (_dir, "is a directory"),
    "an empty file": (_empty, "is empty"),
    "shorter than a window": (_short, "corpus too short"),
    "binary": (_binary, "looks like a binary file"),
    "one distinct character": (_one_char, "holds a single distinct character: there is nothing to learn"),
    "latin-1": (_latin1, "is not UTF-8 text (invalid byte 0xe9 at offset 3)"),
    "utf-16": (_utf16, "is UTF-16 text, not UTF-8"),
    "heads do not divide": (plain("--d-model", 100, "--heads", 3), "--d-model 100 is not divisible by --heads 3"),
    "odd head size": (plain("--d-model", 6, "--heads", 2), "rope needs an even head size"),
    "zero steps": (plain("--steps", 0), "--steps must be between 1 and 10^12, got 0"),
    "negative lr": (plain("--lr", -1), "--lr must be a positive learning rate below 10, got -1"),
    "zero lr": (plain("--lr", 0), "--lr must be a positive learning rate below 10, got 0"),
    "zero batch": (plain("--batch-size", 0), "--batch-size must be at least 1, got 0"),
    "dropout 1.5": (plain("--dropout", 1.5), "--dropout must be in [0, 1), got 1.5"),
    "context 1": (plain("--context", 1), "--context must be between 2 and 65536, got 1"),
    "max-time abc": (plain("--max-time", "abc"), "--max-time: cannot read duration 'abc'"),
    "max-time 0": (plain("--max-time", "0s"), "--max-time: duration must be positive"),
    "negative weight decay": (plain("--weight-decay", -1), "--weight-decay must be at least 0"),
    "small bpe vocab": (plain("--tokenizer", "bpe", "--vocab-size", 100), "--vocab-size must be between 257"),
    "unwritable: under a file": (_under_a_file, "is a file, not a directory"),
    "unwritable: --out is a file": (_out_is_a_file, "afile is a file, not a directory"),
}
CLICK_ERRORS = {  # Click's own usage errors: exit code 2, still one line
    "unknown preset": (
        plain("--preset", "huge"),
        "Invalid value for '--preset': 'huge' is not one of 'tiny', 'small', 'medium'",
    ),
    "unknown model": (plain("--model", "rnn"), "Invalid value for '--model'"),
    "not a number": (plain("--layers", "two"), "'two' is not a valid integer"),
    "unknown option": (plain("--turbo"), "No such option '--turbo'"),
    "no corpus": (lambda tmp: ["train"], "Missing argument 'CORPUS'"),
}


@pytest.mark.parametrize("name", list(BAD_INPUT) + list(CLICK_ERRORS))
def test_bad_input_is_one_line_and_writes_nothing(corpus, tmp_path, name, monkeypatch):
    monkeypatch.chdir(tmp_path)
    make_args, message = BAD_INPUT.get(name) or CLICK_ERRORS[name]
    args = make_args(tmp_path)
    if "--out" not in args and len(args) > 1:
        args += ["--out", tmp_path / "out"]
    one_line_error(cli(*args), message, code=2 if name in CLICK_ERRORS else 1)
    assert not (tmp_path / "out").exists() and not (tmp_path / "checkpoints").exists()


def test_cuda_asked_but_absent(corpus, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    one_line_error(
        cli("train", corpus, "--device", "cuda", "--out", tmp_path / "out"),
        "--device cuda was asked for, but PyTorch sees no CUDA GPU",
    )
    assert not (tmp_path / "out").exists()


def _drop_root_file_powers():
    """Runs in the child before exec: without CAP_DAC_OVERRIDE even root obeys directory permissions."""
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
        if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def test_unwritable_output_directory(corpus, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    args = ["train", corpus, *TINY, "--steps", 2, "--out", locked / "run"]
    try:
        if os.geteuid() != 0:
            err = one_line_error(cli(*args), "is not writable")
        else:  # root writes anywhere: run the real command as root without that power
            try:
                proc = subprocess.run(
                    [sys.executable, "-m", "charlm", *map(str, args)],
                    capture_output=True,
                    text=True,
                    env={**os.environ, "OMP_NUM_THREADS": "1"},
                    preexec_fn=_drop_root_file_powers,
                    timeout=120,
                )
            except subprocess.SubprocessError as e:
                pytest.skip(f"cannot drop root's file permissions here ({e}); the non-root path covers this check")
            assert proc.returncode == 1, proc.stderr
            err = proc.stderr.strip()
            assert err.startswith("error: ") and "\n" not in err and "is not writable (permission is denied)" in err
        assert str(locked) in err
        assert list(locked.iterdir()) == []
    finally:
        locked.chmod(0o700)


RESUME_ERRORS = {  # the arguments after CORPUS, and what the error says
    "no checkpoint": (lambda run, tmp: ["--resume", "--out", tmp / "empty-run"], "--resume: no checkpoint at"),
    "no run to find": (
        lambda run, tmp: ["--resume"],
        f"--resume found no run checkpoints/citizens-transformer-char*/{LAST}",
    ),
    "other d-model": (
        lambda run, tmp: ["--resume", "--out", run, "--d-model", 64],
        "this run was trained with --d-model 32, not 64",
    ),
    "other model": (
        lambda run, tmp: ["--resume", "--out", run, "--model", "lstm"],
        "this run is a transformer, not a lstm",
    ),
    "other lr": (lambda run, tmp: ["--resume", "--out", run, "--lr", 0.5], "this run was trained with --lr"),
    "other switch": (  # a switch as it is typed, not "--smear True, not False"
        lambda run, tmp: ["--resume", "--out", run, "--no-smear"],
        "this run was trained with --smear, not --no-smear;",
    ),
    "other preset": (
        lambda run, tmp: ["--resume", "--out", run, "--preset", "small"],
        "this run was trained with --layers 1, not 6 (from --preset)",
    ),
    "other optimizer": (
        lambda run, tmp: ["--resume", "--out", run, "--optimizer", "adamw"],
        "trained with --optimizer muon, not adamw",
    ),
    "other tokenizer": (
        lambda run, tmp: ["--resume", "--out", run, "--tokenizer", "bpe"],
        "this run was trained with --tokenizer char",
    ),
    "already finished": (lambda run, tmp: ["--resume", "--out", run], "is already at step 10; give a larger --steps"),
    "steps not beyond": (lambda run, tmp: ["--resume", "--out", run, "--steps", 10], "is already at step 10"),
    "bad steps": (lambda run, tmp: ["--resume", "--out", run, "--steps", 0], "--steps must be between 1 and 10^12"),
    "a used dir without --resume": (lambda run, tmp: ["--out", run], "already holds a run: add --resume"),
}


@pytest.mark.parametrize("name", list(RESUME_ERRORS))
def test_resume_refusals(run, corpus, tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    make_args, message = RESUME_ERRORS[name]
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    one_line_error(cli("train", corpus, *make_args(run, tmp_path)), message)
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before
    assert not (tmp_path / "empty-run").exists()


def test_resume_with_another_text(run, tmp_path):
    other = tmp_path / "other.txt"
    other.write_text(CITIZENS.lower(), encoding="utf-8")
    before = (run / LAST).read_bytes()
    one_line_error(
        cli("train", other, "--out", run, "--resume", "--steps", 20),
        "other.txt is not the text this run was trained on",
    )
    assert (run / LAST).read_bytes() == before


def test_resume_from_a_damaged_checkpoint(run, corpus):
    (run / LAST).write_bytes((run / LAST).read_bytes()[:5000])
    one_line_error(cli("train", corpus, "--out", run, "--resume", "--steps", 20), "truncated or corrupt")


def test_divergence_is_one_line_and_keeps_the_checkpoint(run, corpus):
    """A run whose loss blows up: it stops at that step with a one-line error naming the weight that went
    bad, and last.pt stays exactly as it was."""
    saved = checkpoint.read(run / LAST)  # finite weights, so large that the next step overflows
    saved.model = {k: v * 1e36 if v.is_floating_point() else v for k, v in saved.model.items()}
    checkpoint.save(saved, run / LAST)
    before = (run / LAST).read_bytes()
    r = cli("train", corpus, "--out", run, "--resume", "--steps", 20)
    one_line_error(r, f"at step {saved.step + 1}", "training stopped, and the last good checkpoint in", "try a lower")
    assert (run / LAST).read_bytes() == before


def test_weights_that_hold_nan_or_inf_are_refused_everywhere(run, corpus, tmp_path):
    """Regression (issue 20): a checkpoint whose weights hold NaN loaded everywhere: sample printed
    'Thezzzz', eval said 'bits/char nan', info said nothing, all with exit 0. Now every command refuses
    it with one line naming the tensor, before any work (resume too)."""
    saved = checkpoint.read(run / LAST)
    for bad, name in ((float("nan"), "nan.pt"), (float("-inf"), "inf.pt")):
        saved.model = {**saved.model, "norm.weight": torch.full_like(saved.model["norm.weight"], bad)}
        checkpoint.save(saved, tmp_path / name)
        for args in (["info"], ["sample", "-n", "5"], ["eval", corpus], ["attn", "-p", "To be"]):
            one_line_error(
                cli(args[0], tmp_path / name, *args[1:]), "holds damaged weights: norm.weight has NaN or infinite"
            )
    run2 = tmp_path / "run2"
    run2.mkdir()
    (run2 / LAST).write_bytes((tmp_path / "nan.pt").read_bytes())
    one_line_error(cli("train", corpus, "--out", run2, "--resume", "--steps", 20), "norm.weight has NaN or infinite")


# ---- Ctrl-C, for real -----------------------------------------------------------------------------


def test_ctrl_c_saves_prints_the_resume_command_and_exits_130(corpus, tmp_path):
    """`charlm train` in its own process, interrupted with SIGINT once it is training: exit code 130,
    the resume command printed, last.pt saved at a step boundary. Resuming that file in this process
    gives exactly the weights of an uninterrupted run, and the CLI resume continues it."""
    out = tmp_path / "[draft] run"  # brackets and a space: printed literally, and quoted for the shell
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # log lines must flush by themselves
    env.update(OMP_NUM_THREADS="1", CHARLM_CACHE=str(tmp_path / "cache"))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "charlm",
            "train",
            str(corpus),
            *TINY,
            "--dropout",
            "0.1",
            "--steps",
            "1000000",
            "--eval-interval",
            "10",
            "--out",
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout] + [lines.put(None)], daemon=True).start()
    seen = []
    try:
        while True:
            line = lines.get(timeout=120)
            assert line is not None, "charlm train exited before training: " + "".join(seen) + proc.stderr.read()
            seen.append(line)
            if line.startswith("eval step 10:"):
                break
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
    while (line := lines.get(timeout=10)) is not None:
        seen.append(line)
    stdout, stderr = "".join(seen), proc.stderr.read()
    assert stderr == "" and "Traceback" not in stdout
    assert f"resume with: charlm train {corpus} --out '{out}' --resume" in stdout
    step = checkpoint.load(out / LAST).saved.step
    assert step >= 10 and f"interrupted at step {step}; saved {out}/{LAST}" in stdout

    # resumed in another process, the run continues exactly as one uninterrupted run would
    saved = checkpoint.read(out / LAST)
    model_cfg = saved.model_config
    train_cfg = checkpoint.load(out / LAST).train_config
    whole = Trainer(corpus, saved.model_config, train_cfg, tmp_path / "whole")
    whole.fit(until=step + 5)
    shutil.copytree(out, tmp_path / "resumed")  # keep `out` for the CLI resume below
    resumed = Trainer(corpus, model_cfg, train_cfg, tmp_path / "resumed", resume=True)
    resumed.fit(until=step + 5)
    for k, v in whole.model.state_dict().items():
        assert torch.equal(resumed.model.state_dict()[k], v), k

    r = cli("train", corpus, "--out", out, "--resume", "--steps", step + 3)
    assert r.exit_code == 0, r.output
    assert f"resuming at step {step}" in r.stdout
    assert checkpoint.read(out / LAST).step == step + 3


def test_info_says_what_it_skipped_of_a_damaged_metrics_file(old_pt, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / OLD_LAST).write_bytes(old_pt.read_bytes())
    row = {"step": 1, "train_loss": 2.0, "val_loss": 2.1, "val_bpc": 3.0, "elapsed": 0.1}
    (run / "metrics.jsonl").write_bytes(json.dumps(row).encode() + b"\n\xff torn")
    r = cli("info", run)
    assert r.exit_code == 0 and "please report" not in r.output, r.output
    assert r.stderr.strip() == f"skipped 1 unreadable line of {run / 'metrics.jsonl'}"


def test_a_flag_for_another_kind_of_model_is_not_silently_ignored(tmp_path, cmp_corpus):
    """Found: `--model lstm --heads 4` trained an LSTM without a word about --heads."""
    r = cli("train", cmp_corpus, *TINY, "--model", "lstm", "--heads", "4", "--steps", "2", "--out", tmp_path / "run")
    assert r.exit_code == 0, r.output
    assert "--heads applies to transformer runs only: ignored for this lstm run" in r.stderr
