"""The terminal line chart: plain output has no escape codes, the legend names every series, and a point
lands where its coordinates say."""

from __future__ import annotations

from charlm.views.plot import MARKERS, line_chart


def test_plain_chart_has_no_escape_codes_and_names_every_series():
    text = line_chart(
        {"lstm": ([5, 10, 20, 40], [0.9, 0.6, 0.2, 0.1]), "transformer": ([5, 10, 20, 40], [1, 1, 1, 0.98])},
        width=60,
        height=14,
        xlabel="N",
        ylabel="accuracy",
        color=False,
    )
    assert "\x1b" not in text
    assert "lstm" in text and "transformer" in text
    assert f"{MARKERS[0]}{MARKERS[0]} lstm" in text and f"{MARKERS[1]}{MARKERS[1]} transformer" in text
    assert all(len(line) <= 60 for line in text.splitlines())
    assert "accuracy" in text and "N" in text
    for tick in ("5", "10", "20", "40"):  # the measured x values are the ticks
        assert tick in text.splitlines()[-2].split()


def test_colour_chart_uses_escape_codes():
    assert "\x1b[" in line_chart({"a": ([1, 2], [1, 2])}, width=40, height=10, color=True)


def _marker_cells(text: str, marker: str) -> list[tuple[int, int]]:
    lines = text.splitlines()
    return [(r, c) for r, line in enumerate(lines) for c, ch in enumerate(line) if ch == marker]


def test_a_known_point_lands_in_its_corner():
    # one series rising from (0, 0) to (10, 10): its last point is the top right of the plot area, its first
    # the bottom left; the legend (top left) is left out by looking right of it
    text = line_chart({"up": ([0, 10], [0, 10])}, width=50, height=15, color=False)
    lines = text.splitlines()
    cells = [(r, c) for r, c in _marker_cells(text, MARKERS[0]) if c > 12]
    top = min(r for r, _ in cells)
    assert max(c for r, c in cells if r == top) >= 44  # top row: the right edge
    bottom = max(r for r, _ in _marker_cells(text, MARKERS[0]))
    assert bottom >= len(lines) - 5  # the last plot rows (above the x axis, its ticks and label)
    assert min(c for r, c in _marker_cells(text, MARKERS[0]) if r == bottom) <= 8  # the left edge


def test_log_axes_leave_out_points_they_cannot_show():
    text = line_chart({"t": ([0, 64, 1024], [1, 2, 32])}, width=50, height=12, xlog=True, ylog=True, color=False)
    assert "1024" in text and "64" in text
