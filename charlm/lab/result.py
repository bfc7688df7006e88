"""A lab experiment's result: the record every experiment returns (its table, reading, chart and runs), and the
small helpers its readings share to quote a score over seeds. Plain data: the views and benchmarks/lab_seeds.py
read it without torch.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field


@dataclass
class Chart:
    """How to draw a result's records: y against x, one line per value of `series` (None: one per y key)."""

    x: str
    y: str | tuple[str, ...]
    series: str | None
    xlabel: str
    ylabel: str
    xlog: bool = False
    ylog: bool = False


@dataclass
class LabResult:
    experiment: str
    settings: dict
    results: list[dict]  # flat records, e.g. {"model": "lstm", "length": 40, "accuracy": 0.31}
    reading: str  # what the numbers say, written from them
    chart: Chart | None = None
    runs: list[str] = field(default_factory=list)  # run directories this experiment trained
    seconds: float = 0.0
    details: dict = field(default_factory=dict)  # what an experiment found beyond its table (e.g. the copy head)

    def to_dict(self) -> dict:
        return {
            "experiment": self.experiment,
            "settings": self.settings,
            "results": self.results,
            "reading": self.reading,
            "details": self.details,
            "runs": self.runs,
            "seconds": round(self.seconds, 1),
        }


class Clock:
    def __init__(self):
        self.t0 = time.perf_counter()

    def __call__(self) -> float:
        return time.perf_counter() - self.t0


def seeds_of(seed: int, count: int) -> list[int]:
    return list(range(seed, seed + count))


def spread(values: list[float]) -> dict:
    """The fields a record shows for one score over several seeds: the mean, and with more than one
    seed the lowest and every value (in seed order)."""
    out = {"accuracy": statistics.fmean(values)}
    if len(values) > 1:
        out |= {"lowest": min(values), "per_seed": [round(v, 4) for v in values]}
    return out


def params(records: list[dict]) -> str:
    """A family's parameter count in a reading: one number, or the range over the sizes (learned positions
    grow with the context)."""
    low, high = min(r["params"] for r in records), max(r["params"] for r in records)
    return f"{low:,}" if low == high else f"{low:,}-{high:,}"


def per_seed(r: dict) -> list[float]:
    """Every seed's accuracy in a record made with spread()."""
    return r.get("per_seed") or [r["accuracy"]]


def pct(x: float) -> str:
    """A share as the readings print it: whole percent, one decimal below 10%."""
    return f"{x:.1%}" if x < 0.1 else f"{x:.0%}"


def span(values: list[float]) -> str:
    """Every seed's accuracy as a reading quotes it: one value, or the lowest-highest."""
    low, high = min(values), max(values)
    return pct(low) if pct(low) == pct(high) else f"{pct(low)}-{pct(high)}"


def record(**kw) -> dict:
    return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in kw.items()}


def positions_label(p: str) -> str:
    """A position encoding's name as a reading writes it: RoPE, ALiBi, NoPE, Learned, Sinusoidal."""
    return {"rope": "RoPE", "alibi": "ALiBi", "nope": "NoPE"}.get(p, p.capitalize())
