"""Synthetic tasks, generated from a seed: the training text a lab model learns from, and fresh aligned
examples to score it on. Each example is one line; the char tokenizer sees a small alphabet.

  copy    "dbhaf|dbhaf"    N random symbols, a separator, the same N symbols again
  recall  "c4a1f7?a1?f7?c4"  P key-value pairs (distinct keys), then each key asked once after a '?'
                             in a new order: its value follows

Only some characters of an example are predictable (the copied half; the answer); `targets` marks them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

SYMBOLS = "abcdefghij"  # copy's symbols
KEYS = "abcdefghijklmnopqrstuvwxyz"  # recall's keys
VALUES = "0123456789"  # recall's values
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


TASKS = {"copy": copy_example, "recall": recall_example}


def alphabet(task: str) -> str:
    return SYMBOLS + SEP if task == "copy" else KEYS + VALUES + ASK


def vocab_size(task: str) -> int:
    return len(alphabet(task)) + 1  # and the newline


def examples(task: str, size: int, count: int, seed: int) -> list[Example]:
    rng = random.Random(seed)
    return [TASKS[task](rng, size) for _ in range(count)]


def corpus(task: str, size: int, chars: int, seed: int) -> str:
    """About `chars` characters of examples, one per line. Every symbol of the task occurs, so the char
    tokenizer built from this text knows the whole alphabet."""
    rng = random.Random(seed)
    lines, n = [alphabet(task)], 0  # first line: the alphabet, once
    while n < chars:
        lines.append(TASKS[task](rng, size).text)
        n += len(lines[-1]) + 1
    return "\n".join(lines) + "\n"
