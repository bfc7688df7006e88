"""Synthetic tasks, generated from a seed: the training text a lab model learns from, and fresh aligned
examples to score it on. Each example is one line; the char tokenizer sees a small alphabet.

  copy    "dbhaf|dbhaf"    N random symbols, a separator, the same N symbols again
  recall  "c4a1f7?a1"      P key-value pairs (distinct keys), '?', one of the keys: its value follows

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
    q = rng.randrange(pairs)
    body = "".join(k + v for k, v in zip(keys, values))
    text = f"{body}{ASK}{keys[q]}{values[q]}"
    return Example(text, [len(text) - 1])


TASKS = {"copy": copy_example, "recall": recall_example}


def examples(task: str, size: int, count: int, seed: int) -> list[Example]:
    rng = random.Random(seed)
    return [TASKS[task](rng, size) for _ in range(count)]


def corpus(task: str, size: int, chars: int, seed: int) -> str:
    """About `chars` characters of examples, one per line. Every symbol of the task occurs, so the char
    tokenizer built from this text knows the whole alphabet."""
    rng = random.Random(seed)
    alphabet = SYMBOLS + SEP if task == "copy" else KEYS + VALUES + ASK
    lines, n = [alphabet], 0  # first line: the alphabet, once
    while n < chars:
        lines.append(TASKS[task](rng, size).text)
        n += len(lines[-1]) + 1
    return "\n".join(lines) + "\n"
