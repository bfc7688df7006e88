"""The lab's tasks as posed: recall's no-binding baseline checked by independent computations (a guesser
that reads the lines, and the exact optimum by enumerating every pairing a no-binding observer cannot rule
out), and no test line ever a training line. Pure Python: no model is trained here."""

from __future__ import annotations

import itertools
import random
from fractions import Fraction

import pytest

from charlm.lab import tasks


def parse_recall(text: str) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(pairs, questions) of one recall line, read off its text alone: pairs, the separator, each key asked
    followed by its value."""
    head, asked = text.split(tasks.SEP)
    return [(head[i], head[i + 1]) for i in range(0, len(head), 2)], [
        (asked[i], asked[i + 1]) for i in range(0, len(asked), 2)
    ]


def test_a_recall_line_is_posed_as_zoology_poses_it():
    rng = random.Random(0)
    for P in (2, 4, 8, 16):
        for _ in range(50):
            e = tasks.recall_example(rng, P)
            pairs, questions = parse_recall(e.text)
            keys, values = [k for k, _ in pairs], [v for _, v in pairs]
            assert len(pairs) == P and len(set(keys)) == P and len(set(values)) == P  # none twice
            assert set(keys) <= set(tasks.KEYS) and set(values) <= set(tasks.VALUES)
            assert not set(tasks.KEYS) & set(tasks.VALUES)  # disjoint alphabets
            asked = [k for k, _ in questions]
            assert sorted(asked) == sorted(keys)  # every key asked, once
            assert all(dict(pairs)[k] == v for k, v in questions)  # each answer is the key's value
            assert [e.text[t] for t in e.targets] == [v for _, v in questions]
            assert not set(e.inputs.split(tasks.SEP)[1]) & set(tasks.VALUES)  # no answer is ever read
            assert len(e.text) == tasks.example_length("recall", P)


def test_the_no_binding_baseline_is_what_a_guesser_without_binding_scores():
    """A guesser that reads what the model reads (the pairs, the keys asked, the filler in place of each
    answer) and knows every value shown, never which value stands beside which key: it picks among the
    line's values. Its score on 20,000 lines of each P matches the baseline the lab prints, within four
    standard errors."""
    rng, guess = random.Random(1), random.Random(2)
    for P in (2, 4, 8, 16):
        right = total = 0
        for _ in range(5_000):
            e = tasks.recall_example(rng, P)
            pairs, _ = parse_recall(e.text)
            read = e.inputs.split(tasks.SEP)[1]
            for (_key, fill), t in zip(zip(read[0::2], read[1::2]), e.targets):
                assert fill == tasks.FILL  # nothing told it an earlier answer
                right += guess.choice([v for _, v in pairs]) == e.text[t]
                total += 1
        p = tasks.recall_no_binding(P)
        assert abs(right / total - p) < 4 * (p * (1 - p) / total) ** 0.5 + 1e-9, (P, right / total, p)


@pytest.mark.parametrize("P", [2, 4, 6])
def test_the_no_binding_baseline_is_the_best_no_binding_can_do(P):
    """The exact optimum for an observer that sees the keys and the values but not the pairing, and no answer
    (each is read as the filler): every pairing (permutation) is equally likely at every question, so the
    best guess is right with the largest share of them. Enumerated, not derived."""
    rng = random.Random(P)
    keys, values = rng.sample(tasks.KEYS, P), rng.sample(tasks.VALUES, P)
    pairings = [dict(zip(keys, perm)) for perm in itertools.permutations(values)]
    questions = rng.sample(keys, P)
    best = Fraction(0)
    for key in questions:  # nothing seen narrows the pairings: the answers are never read
        counts = {v: sum(m[key] == v for m in pairings) for v in values}
        best += Fraction(max(counts.values()), len(pairings))
    assert float(best / len(questions)) == pytest.approx(tasks.recall_no_binding(P), abs=1e-12)


@pytest.mark.parametrize(
    "task, sizes, size",
    [("copy", tuple(range(1, 5)), 1), ("copy", tuple(range(1, 5)), 2), ("copy", (5,), 5), ("recall", (2, 4), 2)],
)
def test_no_test_line_is_a_training_line(task, sizes, size):
    """Lines held out by their text: at sizes so small that the training text holds every possible line
    (copy N = 1, 2: 10 and 100 of them), the test lines are still lines it never holds."""
    train = set(tasks.corpus(task, sizes, 60_000, seed=7, heldout=True).text.split("\n")[1:])
    test = {e.text for seed in range(5) for e in tasks.examples(task, size, 100, seed)}
    assert test and not test & train
    everything = set(tasks.corpus(task, sizes, 60_000, seed=7, heldout=False).text.split("\n")[1:])
    if task == "copy" and size <= 2:  # (recall's P = 2 has 845,000 possible lines: a text holds few of them)
        assert test & everything  # drawn without the split, the training text would have held them
