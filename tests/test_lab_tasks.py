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
    """(pairs, questions) of one recall line, read off its text alone."""
    head, *asked = text.split(tasks.ASK)
    pairs = [(head[i], head[i + 1]) for i in range(0, len(head), 2)]
    return pairs, [(q[0], q[1]) for q in asked]


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
            assert len(asked) == max(1, P // 2) == len(set(asked)) and set(asked) <= set(keys)
            assert all(dict(pairs)[k] == v for k, v in questions)  # each answer is the key's value
            assert [e.text[t] for t in e.targets] == [v for _, v in questions]
            assert len(e.text) == tasks.example_length("recall", P)


def test_the_no_binding_baseline_is_what_a_guesser_without_binding_scores():
    """A guesser that knows every value shown and every answer given, never which value stands beside which
    key: it picks among the values not yet answered. Its score on 20,000 lines of each P matches the
    baseline the lab prints, within four standard errors."""
    rng, guess = random.Random(1), random.Random(2)
    for P in (2, 4, 8, 16):
        right = total = 0
        for _ in range(5_000):
            pairs, questions = parse_recall(tasks.recall_example(rng, P).text)
            left = [v for _, v in pairs]
            for _, answer in questions:
                right += guess.choice(left) == answer
                total += 1
                left.remove(answer)  # the answer is shown: one value fewer
        p = tasks.recall_no_binding(P)
        assert abs(right / total - p) < 4 * (p * (1 - p) / total) ** 0.5 + 1e-9, (P, right / total, p)


@pytest.mark.parametrize("P", [2, 4, 6])
def test_the_no_binding_baseline_is_the_best_no_binding_can_do(P):
    """The exact optimum for an observer that sees the keys, the values and the answers so far but not the
    pairing: every pairing (permutation) consistent with the answers so far is equally likely, so the best
    guess is right with the largest share of them. Enumerated, not derived."""
    rng = random.Random(P)
    keys, values = rng.sample(tasks.KEYS, P), rng.sample(tasks.VALUES, P)
    pairings = [dict(zip(keys, perm)) for perm in itertools.permutations(values)]
    questions = rng.sample(keys, max(1, P // 2))
    best = Fraction(0)
    truth = pairings[0]
    for j, key in enumerate(questions):
        seen = {k: truth[k] for k in questions[:j]}
        alive = [m for m in pairings if all(m[k] == v for k, v in seen.items())]
        counts = {v: sum(m[key] == v for m in alive) for v in values}
        best += Fraction(max(counts.values()), len(alive))
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
    if size <= 2:
        assert test & everything  # drawn without the split, the training text would have held them
