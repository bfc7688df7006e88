"""Synthetic tasks, generated from a seed: the training text a lab model learns from, and fresh
examples to score it on. Each example is one line; the char tokenizer sees a small alphabet.

  copy       "dbhaf|dbhaf"      N random symbols, a separator, the same N symbols again
  recall     "cDaKfQbX|fQcDbXaK" P key-value pairs, keys and values from disjoint alphabets (26 of each:
                                more values than pairs; no key and no value twice in a line), a '|', then
                                every key in a random order, each followed by its value; the model reads a
                                filler '.' in place of each value ("cDaKfQbX|f.c.b.a."), so no answer is
                                ever an input (Zoology's multi-query associative recall, Arora et al. 2023)
  induction  "qzkmwqzkmw"       S random letters, then the same S again (no separator: the model must
                                notice the repeat by content, not by a fixed offset, since S varies)

A test example is never a training example: an example's own text decides whether it is held out for
testing (held_out: one in TEST_SHARE of all possible lines), training texts leave those out and test
examples are drawn from them alone, so no size, however small its set of possible lines, scores a line
a model was trained on.

Only some characters of an example are determined by the ones before them (the copied half, each answer,
the repeat after its first letter): `targets` marks them, and the training text carries a mask of them
and the offsets where examples begin, so a lab model learns exactly the task as posed (data.Batches). A task
whose targets are not inputs (recall: Example.fill) has its model read the filler in place of each target, in
training (training.lab_trainer) and in scoring alike (Example.inputs).
"""

from __future__ import annotations

import hashlib
import random
import string
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

SYMBOLS = "abcdefghij"  # copy's symbols
KEYS = "abcdefghijklmnopqrstuvwxyz"  # recall's keys
VALUES = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"  # recall's values: their own alphabet, more of them than pairs
LETTERS = string.ascii_letters  # induction's tokens: 52 of them, so a letter rarely recurs by chance
SEP, FILL = "|", "."  # FILL: what a recall model reads in place of each answer
TEST_SHARE = 4  # one possible line in this many is held out for testing (held_out)


@dataclass
class Example:
    text: str  # without the newline that ends it
    targets: list[int]  # positions in text whose character is determined by the ones before it
    fill: str | None = None  # read in place of each target (its answer is never an input); None: the text itself

    @property
    def inputs(self) -> str:
        """The characters the model reads: the text, with the filler in place of each target where there is one."""
        if self.fill is None:
            return self.text
        chars = list(self.text)
        for t in self.targets:
            chars[t] = self.fill
        return "".join(chars)


def copy_example(rng: random.Random, n: int) -> Example:
    s = "".join(rng.choice(SYMBOLS) for _ in range(n))
    return Example(f"{s}{SEP}{s}", list(range(n + 1, 2 * n + 1)))


def recall_example(rng: random.Random, pairs: int) -> Example:
    keys = rng.sample(KEYS, pairs)
    values = rng.sample(VALUES, pairs)
    text = "".join(k + v for k, v in zip(keys, values)) + SEP
    targets = []
    for q in rng.sample(range(pairs), pairs):  # every key, in a random order
        text += keys[q] + values[q]
        targets.append(len(text) - 1)
    return Example(text, targets, fill=FILL)


def recall_no_binding(pairs: int) -> float:
    """The best share of recall answers right without binding a key to its value: the values of a line are
    distinct and paired with its keys at random, and no answer is ever read back (the model reads the filler in
    its place), so knowing every value shown but not which stands beside the key asked, each answer is one of
    the P values, each as likely: right with probability 1 / P at best."""
    return 1 / pairs


def induction_example(rng: random.Random, s: int) -> Example:
    half = "".join(rng.choice(LETTERS) for _ in range(s))
    return Example(half + half, list(range(s + 1, 2 * s)))  # the repeat's first letter cannot be foreseen


@dataclass(frozen=True)
class Task:
    """What the lab needs to know of a task: how to draw an example of a size, the characters its lines use, and
    how long a line of a size is. A new task is one entry in TASKS."""

    make: Callable[[random.Random, int], Example]
    alphabet: str
    length: Callable[[int], int]  # characters of one example of a size, without its newline


TASKS = {
    "copy": Task(copy_example, SYMBOLS + SEP, lambda n: 2 * n + 1),
    "recall": Task(recall_example, KEYS + VALUES + SEP + FILL, lambda p: 4 * p + 1),
    "induction": Task(induction_example, LETTERS, lambda s: 2 * s),
}


def alphabet(task: str) -> str:
    return TASKS[task].alphabet


def vocab_size(task: str) -> int:
    return len(alphabet(task)) + 1  # and the newline


def example_length(task: str, size: int) -> int:
    """Characters of one example of this size, without its newline."""
    return TASKS[task].length(size)


def held_out(text: str) -> bool:
    """Whether a line is held out for testing: decided by its text alone (a stable hash), so a training
    text and a test set made from any seeds never share a line."""
    return hashlib.blake2b(text.encode(), digest_size=8).digest()[0] % TEST_SHARE == 0


def examples(task: str, size: int, count: int, seed: int) -> list[Example]:
    """`count` test examples of this size: fresh lines drawn from those held out (never a training line;
    a line may come twice where the held-out lines are few)."""
    rng = random.Random(seed)
    out: list[Example] = []
    for _ in range(1000 * count):
        e = TASKS[task].make(rng, size)
        if held_out(e.text):
            out.append(e)
            if len(out) == count:
                return out
    raise ValueError(f"no held-out {task} line of size {size}: too few possible lines to test on")


@dataclass
class TaskText:
    """A training text of examples, one per line, with what the trainer needs to pose the task (char
    offsets are token offsets: lab models use the char tokenizer)."""

    text: str
    starts: np.ndarray  # offset of the newline before each example: a training window begins there
    mask: np.ndarray  # one bool per character: True at the targets
    fill: str | None = None  # what the model reads in place of each target (Example.fill); None: the text itself


def corpus(
    task: str,
    sizes: int | tuple[int, ...],
    chars: int,
    seed: int,
    pad: int | None = None,
    heldout: bool = False,
) -> TaskText:
    """About `chars` characters of examples, one per line, each of a size drawn from `sizes` (or of that one
    size). The first line is the alphabet, once, so the char tokenizer built from this text knows it all.
    pad: fill each line with newlines to this many characters, so that a window of pad + 1 tokens from an
    example's start holds that example alone (recall: a key asked again must not find the same key in the
    next example). heldout: leave out the lines held out for testing (held_out; False: every line drawn)."""
    rng = random.Random(seed)
    choices = (sizes,) if isinstance(sizes, int) else tuple(sizes)
    lines = [alphabet(task)]
    n = len(lines[0])  # where the next newline goes
    starts, targets, fill = [], [], None
    while n < chars:
        e = TASKS[task].make(rng, rng.choice(choices) if len(choices) > 1 else choices[0])
        if heldout and held_out(e.text):
            continue
        starts.append(n)
        fill = e.fill
        targets.extend(n + 1 + t for t in e.targets)
        text = e.text + "\n" * max(0, (pad or 0) - len(e.text))
        lines.append(text)
        n += 1 + len(text)
    text = "\n".join(lines) + "\n"
    mask = np.zeros(len(text), dtype=bool)
    mask[targets] = True
    return TaskText(text, np.asarray(starts, dtype=np.int64), mask, fill)
