"""The one terminal line chart: plotext draws axes, ticks, legend and log scales into a string.

Every chart in charlm goes through line_chart (the lab's results, and later `charlm plot`'s loss curves),
so they look alike. With color=False the string holds no escape codes at all, and the series are told
apart by their marker characters alone.
"""

from __future__ import annotations

import math

import plotext as plt

MARKERS = ("*", "+", "o", "x", "#", "@", "%", "&")  # one per series, in order: readable without colour
COLORS = ("blue", "red", "green", "orange", "magenta", "cyan", "gray", "yellow")


def _tick_label(v: float) -> str:
    return f"{v:g}" if abs(v) < 1e5 else f"{v:.0e}"


def line_chart(
    series: dict[str, tuple[list[float], list[float]]],
    *,
    width: int = 72,
    height: int = 16,
    xlabel: str = "",
    ylabel: str = "",
    xlog: bool = False,
    ylog: bool = False,
    color: bool = True,
    title: str = "",
) -> str:
    """series: name -> (xs, ys). Points that a log axis cannot show (<= 0) and non-finite ones are left out.
    Returns the chart as text, `height` lines of `width` characters (plus nothing else)."""
    plt.clf()
    plt.plotsize(width, height)
    plt.theme("clear" if not color else "pro")
    xs_all = set()
    for k, (name, (xs, ys)) in enumerate(series.items()):
        pts = [
            (x, y)
            for x, y in zip(xs, ys)
            if math.isfinite(x) and math.isfinite(y) and not (xlog and x <= 0) and not (ylog and y <= 0)
        ]
        if not pts:
            continue
        px, py = zip(*pts)
        xs_all.update(px)
        plt.plot(
            list(px),
            list(py),
            label=name,
            marker=MARKERS[k % len(MARKERS)],
            **({"color": COLORS[k % len(COLORS)]} if color else {}),
        )
    if xlog:
        plt.xscale("log")
    if ylog:
        plt.yscale("log")
    if 1 < len(xs_all) <= 10:  # the measured x values themselves as ticks: the sweep's settings, not 8.4, 14.1
        ticks = sorted(xs_all)
        plt.xticks(ticks, [_tick_label(t) for t in ticks])
    plt.xlabel(xlabel)
    plt.ylabel(ylabel)
    if title:
        plt.title(title)
    text = plt.build()
    plt.clf()
    return text if color else plt.uncolorize(text)
