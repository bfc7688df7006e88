"""Synthetic tasks, generated from a seed: the training text a lab model learns from, and fresh
examples to score it on. Each example is one line; the char tokenizer sees a small alphabet.

  copy       "dbhaf|dbhaf"      N random symbols, a separator, the same N symbols again
  recall     "c4a1f7?a1?f7?c4"  P key-value pairs (distinct keys), then each key asked once after a '?'
                                in a new order: its value follows
  induction  "qzkmwqzkmw"       S random letters, then the same S again (no separator: the model must
                                notice the repeat by content, not by a fixed offset, since S varies)

Only some characters of an example are determined by the ones before them (the copied half, each answer,
the repeat after its first letter): `targets` marks them, and the training text carries a mask of them
and the offsets where examples begin, so a lab model learns exactly the task as posed (data.Batches).
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass

import numpy as np

SYMBOLS = "abcdefghij"  # copy's symbols
KEYS = "abcdefghijklmnopqrstuvwxyz"  # recall's keys
VALUES = "0123456789"  # recall's values
LETTERS = string.ascii_letters  # induction's tokens: 52 of them, so a letter rarely recurs by chance
SEP, ASK = "|", "?"


@dataclass
class Example:
    text: str  # without the newline that ends it
    targets: list[int]  # positions in text whose character is determined by the ones before it


def copy_example(rng: random.Random, n: int) -> Example:
    s = "".join(rng.choice(SYMBOLS) for _ in range(n))
    return Example(f"{s}{SEP}{s}", list(range(n + 1, 2 * n + 1)))


def recall_example(rng: random.Random, pairs: int) -> Example:
    keys = rng.sample(KEYS, pairs)
    values = [rng.choice(VALUES) for _ in keys]
    text = "".join(k + v for k, v in zip(keys, values))
    targets = []
    for q in rng.sample(range(pairs), pairs):  # every key asked once, in a new order: P answers per line
        text += f"{ASK}{keys[q]}{values[q]}"
        targets.append(len(text) - 1)
    return Example(text, targets)


def induction_example(rng: random.Random, s: int) -> Example:
    half = "".join(rng.choice(LETTERS) for _ in range(s))
    return Example(half + half, list(range(s + 1, 2 * s)))  # the repeat's first letter cannot be foreseen


TASKS = {"copy": copy_example, "recall": recall_example, "induction": induction_example}


def alphabet(task: str) -> str:
    return {"copy": SYMBOLS + SEP, "recall": KEYS + VALUES + ASK, "induction": LETTERS}[task]


def vocab_size(task: str) -> int:
    return len(alphabet(task)) + 1  # and the newline


def example_length(task: str, size: int) -> int:
    """Characters of one example of this size, without its newline."""
    return {"copy": 2 * size + 1, "recall": 5 * size, "induction": 2 * size}[task]


def examples(task: str, size: int, count: int, seed: int) -> list[Example]:
    rng = random.Random(seed)
    return [TASKS[task](rng, size) for _ in range(count)]


@dataclass
class TaskText:
    """A training text of examples, one per line, with what the trainer needs to pose the task (char
    offsets are token offsets: lab models use the char tokenizer)."""

    text: str
    starts: np.ndarray  # offset of the newline before each example: a training window begins there
    mask: np.ndarray  # one bool per character: True at the targets


def corpus(task: str, sizes: int | tuple[int, ...], chars: int, seed: int, pad: int | None = None) -> TaskText:
    """About `chars` characters of examples, one per line, each of a size drawn from `sizes` (or of that one
    size). The first line is the alphabet, once, so the char tokenizer built from this text knows it all.
    pad: fill each line with newlines to this many characters, so that a window of pad + 1 tokens from an
    example's start holds that example alone (recall: a key asked again must not find the same key in the
    next example)."""
    rng = random.Random(seed)
    choices = (sizes,) if isinstance(sizes, int) else tuple(sizes)
    lines = [alphabet(task)]
    n = len(lines[0])  # where the next newline goes
    starts, targets = [], []
    while n < chars:
        e = TASKS[task](rng, rng.choice(choices) if len(choices) > 1 else choices[0])
        starts.append(n)
        targets.extend(n + 1 + t for t in e.targets)
        text = e.text + "\n" * max(0, (pad or 0) - len(e.text))
        lines.append(text)
        n += 1 + len(text)
    text = "\n".join(lines) + "\n"
    mask = np.zeros(len(text), dtype=bool)
    mask[targets] = True
    return TaskText(text, np.asarray(starts, dtype=np.int64), mask)
