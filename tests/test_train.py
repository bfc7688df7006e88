"""The trainer: exact resume (N + N steps == 2N steps, bit for bit), Ctrl-C (a real SIGINT) saving a
resumable checkpoint, divergence keeping the last good checkpoint, budgets, events and metrics."""

from __future__ import annotations

import json
import math
import os
import signal
from pathlib import Path

import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from charlm import files
from charlm.config import ModelConfig, SampleConfig, TrainConfig
from charlm.data import CorpusError
from charlm.errors import CheckpointError, ConfigError
from charlm.generate import Streamer
from charlm.storage import checkpoint
from charlm.storage.checkpoint import BEST, LAST
from charlm.training.events import Evaluated, Started, Stepped, TrainingDiverged, TrainingInterrupted
from charlm.training.schedule import lr_at
from charlm.training.trainer import Trainer

TEXT = "But soft, what light through yonder window breaks?\nIt is the east, and Juliet is the sun.\n" * 30


@pytest.fixture
def corpus(tmp_path) -> Path:
    path = tmp_path / "juliet.txt"
    path.write_text(TEXT, encoding="utf-8")
    return path


def make(corpus, out, kind="transformer", dropout=0.0, resume=False, on_event=None, **train) -> Trainer:
    model_cfg = ModelConfig(
        kind=kind, n_layers=2 if kind != "transformer" else 1, d_model=32, n_heads=2, context=16, dropout=dropout
    )
    train_cfg = TrainConfig(
        **{
            **dict(
                steps=16, batch_size=4, lr=1e-2, warmup=3, eval_interval=5, eval_iters=2, sample_tokens=0, device="cpu"
            ),
            **train,
        }
    )
    return Trainer(corpus, model_cfg, train_cfg, out, resume=resume, on_event=on_event)


def weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def assert_bit_identical(a, b, where: str = "") -> None:
    """Nested dicts/lists of tensors and plain values, equal to the last bit."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            assert_bit_identical(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_bit_identical(x, y, f"{where}/{i}")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), f"{where} differs"
    else:
        assert a == b, where


# ---- exact resume -------------------------------------------------------------------------------


RESUME_CASES = [  # kind, dropout, other training settings
    ("transformer", 0.0, {}),
    ("transformer", 0.1, {}),
    ("transformer", 0.1, {"optimizer": "adamw", "grad_accum": 2}),
    ("lstm", 0.1, {}),
    ("gru", 0.0, {"optimizer": "adamw"}),
]


@pytest.mark.parametrize("kind,dropout,train", RESUME_CASES, ids=lambda v: str(v) if v != {} else "-")
def test_resume_gives_the_same_weights_as_one_run(corpus, tmp_path, kind, dropout, train):
    """N steps, a brand-new Trainer resuming from disk, N more steps == 2N steps in one go, bit for bit.
    With dropout the global torch RNG must be restored too (a new Trainer reseeds it)."""
    whole = make(corpus, tmp_path / "whole", kind, dropout, **train)
    whole.fit()
    first = make(corpus, tmp_path / "split", kind, dropout, **train)
    first.fit(until=8)  # 8 is between evaluations: `until` saves anyway
    halfway = weights(first.model)
    second = make(corpus, tmp_path / "split", kind, dropout, resume=True, **train)
    assert second.step == 8
    assert_bit_identical(weights(second.model), halfway)
    result = second.fit()
    assert result.step == 16 and result.stopped == "steps"
    assert_bit_identical(weights(second.model), weights(whole.model))
    assert not torch.equal(halfway[next(iter(halfway))], weights(whole.model)[next(iter(halfway))])
    # the optimizer state matches as well, so a third session would continue identically too
    assert_bit_identical(second.optimizer.state_dict(), whole.optimizer.state_dict())


def test_resume_restores_the_dropout_rng(corpus, tmp_path):
    """The equality above is not luck: resuming with the wrong dropout RNG state gives other weights."""
    whole = make(corpus, tmp_path / "whole", dropout=0.1)
    whole.fit()
    make(corpus, tmp_path / "split", dropout=0.1).fit(until=8)
    second = make(corpus, tmp_path / "split", dropout=0.1, resume=True)
    torch.manual_seed(12345)  # what a resume without the saved RNG state would run with
    second.fit()
    assert any(not torch.equal(a, b) for a, b in zip(weights(second.model).values(), weights(whole.model).values()))


def test_metrics_log_continues_across_a_resume(corpus, tmp_path):
    make(corpus, tmp_path / "run").fit(until=8)
    make(corpus, tmp_path / "run", resume=True).fit()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [5, 8, 10, 15, 16]
    assert all(
        math.isfinite(r["val_loss"]) and r["val_bpc"] == pytest.approx(r["val_loss"] / math.log(2)) for r in rows
    )
    elapsed = [r["elapsed"] for r in rows]
    assert elapsed == sorted(elapsed)  # time trained accumulates across sessions
    last = checkpoint.read(tmp_path / "run" / LAST)
    assert last.step == 16 and last.best_val_loss == min(r["val_loss"] for r in rows)


# ---- Ctrl-C -------------------------------------------------------------------------------------


def test_sigint_saves_at_a_step_boundary_and_resumes_exactly(corpus, tmp_path):
    """A real SIGINT arriving inside a step, just after optimizer.step(). Regression: the
    KeyboardInterrupt used to surface right there and the save recorded the new weights with the old
    step count, so the resumed run repeated a step. Now the step finishes, last.pt is saved at it,
    TrainingInterrupted is raised, the default handler is back, and resuming matches one run."""
    whole = make(corpus, tmp_path / "whole", dropout=0.1)
    whole.fit()

    armed = []

    def arm_after_step_5(event):
        if isinstance(event, Stepped) and event.step == 5:
            armed.append(True)

    def interrupt_in_step_6(optimizer, args, kwargs):  # after the first optimizer's step in step 6
        if armed and armed.pop():
            os.kill(os.getpid(), signal.SIGINT)

    run = make(corpus, tmp_path / "run", dropout=0.1, on_event=arm_after_step_5)
    hook = register_optimizer_step_post_hook(interrupt_in_step_6)  # every optimizer, whatever the wrapper
    try:
        with pytest.raises(TrainingInterrupted) as e:
            run.fit()
    finally:
        hook.remove()
    assert e.value.result.step == 6 and e.value.result.stopped == "interrupted"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert checkpoint.read(tmp_path / "run" / LAST).step == 6
    resumed = make(corpus, tmp_path / "run", dropout=0.1, resume=True)
    resumed.fit()
    assert_bit_identical(weights(resumed.model), weights(whole.model))


def test_second_sigint_stops_at_once(corpus, tmp_path):
    def two_interrupts(event):
        if isinstance(event, Stepped) and event.step == 2:
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(TrainingInterrupted) as e:
        make(corpus, tmp_path / "run", on_event=two_interrupts).fit()
    assert not (tmp_path / "run" / LAST).exists()  # nothing half-done was saved
    assert e.value.result.step == 2 and e.value.saved_step is None  # and the exception says so
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


class Killed(BaseException):
    """The process dies here: nothing after it runs (BaseException: no handler in charlm catches it)."""


def metric_rows(run: Path) -> list[dict]:
    log = run / "metrics.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_a_kill_between_any_two_writes_leaves_files_that_agree(corpus, tmp_path, monkeypatch):
    """Regression: last.pt (recording the new best value) was written before best.pt; a kill between the
    two left best.pt one evaluation behind and, since best.pt is only rewritten when a later evaluation
    beats the recorded value, the best weights lost for good. Here the process dies right after each
    write of a run in turn (every checkpoint and every metrics line): the files on disk always agree
    (best.pt never behind last.pt's record, every evaluation up to last.pt logged once), and the
    resumed run ends with exactly the files of a run never killed."""
    whole = make(corpus, tmp_path / "whole", steps=12, eval_interval=3)
    whole.fit()
    want_rows = [(r["step"], r["val_loss"]) for r in metric_rows(tmp_path / "whole")]
    real_save, real_append = checkpoint.save, files.append_line
    writes = []

    def counted(write):
        def wrapper(*args):
            write(*args)
            writes.append(args[1])
            if len(writes) == kill_at:
                raise Killed

        return wrapper

    monkeypatch.setattr(checkpoint, "save", counted(real_save))
    monkeypatch.setattr(files, "append_line", counted(real_append))
    kill_at, total = 0, None
    while total is None or kill_at < total:
        kill_at += 1
        writes.clear()
        run = tmp_path / f"killed-{kill_at}"
        try:
            make(corpus, run, steps=12, eval_interval=3).fit()
            total = len(writes)  # no kill: the number of writes of a whole run
            continue
        except Killed:
            pass
        if not (run / LAST).exists():  # killed before the first commit: a new run starts over
            make(corpus, run, steps=12, eval_interval=3).fit()
        else:
            last = checkpoint.read(run / LAST)
            best = checkpoint.read(run / BEST)
            assert best.best_val_loss <= last.best_val_loss, f"{BEST} is behind {LAST} after write {kill_at}"
            logged = [(r["step"], r["val_loss"]) for r in metric_rows(run) if r["step"] <= last.step]
            assert logged == [row for row in want_rows if row[0] <= last.step], kill_at
            assert min(v for _, v in logged) == last.best_val_loss
            if last.step < 12:  # (killed after its very last write, the run is complete)
                make(corpus, run, steps=12, eval_interval=3, resume=True).fit()
        assert [(r["step"], r["val_loss"]) for r in metric_rows(run)] == want_rows, kill_at
        for name in (BEST, LAST):
            assert_bit_identical(
                checkpoint.read(run / name).model, checkpoint.read(tmp_path / "whole" / name).model, name
            )
    assert total >= 8  # 4 evaluations: best.pt (when better), a metrics line and last.pt each


# ---- divergence ---------------------------------------------------------------------------------


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(corpus, tmp_path):
    """The message names the weight gone bad in the words a load of it would use (issue 20)."""
    run = make(corpus, tmp_path / "run")
    run.fit(until=5)
    last, best = (tmp_path / "run" / LAST).read_bytes(), (tmp_path / "run" / BEST).read_bytes()
    metrics = (tmp_path / "run" / "metrics.jsonl").read_text()
    with torch.no_grad():
        run.model.blocks[0].mlp.fc.weight.fill_(float("nan"))  # the weights blow up
    with pytest.raises(
        TrainingDiverged,
        match=r"the loss became nan at step 6 \(blocks\.0\.mlp\.fc\.weight has NaN or infinite values\): training "
        r"stopped, and the last good "
        r"checkpoint in .*run was kept; try a lower --lr \(now 0.01\)",
    ):
        run.fit()
    assert (tmp_path / "run" / LAST).read_bytes() == last
    assert (tmp_path / "run" / BEST).read_bytes() == best
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == metrics
    assert math.isfinite(checkpoint.load(tmp_path / "run").model(torch.zeros(1, 4, dtype=torch.long))[0].sum().item())


def test_infinite_gradient_norm_stops_before_the_weights_are_touched(corpus, tmp_path):
    """Regression: a finite loss whose gradient norm overflowed went on: clipping scaled the gradients
    to zero, AdamW still moved the weights, and the next evaluation saved the diverged model as last.pt."""
    run = make(corpus, tmp_path / "run")
    run.fit(until=5)
    last = (tmp_path / "run" / LAST).read_bytes()
    with torch.no_grad():
        run.model.norm.weight.fill_(1e30)  # logits ~1e29: the loss is finite, the squared gradients are not
    before = weights(run.model)
    with pytest.raises(TrainingDiverged, match=r"the gradient norm became inf \(loss .*e\+\d\d\) at step 6"):
        run.fit()
    assert_bit_identical(weights(run.model), before)
    assert (tmp_path / "run" / LAST).read_bytes() == last


def test_divergence_before_any_checkpoint_leaves_nothing_behind(corpus, tmp_path):
    run = make(corpus, tmp_path / "run")
    with torch.no_grad():
        run.model.tok_emb.weight.fill_(float("inf"))
    with pytest.raises(
        TrainingDiverged,
        match=r"at step 1 \(tok_emb.weight has NaN or infinite values\): training "
        r"stopped, and nothing was saved",
    ):
        run.fit()
    assert not (tmp_path / "run").exists()


# ---- budgets, events, refusals ------------------------------------------------------------------


def test_time_budget_stops_the_run_and_saves(corpus, tmp_path):
    result = make(corpus, tmp_path / "run", steps=1_000_000, max_time=0.5).fit()
    assert result.stopped == "time" and 0.5 <= result.train_seconds < 30
    assert checkpoint.read(tmp_path / "run" / LAST).step == result.step > 0


def test_lr_schedule():
    cfg = TrainConfig(steps=110, lr=1e-2, warmup=10, min_lr_ratio=0.1)
    assert lr_at(cfg, 0, 0) == pytest.approx(1e-3)  # warmup starts above zero
    assert lr_at(cfg, 9, 0) == pytest.approx(1e-2)
    assert lr_at(cfg, 60, 0) == pytest.approx(0.55e-2)  # halfway through the cosine
    assert lr_at(cfg, 110, 0) == pytest.approx(1e-3)
    timed = TrainConfig(steps=10**9, max_time=100, lr=1e-2, warmup=10)
    assert lr_at(timed, 50, 50) == pytest.approx(0.55e-2)  # with a time budget, the clock drives the decay


def test_events(corpus, tmp_path):
    events = []
    make(corpus, tmp_path / "run", on_event=events.append, steps=10).fit()
    started = [e for e in events if isinstance(e, Started)]
    stepped = [e.step for e in events if isinstance(e, Stepped)]
    evaluated = [e for e in events if isinstance(e, Evaluated)]
    assert len(started) == 1 and started[0].start_step == 0 and started[0].params > 0
    assert stepped == list(range(1, 11))
    assert [e.step for e in evaluated] == [5, 10] and evaluated[0].is_best
    assert all(isinstance(e, Stepped) and math.isfinite(e.loss) for e in events if isinstance(e, Stepped))
    resumed = []
    make(corpus, tmp_path / "run", on_event=resumed.append, steps=12, resume=True).fit()
    assert next(e for e in resumed if isinstance(e, Started)).start_step == 10


def test_resume_refuses_another_text(corpus, tmp_path):
    make(corpus, tmp_path / "run").fit(until=2)
    other = tmp_path / "other.txt"
    other.write_text(TEXT.upper(), encoding="utf-8")
    with pytest.raises(ConfigError, match="other.txt is not the text this run was trained on"):
        make(other, tmp_path / "run", resume=True)


def test_resume_refuses_another_model_config(corpus, tmp_path):
    """Regression: the Trainer trusted the caller's config and failed deep in load_state_dict."""
    make(corpus, tmp_path / "run").fit(until=2)
    model_cfg = ModelConfig(n_layers=1, d_model=64, n_heads=2, context=16)
    train_cfg = TrainConfig(steps=16, batch_size=4, device="cpu", sample_tokens=0)
    with pytest.raises(ConfigError, match=r"this run was trained with --d-model 32, not 64"):
        Trainer(corpus, model_cfg, train_cfg, tmp_path / "run", resume=True)


def test_resume_without_or_with_a_broken_checkpoint(corpus, tmp_path):
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        make(corpus, tmp_path / "nothing", resume=True)
    make(corpus, tmp_path / "run").fit(until=2)
    last = tmp_path / "run" / LAST
    last.write_bytes(last.read_bytes()[:1000])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        make(corpus, tmp_path / "run", resume=True)


def test_corpus_shorter_than_a_context_window(tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("too short for a window of 16 tokens" * 2, encoding="utf-8")
    with pytest.raises(CorpusError, match="corpus too short"):
        make(short, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_cuda_asked_but_absent(corpus, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    with pytest.raises(ConfigError, match="--device cuda was asked for, but PyTorch sees no CUDA GPU"):
        make(corpus, tmp_path / "run", device="cuda")


def test_precision_picks_the_autocast_dtype():
    """fp32 never autocasts; bf16 always does; auto uses bf16 only where the CPU has bf16 instructions."""
    from charlm.runtime import autocast_dtype

    assert autocast_dtype("cpu", "fp32") is None
    assert autocast_dtype("cpu", "bf16") == torch.bfloat16
    native = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    assert autocast_dtype("cpu", "auto") == (torch.bfloat16 if native else None)


def test_bf16_training_learns(tmp_path):
    """A --precision bf16 run on the CPU learns like an fp32 one (weights stay float32)."""
    text = "the quick brown fox jumps over the lazy dog. " * 200
    corpus = tmp_path / "fox.txt"
    corpus.write_text(text)
    losses = {}
    for precision in ("fp32", "bf16"):
        model_cfg = ModelConfig(kind="transformer", n_layers=1, d_model=32, n_heads=2, context=32)
        cfg = TrainConfig(
            steps=40,
            batch_size=8,
            lr=1e-2,
            warmup=5,
            eval_interval=40,
            eval_iters=2,
            sample_tokens=0,
            device="cpu",
            precision=precision,
        )
        run = Trainer(corpus, model_cfg, cfg, tmp_path / precision)
        losses[precision] = run.fit().last_val_loss
        assert all(p.dtype == torch.float32 for p in run.model.parameters())
    assert losses["bf16"] < 0.5 * math.log(run.model_cfg.vocab_size)  # the trainer never changes the caller's config
    assert abs(losses["bf16"] - losses["fp32"]) < 0.25


def test_the_trainer_writes_the_samples_and_they_leave_training_alone(corpus, tmp_path):
    """Evaluated and Result carry sample text (views only draw it); sampling uses its own RNG, so a run
    with samples trains exactly the weights of a run without."""
    events = []
    with_samples = make(corpus, tmp_path / "a", on_event=events.append, steps=10, sample_tokens=30)
    result = with_samples.fit()
    without = make(corpus, tmp_path / "b", steps=10)
    assert without.fit().sample is None
    assert_bit_identical(weights(with_samples.model), weights(without.model))
    samples = [e.sample for e in events if isinstance(e, Evaluated)]
    assert len(samples) == 2 and all(isinstance(s, str) and s for s in samples)
    ckpt = checkpoint.load(tmp_path / "a" / LAST)  # the final sample is the saved model's, seeded by --seed
    want = Streamer(ckpt.model, ckpt.tokenizer).complete([], SampleConfig(temperature=0.8, max_tokens=30, seed=1337))
    assert result.sample == want


def test_a_timed_run_shorter_than_its_warmup_still_ends_its_schedule():
    """Regression: a --max-time run shorter than --warmup steps ended with its learning rate still rising.
    Decided: with a time budget, warmup also ends after WARMUP_TIME_FRACTION of the time at the latest."""
    from charlm.training.schedule import WARMUP_TIME_FRACTION, lr_at

    cfg = TrainConfig(steps=10**9, max_time=10, warmup=1000, lr=1e-2, min_lr_ratio=0.1)
    assert lr_at(cfg, 0, 0.0) == pytest.approx(1e-5)  # the steps still start the warmup
    assert lr_at(cfg, 5, 0.5 * WARMUP_TIME_FRACTION * 10) == pytest.approx(0.5e-2)  # half the warmup time: half the lr
    assert lr_at(cfg, 20, WARMUP_TIME_FRACTION * 10) == pytest.approx(1e-2, rel=0.03)  # warmed up by the clock
    assert lr_at(cfg, 50, 5.0) == pytest.approx(0.55e-2)  # the cosine halfway
    assert lr_at(cfg, 99, 10.0) == pytest.approx(1e-3)  # and at its end when the time runs out
    untimed = TrainConfig(steps=2000, warmup=100, lr=1e-2)
    assert lr_at(untimed, 49, 1e6) == pytest.approx(0.5e-2)  # without a budget the clock plays no part
