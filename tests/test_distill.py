"""Distillation (train --teacher): weight 0 is ordinary training bit for bit; the loss is (1 - w) CE + w T² KL
as written out by hand; the checkpoint records its teacher; a teacher the student cannot use is one line."""

from __future__ import annotations

import math

import numpy as np
import torch
from conftest import CMP_TEXT, TINY, cli, one_line_error, tiny_train

from charlm.config import ModelConfig
from charlm.storage import checkpoint
from charlm.training.distill import Teacher
from charlm.training.trainer import Trainer

SEED = 1337  # the LSTM test also passes with seeds 1 and 2
STUDENT = ModelConfig(kind="transformer", n_layers=1, d_model=16, n_heads=2, context=32)


def test_weight_zero_trains_exactly_as_without_a_teacher(cmp_runs, cmp_corpus, tmp_path):
    plain = Trainer(cmp_corpus, STUDENT, tiny_train(12), tmp_path / "plain")
    plain.fit()
    zero = Trainer(
        cmp_corpus, STUDENT, tiny_train(12, teacher=str(cmp_runs["tf"]), distill_weight=0.0), tmp_path / "zero"
    )
    zero.fit()
    assert zero.teacher is None
    a, b = plain.model.state_dict(), zero.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    # and with a weight, the same seed trains another model
    some = Trainer(
        cmp_corpus, STUDENT, tiny_train(12, teacher=str(cmp_runs["tf"]), distill_weight=0.5), tmp_path / "some"
    )
    some.fit()
    assert not all(torch.equal(a[k], some.model.state_dict()[k]) for k in a)


def test_the_loss_is_the_mixed_cross_entropy_and_scaled_kl_written_out(cmp_runs, cmp_corpus, tmp_path):
    trainer = Trainer(
        cmp_corpus,
        STUDENT,
        tiny_train(1, teacher=str(cmp_runs["tf"]), distill_weight=0.3, distill_temperature=2.5),
        tmp_path / "run",
    )
    x, y = trainer.batches.get_batch("train", 4, torch.Generator().manual_seed(0), "cpu")
    y[0, :5] = -1  # positions a masked run does not score
    logits, ce = trainer.model(x, y)
    got = float(trainer.teacher.loss(x, y, logits, ce).detach())
    # by hand, in float64 numpy: per scored position sum_v p_t (log p_t - log p_s) at temperature T
    with torch.no_grad():
        t = trainer.teacher.ck.model(x)[0].double().numpy().reshape(-1, logits.size(-1))
    s = logits.detach().double().numpy().reshape(-1, logits.size(-1))
    keep = y.reshape(-1).numpy() != -1

    def log_softmax(z):
        z = z - z.max(-1, keepdims=True)
        return z - np.log(np.exp(z).sum(-1, keepdims=True))

    lt, ls = log_softmax(t[keep] / 2.5), log_softmax(s[keep] / 2.5)
    kl = (np.exp(lt) * (lt - ls)).sum(-1).mean()
    targets = y.reshape(-1).numpy()[keep]
    hard = -log_softmax(s[keep])[np.arange(keep.sum()), targets].mean()
    want = 0.7 * hard + 0.3 * 2.5**2 * kl
    assert math.isclose(got, want, rel_tol=1e-5), (got, want)


def test_a_distilled_run_records_its_teacher(cmp_runs, cmp_corpus, tmp_path):
    r = cli("train", cmp_corpus, *TINY, "--steps", "3", "--teacher", cmp_runs["tf"], "--out", tmp_path / "s")
    assert r.exit_code == 0, r.output
    saved = checkpoint.read_header(tmp_path / "s")
    assert saved.train_config.teacher == str((cmp_runs["tf"] / "best.safetensors").resolve())  # recorded absolute
    assert saved.train_config.distill_weight == 0.5
    info = cli("info", tmp_path / "s")
    assert "distilled from" in info.stdout and "cmp-tf" in info.stdout


def test_a_teacher_the_student_cannot_use_is_one_line(cmp_runs, cmp_corpus, tmp_path):
    other = tmp_path / "other.txt"
    other.write_text(CMP_TEXT.upper(), encoding="utf-8")  # another alphabet: another char tokenizer
    r = cli("train", other, *TINY, "--steps", "2", "--teacher", cmp_runs["tf"], "--out", tmp_path / "a")
    one_line_error(r, "its tokenizer (char", "train on the teacher's corpus")
    r = cli(
        "train",
        cmp_corpus,
        *TINY,
        "--steps",
        "2",
        "--teacher",
        cmp_runs["tf"],
        "--context",
        "64",
        "--out",
        tmp_path / "b",
    )
    one_line_error(r, "sees 32 tokens at once", "--context 32 or less")
    one_line_error(
        cli("train", cmp_corpus, *TINY, "--teacher", tmp_path / "none", "--out", tmp_path / "c"), "no such checkpoint"
    )
    one_line_error(
        cli("train", cmp_corpus, *TINY, "--teacher", cmp_runs["tf"], "--distill-weight", "2"), "--distill-weight"
    )
    one_line_error(cli("train", cmp_corpus, *TINY, "--distill-temperature", "0"), "--distill-temperature")
    one_line_error(cli("train", cmp_corpus, *TINY, "--teacher", ""), "--teacher is empty")


def test_an_lstm_learns_from_a_transformer_teacher(cmp_runs, cmp_corpus, tmp_path):
    """Another family as the student: the loss runs, and a run with weight 1 moves the student toward the teacher
    (its KL to the teacher falls below the same student's trained without one, same seed and steps)."""
    lstm = ModelConfig(kind="lstm", n_layers=1, d_model=32, context=32)
    runs = {}
    for name, w in (("alone", 0.0), ("taught", 1.0)):
        t = Trainer(
            cmp_corpus, lstm, tiny_train(30, teacher=str(cmp_runs["tf"]), distill_weight=w, seed=SEED), tmp_path / name
        )
        t.fit()
        runs[name] = t
    teacher = Teacher(runs["taught"].cfg, runs["taught"].tokenizer, lstm, "cpu")
    x, _ = runs["alone"].batches.get_batch("val", 8, torch.Generator().manual_seed(1), "cpu")
    with torch.no_grad():
        t = torch.log_softmax(teacher.ck.model(x)[0], -1)
        kl = {
            name: float((t.exp() * (t - torch.log_softmax(r.model.eval()(x)[0], -1))).sum(-1).mean())
            for name, r in runs.items()
        }
    assert kl["taught"] < kl["alone"], kl
