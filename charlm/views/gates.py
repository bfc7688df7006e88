"""The gate viewer: an LSTM's forget / input / output gates (a GRU's update / reset gates) over the
text, for the units that change most, plus the cell state and its magnitude over time.

Each panel is a heat map: rows = units, columns = tokens. Gates run from 0 (blank) to 1 (darkest).
The numbers come from charlm.commands.look.gates (the gates recomputed from the trained weights step by
step, from a fresh state at the start of the text's last MAX_GATE_TOKENS tokens); this module lays them out
and prints. Layers and units count from 0.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
from rich.console import Console
from rich.text import Text

from charlm.errors import ConfigError
from charlm.views.heatmap import (
    GATES_ASCII_RAMP,
    MAX_HEADER,
    UNICODE_RAMP,
    Screen,
    fit_map,
    heatmap_lines,
    height_of,
    legend,
    pad,
    print_blocks,
    signed_legend,
    spark_line,
    token_label,
)

if TYPE_CHECKING:  # (the probe's results are only drawn here: importing a view loads no torch)
    from charlm.models.probes import Gates

TITLES = {  # each gate's panel title
    "forget": "forget gate f: 1 keeps the cell's value, 0 erases it",
    "input": "input gate i: how much new value is written",
    "output": "output gate o: how much of the cell is shown",
    "update": "update gate z: 1 keeps the old state, 0 replaces it",
    "reset": "reset gate r: 0 ignores the old state when proposing a new one",
}


def panels(trace) -> list[tuple[str, str]]:
    """(gate, title) of the panels drawn for a layer's trace, in order (the candidate values are no gates)."""
    return [(name, title) for name, title in TITLES.items() if name in trace.gates]


def fitting_units(gates_shown: int, height: int | None) -> int | None:
    """How many units let every panel fit a screen of this height (None: no limit), one panel under another:
    each map is a blank line, its title, the column labels and one row per unit (a rough bound for callers
    that draw no trial layout; units_that_fit measures one)."""
    if not height:
        return None
    n_maps = gates_shown + 1  # the gates, then the state
    return max(1, (height - 9) // n_maps - 2 - MAX_HEADER)


# which panels stay when the screen is too short for all of them: the gate that keeps or erases the memory, then
# the memory itself, then the rest (they are drawn in their usual order)
KEEP_FIRST = ("forget", "update", "state", "input", "reset", "output")
GAP = 3  # columns between panels side by side


@dataclass(frozen=True)
class Layout:
    """How the panels are placed: `columns` side by side (a wide, short terminal), `left_out` the panels that do
    not fit the screen's height even with one unit each (named in a hint at the bottom)."""

    columns: int = 1
    left_out: tuple[str, ...] = ()


def _trial(tokenizer, ids, kind, layer, trace):
    from charlm.models.probes import Gates  # (a trace exists: torch is loaded already)

    return Gates(ids, len(ids) - trace.h.shape[1], kind, layer, trace, [0], False)


def choose_layout(tokenizer, g: Gates, opts, screen: Screen, wanted: int | None = None) -> tuple[Layout, int | None]:
    """The layout and the number of units (None: no limit) that fit the screen: every panel one under another if
    `wanted` units fit so (default: 8, or as many as there are); else side by side, as many as the width holds
    without showing fewer tokens; else, when not even one unit fits, the panels of least use left out."""
    if not screen.height:
        return Layout(), None
    from charlm.models.probes import DEFAULT_UNITS  # (a trace exists: torch is loaded already)

    hidden = g.trace.h.shape[-1]
    wanted = min(wanted or DEFAULT_UNITS, hidden)
    names = [n for n, _ in panels(g.trace)] + ["state"]
    trial = replace(g, units=[0], chosen=False)
    tokens = _window(g, opts, screen.width)

    def fit(layout: Layout) -> int:  # units that fit this layout (0: not even one)
        shown = len(names) - len(layout.left_out)
        used = height_of(gate_lines(tokenizer, trial, opts, replace(screen, height=None), layout), screen.width) + 1
        return max(0, 1 + (screen.height - used) // -(-shown // layout.columns)) if used <= screen.height else 0

    layouts = [
        Layout(k) for k in (1, 2, 3) if k == 1 or _window(g, opts, (screen.width - GAP * (k - 1)) // k) == tokens
    ]
    best = max(layouts, key=lambda lay: (min(fit(lay), wanted), -lay.columns))
    if fit(best):
        return best, min(fit(best), hidden)
    drop = [n for n in reversed(KEEP_FIRST) if n in names]
    for k in range(1, len(names)):
        for columns in sorted({lay.columns for lay in layouts}):
            layout = Layout(columns, tuple(n for n in names if n in drop[:k]))
            if fit(layout):
                return layout, min(fit(layout), hidden)
    return Layout(1, tuple(n for n in names if n in drop[: len(names) - 1])), 1


def _window(g: Gates, opts, width: int) -> tuple[int, int]:
    """The tokens [start, stop) a panel `width` wide shows."""
    hidden = g.trace.h.shape[-1]
    row_w = max(len(str(hidden - 1)) + 1, 3) + 1
    try:
        start, stop, _ = fit_map(width, row_w, 5, g.offset, len(g.ids), opts.tokens, opts.end)
    except ConfigError:
        return (0, 0)
    return start, stop


def units_that_fit(tokenizer, ids: list[int], kind: str, layer: int, trace, opts, screen: Screen) -> int | None:
    """How many units let the whole view fit the screen's height (None: no limit, as in a pipe), measured by
    laying it out with one unit: what its titles, legends and column labels take at this width, wrapped."""
    return choose_layout(tokenizer, _trial(tokenizer, ids, kind, layer, trace), opts, screen)[1]


def _side_by_side(blocks: list[list[Text]], widths: list[int]) -> list[Text]:
    """Blocks of lines placed next to each other, GAP apart, each padded to its width."""
    out = []
    for i in range(max(len(b) for b in blocks)):
        line = Text(no_wrap=True, overflow="crop")
        for k, (block, w) in enumerate(zip(blocks, widths)):
            piece = block[i] if i < len(block) else Text()
            if k:
                line.append(" " * GAP)
            line.append_text(piece)
            if k < len(blocks) - 1:
                line.append(" " * max(0, w - piece.cell_len))
        out.append(line)
    return out


def _wrapped(title: Text, width: int) -> list[Text]:
    """A panel's title wrapped at spaces to its width, when panels stand side by side."""
    import io

    from rich.console import Console

    lines = title.wrap(Console(file=io.StringIO(), width=width), width)
    return [Text(line.plain, style=title.style, no_wrap=True, overflow="crop") for line in lines]


def gate_lines(tokenizer, g: Gates, opts, screen: Screen, layout: Layout | None = None) -> list[Text]:
    """One layer's trace laid out: a heat map per gate, the cell (or hidden) state, its magnitude over time."""
    layout = layout or Layout()
    ids, offset, trace, kind, layer, ascii = g.ids, g.offset, g.trace, g.kind, g.layer, screen.ascii
    hidden = trace.h.shape[-1]
    labels = [token_label(tokenizer, t, ascii) for t in ids[offset:]]
    unit_w = len(str(hidden - 1)) + 1  # "u17"
    row_w = max(unit_w, 3) + 1
    note_w = 5  # " 0.93": the row's mean over the shown tokens
    panel_width = (screen.width - GAP * (layout.columns - 1)) // layout.columns
    start, stop, cell = fit_map(panel_width, row_w, note_w, offset, len(ids), opts.tokens, opts.end)
    a, b = start - offset, stop - offset
    gates = {name: v[0, a:b].float().cpu().numpy() for name, v in trace.gates.items()}  # (n, H)
    col_labels = [labels[p - offset] for p in range(start, stop)]
    units = g.units
    row_labels = [f"u{u}" for u in units]

    chars = GATES_ASCII_RAMP if ascii else UNICODE_RAMP  # (in ASCII, no glyph of the sign legend)
    how = "chosen" if g.chosen else "whose gates change most"
    sym = "c" if trace.c is not None else "h"
    # the legends first: they stay on screen above the maps instead of scrolling away below them
    lines = [
        legend(ascii, "1", "gates; a gate row's mean is at its right", chars),
        signed_legend(
            ascii,
            f"the {'cell' if sym == 'c' else 'hidden'} state {sym}; each row scaled to its "
            f"largest |{sym}|, shown at its right",
        ),
    ]
    if offset:
        lines.append(
            Text(f"(the gates of the last {len(ids) - offset} of {len(ids)} tokens, from a fresh state)", style="dim")
        )
    lines += [
        Text(
            f"{kind.upper()} layer {layer}: {len(units)} of {hidden} units ({how}) · "
            f"tokens {start}..{stop - 1} of {len(ids)}",
            style="bold",
        )
    ]
    blocks: list[list[Text]] = []  # one per panel: its title, then its map
    for name, title in panels(trace):
        if name in layout.left_out:
            continue
        values = gates[name][:, units].T  # (units, n)
        notes = [f" {m:.2f}" for m in values.mean(axis=1)]
        blocks.append(
            [Text(title, style="bold")]
            + heatmap_lines(
                values, row_labels, col_labels, vmax=1.0, ascii=ascii, cell=cell, row_notes=notes, chars=chars
            )
        )

    if "state" not in layout.left_out:
        # the memory itself: the LSTM's cell state (the GRU's hidden state), signed, then its size over time
        state = (trace.c if trace.c is not None else trace.h)[0, a:b].float().cpu().numpy()  # (n, H)
        name = "cell state c" if trace.c is not None else "hidden state h"
        values = state[:, units].T
        row_max = np.abs(values).max(axis=1)  # each unit on its own scale: a held value reads as an even row
        block = [Text(f"{name}: + orange, − blue (and the glyphs of the sign legend)", style="bold")]
        notes = [" " + (f"{m:.2f}" if m < 10 else f"{m:.1f}" if m < 100 else f"{min(m, 9999):.0f}") for m in row_max]
        block += heatmap_lines(
            np.abs(values), row_labels, col_labels, vmax=row_max, ascii=ascii, cell=cell, signed=values, row_notes=notes
        )
        magnitude = np.abs(state).mean(axis=1)  # (n,) over all units of the layer
        strip = Text(pad(f"|{sym}|", max(unit_w, 3), right=True) + " ", style="bold", no_wrap=True, overflow="crop")
        strip.append_text(spark_line(magnitude, ascii, cell))
        caption = Text(f"|{sym}|: mean |{sym}| over all {hidden} units, up to {magnitude.max():.2f}", style="dim")
        blocks.append([*block, strip, caption])

    if layout.columns == 1:
        for block in blocks:
            lines += [Text(), *block]
    else:
        width = row_w + cell * (stop - start) + note_w
        for first in range(0, len(blocks), layout.columns):
            row = [[*_wrapped(block[0], width), *block[1:]] for block in blocks[first : first + layout.columns]]
            lines += [Text(), *_side_by_side(row, [width] * len(row))]
    if start > 0 or stop < len(ids):
        lines.append(Text(f"showing tokens {start}..{stop - 1}; {screen.move_hint()}", style="dim"))
    if layout.left_out:
        gone = ", ".join("state" if n == "state" else n for n in layout.left_out)
        n = len(layout.left_out)
        lines.append(
            Text(f"{n} panel{'s' * (n > 1)} left out ({gone}): | less or a taller terminal shows all", "yellow")
        )
    return lines


def draw_gates(console: Console, tokenizer, g: Gates, opts, screen: Screen) -> None:
    layout, _ = choose_layout(tokenizer, g, opts, screen, len(g.units))
    print_blocks(console, [gate_lines(tokenizer, g, opts, screen, layout)], screen.ascii)
