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
    xformat=None,
) -> str:
    """series: name -> (xs, ys). Points that a log axis cannot show (<= 0) and non-finite ones are left out.
    Returns the chart as text, `height` lines of `width` characters; when the legend does not fit inside the
    chart (plotext would drop it without a word: more series than about height - 3), it follows the chart, a
    few names a line. xformat: how an x tick is written (e.g. views.text.duration), else as a plain number."""
    plt.clf()
    plt.plotsize(width, height)
    plt.theme("clear" if not color else "pro")
    outside = len(series) > height - 3
    legend = []
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
        marker, hue = MARKERS[k % len(MARKERS)], COLORS[(k + k // len(MARKERS)) % len(COLORS)]  # pairs unique to 64
        plt.plot(
            list(px),
            list(py),
            label=None if outside else name,
            marker=marker,
            **({"color": hue} if color else {}),
        )
        legend.append(f"{marker} {name}" + (f" ({hue})" if color and len(series) > len(MARKERS) else ""))
    if xlog:
        plt.xscale("log")
    if ylog:
        plt.yscale("log")
    label = xformat or _tick_label
    if 1 < len(xs_all) <= 10:  # the measured x values themselves as ticks: the sweep's settings, not 8.4, 14.1
        ticks = sorted(xs_all)
        plt.xticks(ticks, [label(t) for t in ticks])
    elif xformat and len(xs_all) > 10 and not xlog:  # a few evenly spaced ticks, written the caller's way
        lo, hi = min(xs_all), max(xs_all)
        ticks = [lo + (hi - lo) * k / 4 for k in range(5)]
        plt.xticks(ticks, [label(t) for t in ticks])
    plt.xlabel(xlabel)
    plt.ylabel(ylabel)
    if title:
        plt.title(title)
    text = plt.build()
    plt.clf()
    text = text if color else plt.uncolorize(text)
    if outside and legend:
        if not color and len(legend) > len(MARKERS):
            legend.append(
                f"(markers repeat after {len(MARKERS)} series: fewer runs, or a colour terminal, tell them apart)"
            )
        lines, line = [], ""
        for entry in legend:
            if line and len(line) + 3 + len(entry) > width:
                lines.append(line)
                line = ""
            line = f"{line}   {entry}" if line else entry
        text = text.rstrip("\n") + "\n" + "\n".join([*lines, line]) + "\n"
    return text
