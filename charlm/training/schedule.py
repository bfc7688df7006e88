"""When things happen in a run, as functions of its step and clock: the learning rate at each step (linear
warmup, then cosine decay; on the clock too under a time budget) and when it evaluates (EvalSchedule).
No torch: the trainer asks, and does the work.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from charlm.config import TrainConfig

WARMUP_TIME_FRACTION = 0.1  # with a time budget, warmup ends after this share of it at the latest


def lr_at(cfg: TrainConfig, step: int, elapsed: float) -> float:
    """Linear warmup, then cosine decay to lr * min_lr_ratio. With a time budget the warmup and the decay
    follow the clock too, so a --max-time run still ends its schedule when the time runs out, even one
    shorter than its --warmup steps."""
    warmed = (step + 1) / cfg.warmup if step < cfg.warmup else 1.0
    if cfg.max_time:
        warmed = max(warmed, elapsed / (WARMUP_TIME_FRACTION * cfg.max_time))
    if warmed < 1.0:
        return cfg.lr * warmed
    progress = max(0.0, (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup))  # 0 on warmup's last step
    if cfg.max_time:
        progress = max(progress, elapsed / cfg.max_time)
    progress = min(progress, 1.0)
    min_lr = cfg.lr * cfg.min_lr_ratio
    return min_lr + 0.5 * (cfg.lr - min_lr) * (1 + math.cos(math.pi * progress))


def spent(cfg: TrainConfig, step: int, seconds: float) -> float:
    """The fraction of the budget (steps or time, whichever runs out first) spent."""
    p = step / cfg.steps
    return max(p, seconds / cfg.max_time) if cfg.max_time else p


class EvalSchedule:
    """When a run evaluates. With --eval-interval: every that many steps. Without: the first after 5% of the
    budget (a short run shows a validation loss early, not only at its end), then at least 5% of the budget
    apart, and far enough apart that evaluating takes at most ~5% of the time (a two-minute CPU run evaluates
    ~3 times, an hour ~20 times). Always at the run's last step."""

    GAP = SHARE = 0.05

    def __init__(self, cfg: TrainConfig, spent_before: float = 0.0):
        self.cfg = cfg
        self.next = spent_before + self.GAP  # the budget spent at which the next evaluation is due (a resumed
        # run too shows a validation loss early)

    def due(self, step: int, budget_spent: Callable[[], float]) -> bool:
        """budget_spent() is asked only when the answer depends on it (it is the same on every rank: a collective)."""
        if step >= self.cfg.steps:
            return True
        if self.cfg.eval_interval:
            return step % self.cfg.eval_interval == 0
        return budget_spent() >= self.next

    def evaluated(self, done: float, cost: float, seconds: float) -> None:
        """An evaluation that cost `cost` seconds ended with `done` of the budget spent after `seconds` of
        training: the next one's place in the budget."""
        total = self.cfg.max_time or seconds / max(done, 1e-9)  # seconds the whole budget takes
        self.next = done + max(self.GAP, cost / (self.SHARE * total))
