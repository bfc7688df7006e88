"""Scoring a lab model on held-out examples (accuracy and loss on the characters the task determines), and the
measures its readings derive from scores.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from charlm.lab.tasks import Example


def _logits(model, tokenizer, examples: list[Example]):
    """(group, ids, logits) for each batch of examples: ids the line as written (a newline first), logits[:, p]
    the model's prediction of ids[:, p + 1] = text[p] from what it read before (Example.inputs)."""
    device = next(model.parameters()).device
    for group in _groups(examples):
        ids = torch.tensor([tokenizer.encode("\n" + e.text) for e in group], device=device)
        read = torch.tensor([tokenizer.encode("\n" + e.inputs) for e in group], device=device)
        logits, _ = model(read[:, :-1])
        yield group, ids, logits.float()


@torch.no_grad()
def answers(model, tokenizer, examples: list[Example]) -> list[str]:
    """The model's answer (argmax) at every target of each example, as one string an example."""
    out = []
    for group, _, logits in _logits(model, tokenizer, examples):
        for row, e in enumerate(group):
            out.append(tokenizer.decode(logits[row, e.targets].argmax(-1).tolist()))
    return out


def _groups(examples: list[Example], size: int = 64):
    """Examples in batches of equal length (each one a line: a newline first, as in training)."""
    by_length: dict[int, list[Example]] = {}
    for e in examples:
        by_length.setdefault(len(e.text), []).append(e)
    for group in by_length.values():
        for b in range(0, len(group), size):
            yield group[b : b + size]


@torch.no_grad()
def scored(model, tokenizer, examples: list[Example]) -> tuple[float, float]:
    """(accuracy, nats): the share of target characters the model predicts exactly (argmax) from everything
    before them in the example, and its mean loss on them (teacher forcing: a right prefix, as greedy
    decoding has while it makes no mistake; where the task has a filler, the model reads it in place of each
    target, as in training: Example.inputs)."""
    right = total = 0
    nats = 0.0
    for group, ids, logits in _logits(model, tokenizer, examples):
        for row, e in enumerate(group):
            t = torch.tensor(e.targets, device=ids.device)
            right += int((logits[row, t].argmax(-1) == ids[row, t + 1]).sum())
            nats += float(F.cross_entropy(logits[row, t], ids[row, t + 1], reduction="sum"))
            total += len(e.targets)
    return right / total, nats / total


def accuracy(model, tokenizer, examples: list[Example]) -> float:
    return scored(model, tokenizer, examples)[0]


def fit_exponent(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of log y against log x: y ~ x^slope."""
    lx, ly = np.log(np.asarray(xs, float)), np.log(np.asarray(ys, float))
    return float(np.polyfit(lx, ly, 1)[0])


def bits_per_symbol(accuracy: float, alphabet: int) -> float:
    """Information one copied symbol carries when it is right with probability `accuracy` and wrong
    evenly otherwise: log2 K - H(a) - (1 - a) log2 (K - 1), 0 at chance (1/K), log2 K when always right."""
    a = min(max(accuracy, 1 / alphabet), 1.0)
    h = -sum(p * math.log2(p) for p in (a, 1 - a) if p > 0)
    return math.log2(alphabet) - h - (1 - a) * math.log2(alphabet - 1)
