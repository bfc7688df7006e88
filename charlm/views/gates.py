"""The gate viewer: an LSTM's forget / input / output gates (a GRU's update / reset gates) over the
text, for the units that change most, plus the cell state and its magnitude over time.

Each panel is a heat map: rows = units, columns = tokens. Gates run from 0 (blank) to 1 (darkest).
The numbers come from charlm.commands.look.gates (the gates recomputed from the trained weights step by
step, from a fresh state at the start of the text's last MAX_GATE_TOKENS tokens); this module lays them out
and prints. Layers and units count from 0.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np
from rich.console import Console
from rich.text import Text

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
    """How many units let every panel fit a screen of this height (None: no limit): each map is a blank
    line, its title, the column labels and one row per unit."""
    if not height:
        return None
    n_maps = gates_shown + 1  # the gates, then the state
    return max(1, (height - 9) // n_maps - 2 - MAX_HEADER)


def units_that_fit(tokenizer, ids: list[int], kind: str, layer: int, trace, opts, screen: Screen) -> int | None:
    """How many units let the whole view fit the screen's height (None: no limit, as in a pipe), measured by
    laying it out with one unit: what its titles, legends and column labels take at this width, wrapped."""
    if not screen.height:
        return None
    from charlm.models.probes import Gates  # (a trace exists: torch is loaded already)

    trial = Gates(ids, len(ids) - trace.h.shape[1], kind, layer, trace, [0], False)
    used = height_of(gate_lines(tokenizer, trial, opts, replace(screen, height=None)), screen.width) + 1  # + prompt
    return max(1, 1 + (screen.height - used) // (len(panels(trace)) + 1))


def gate_lines(tokenizer, g: Gates, opts, screen: Screen) -> list[Text]:
    """One layer's trace laid out: a heat map per gate, the cell (or hidden) state, its magnitude over time."""
    ids, offset, trace, kind, layer, ascii = g.ids, g.offset, g.trace, g.kind, g.layer, screen.ascii
    hidden = trace.h.shape[-1]
    labels = [token_label(tokenizer, t, ascii) for t in ids[offset:]]
    unit_w = len(str(hidden - 1)) + 1  # "u17"
    row_w = max(unit_w, 3) + 1
    note_w = 5  # " 0.93": the row's mean over the shown tokens
    start, stop, cell = fit_map(screen.width, row_w, note_w, offset, len(ids), opts.tokens, opts.end)
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
    for name, title in panels(trace):
        values = gates[name][:, units].T  # (units, n)
        notes = [f" {m:.2f}" for m in values.mean(axis=1)]
        lines += [Text(), Text(title, style="bold")]
        lines += heatmap_lines(
            values, row_labels, col_labels, vmax=1.0, ascii=ascii, cell=cell, row_notes=notes, chars=chars
        )

    # the memory itself: the LSTM's cell state (the GRU's hidden state), signed, then its size over time
    state = (trace.c if trace.c is not None else trace.h)[0, a:b].float().cpu().numpy()  # (n, H)
    name = "cell state c" if trace.c is not None else "hidden state h"
    values = state[:, units].T
    row_max = np.abs(values).max(axis=1)  # each unit on its own scale: a held value reads as an even row
    lines += [Text(), Text(f"{name}: + orange, − blue (and the glyphs of the sign legend)", style="bold")]
    notes = [" " + (f"{m:.2f}" if m < 10 else f"{m:.1f}" if m < 100 else f"{min(m, 9999):.0f}") for m in row_max]
    lines += heatmap_lines(
        np.abs(values), row_labels, col_labels, vmax=row_max, ascii=ascii, cell=cell, signed=values, row_notes=notes
    )
    magnitude = np.abs(state).mean(axis=1)  # (n,) over all units of the layer
    strip = Text(pad(f"|{sym}|", max(unit_w, 3), right=True) + " ", style="bold", no_wrap=True, overflow="crop")
    strip.append_text(spark_line(magnitude, ascii, cell))
    lines += [strip, Text(f"|{sym}|: mean |{sym}| over all {hidden} units, up to {magnitude.max():.2f}", style="dim")]
    if start > 0 or stop < len(ids):
        lines.append(Text(f"showing tokens {start}..{stop - 1}; {screen.move_hint()}", style="dim"))
    return lines


def draw_gates(console: Console, tokenizer, g: Gates, opts, screen: Screen) -> None:
    print_blocks(console, [gate_lines(tokenizer, g, opts, screen)], screen.ascii)
