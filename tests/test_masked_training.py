"""A task posed example by example: Batches draws windows that start at examples (`starts`) and hides the
targets outside a mask (-1, which the models' loss ignores); the trainer trains and evaluates on exactly
those targets; its checkpoint records where its corpus was read (an optional field older files lack)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from charlm.config import ModelConfig, TrainConfig
from charlm.data import Batches, CorpusError
from charlm.models import build_model
from charlm.storage import checkpoint
from charlm.training.trainer import Trainer


def test_windows_start_at_the_starts_and_targets_outside_the_mask_are_hidden():
    tokens = np.arange(100, dtype=np.uint16)
    starts = np.array([0, 10, 20, 30, 40, 50, 60, 70, 80, 90])
    mask = np.zeros(100, dtype=bool)
    mask[5::10] = True  # one target per example: its 6th token
    b = Batches(tokens, context=8, val_fraction=0.2, starts=starts, mask=mask)
    b.check()
    # train: tokens 0..79, windows of 9 tokens that fit: starts 0..70; val: 80..99 -> starts 80, 90 (0, 10 in it)
    assert b.windows["train"].tolist() == [0, 10, 20, 30, 40, 50, 60, 70] and b.windows["val"].tolist() == [0, 10]
    x, y = b.get_batch("train", 64, torch.Generator().manual_seed(0))
    assert set((x[:, 0] % 10).tolist()) == {0} and len(set(x[:, 0].tolist())) > 4  # every row starts at an example
    assert ((y == -1) | (y % 10 == 5)).all() and ((y % 10 == 5) == (y != -1)).all()  # the target and nothing else
    assert torch.equal(y[:, 4], x[:, 0] + 5)  # x[:, 4] is token s+4: its target s+5 is the example's 6th token
    xv, yv = b.get_batch("val", 16, torch.Generator().manual_seed(0))
    assert set(xv[:, 0].tolist()) <= {80, 90} and (yv != -1).sum(dim=1).tolist() == [1] * 16


def test_a_mask_alone_draws_only_windows_with_a_target():
    tokens = np.arange(200, dtype=np.uint16)
    mask = np.zeros(200, dtype=bool)
    mask[[50, 150]] = True
    b = Batches(tokens, context=4, val_fraction=0.5, mask=mask)
    assert b.windows["train"].tolist() == [46, 47, 48, 49]  # windows s..s+4 whose targets s+1..s+4 hold token 50
    _, y = b.get_batch("train", 32, torch.Generator().manual_seed(0))
    assert ((y != -1).sum(dim=1) == 1).all() and set(y[y != -1].tolist()) == {50}


def test_without_starts_or_mask_batches_are_drawn_as_before():
    tokens = np.arange(1000, dtype=np.uint16)
    plain = Batches(tokens, context=8)
    assert plain.windows is None
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    x, y = plain.get_batch("train", 4, g1)
    ix = torch.randint(len(plain.train) - 8, (4,), generator=g2).tolist()  # the draw get_batch has always made
    assert x[:, 0].tolist() == ix and torch.equal(y, x + 1)


def test_aligned_batches_refuse_what_cannot_work():
    with pytest.raises(CorpusError, match="the target mask has 9 entries for 10 tokens"):
        Batches(np.arange(10, dtype=np.uint16), context=4, mask=np.ones(9, dtype=bool))
    b = Batches(np.arange(100, dtype=np.uint16), context=8, starts=np.array([0, 10]), val_fraction=0.5)
    with pytest.raises(CorpusError, match="no window of 9 tokens in the val split starts at an example"):
        b.check()


@pytest.mark.parametrize("kind", ["transformer", "lstm"])
def test_the_loss_ignores_targets_of_minus_one(kind):
    torch.manual_seed(0)
    model = build_model(ModelConfig(kind=kind, vocab_size=11, n_layers=1, d_model=16, n_heads=2, context=8))
    x = torch.randint(11, (3, 8))
    y = torch.randint(11, (3, 8))
    keep = torch.rand(3, 8) < 0.4
    logits, loss = model(x, y.masked_fill(~keep, -1))
    assert loss.item() == pytest.approx(F.cross_entropy(logits[keep].float(), y[keep]).item(), rel=1e-5)


def _copy_task(n_examples: int, n: int = 6, seed: int = 0) -> tuple[str, np.ndarray, np.ndarray]:
    """Lines "abc|abc": the copied half is the mask; each window starts at the newline before a line."""
    rng = np.random.default_rng(seed)
    text, starts, targets = "abcdef|", [], []
    for _ in range(n_examples):
        s = "".join(rng.choice(list("abcdef"), n))
        starts.append(len(text))
        text += "\n" + s + "|"
        targets += range(len(text), len(text) + n)
        text += s
    text += "\n"
    mask = np.zeros(len(text), dtype=bool)
    mask[targets] = True
    return text, np.array(starts), mask


def test_a_masked_run_trains_and_evaluates_on_the_targets_only(tmp_path):
    text, starts, mask = _copy_task(600)
    corpus = tmp_path / "copy.txt"
    corpus.write_text(text, encoding="utf-8")
    model = ModelConfig(kind="transformer", n_layers=2, d_model=32, n_heads=2, context=14)
    train = TrainConfig(
        steps=300, batch_size=32, lr=3e-3, warmup=20, eval_interval=300, eval_iters=2, sample_tokens=0, device="cpu"
    )
    trainer = Trainer(corpus, model, train, tmp_path / "run", starts=starts, mask=mask)
    x, y = trainer.batches.get_batch("val", 4, torch.Generator().manual_seed(0))
    assert (x[:, 0] == trainer.tokenizer.encode("\n")[0]).all() and ((y != -1).sum(dim=1) == 6).all()
    result = trainer.fit()
    # an unmasked loss would count the random first halves: at least ~log 6 nats on half the targets
    assert result.best_val_loss < 0.5 * math.log(6)
    saved = checkpoint.read(tmp_path / "run")
    assert saved.corpus.path == str(corpus.resolve()) and saved.corpus.name == "copy.txt"


def test_a_checkpoint_without_a_corpus_path_still_loads(tmp_path, cmp_runs):
    saved = checkpoint.read(cmp_runs["tf"])
    payload = saved.to_payload()
    assert payload["corpus"]["path"] is not None
    del payload["corpus"]["path"]  # as written before the field existed
    checkpoint.save(payload, tmp_path / "old.pt")
    assert checkpoint.read(tmp_path / "old.pt").corpus.path is None
