"""The gate viewer: an LSTM's forget / input / output gates (a GRU's update / reset gates) over the
text, for the units that change most, plus the cell state and its magnitude over time.

Each panel is a heat map: rows = units, columns = tokens. Gates run from 0 (blank) to 1 (darkest).
The gates are recomputed from the trained weights step by step (charlm.models.probes.trace_gates), from
a fresh state at the start of the text (its last MAX_GATE_TOKENS tokens); this module lays them out and
prints. Layers and
units count from 0.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from rich.console import Console
from rich.text import Text

from charlm.config import ConfigError
from charlm.models.probes import LayerTrace, trace_gates
from charlm.views.heatmap import (
    MAX_HEADER,
    fit_map,
    heatmap_lines,
    legend,
    pad,
    print_blocks,
    signed_legend,
    spark_line,
    token_label,
    use_ascii,
)

DEFAULT_UNITS = 8

USAGE = "try /gates help"
HELP = """/gates                 the last layer: the 8 units whose gates change most
/gates L               layer L (counted from 0)
/gates units N         the N units whose gates change most
/gates units 3,17,42   exactly these units (one unit: 5,)
add: tokens N · end N (show the tokens before position N) · ascii (plain characters)"""

PANELS = {  # (gate, title) in the order drawn
    "lstm": [
        ("forget", "forget gate f: 1 keeps the cell's value, 0 erases it"),
        ("input", "input gate i: how much new value is written"),
        ("output", "output gate o: how much of the cell is shown"),
    ],
    "gru": [
        ("update", "update gate z: 1 keeps the old state, 0 replaces it"),
        ("reset", "reset gate r: 0 ignores the old state when proposing a new one"),
    ],
}


@dataclass
class GateOptions:
    layer: int | None = None  # None: the last layer
    units: int | list[int] | None = None  # how many (the ones that change most), or which; None: 8 (or all)
    tokens: int | None = None
    end: int | None = None
    ascii: bool = False
    height: int | None = None  # the screen's rows: fewer units by default so every panel fits (None: no limit)
    flags: bool = False  # hints name the command line's flags (--end N), not the REPL's words (end N)


def parse_units(text: str) -> int | list[int]:
    """'8' -> the 8 units that change most; '3,17,42' (or '5,') -> exactly those."""
    try:
        if "," in text:
            return [int(u) for u in text.split(",") if u.strip()]
        return int(text)
    except ValueError:
        raise ConfigError(f"units must be a count like 8 or a list like 3,17,42, got '{text}'") from None


def parse_args(args: list[str]) -> GateOptions:
    """The words after /gates in chat, e.g. [], ["1"], ["units", "3,17"], ["tokens", "40"]."""
    opts, i = GateOptions(), 0
    while i < len(args):
        a = args[i].lower()
        if a == "ascii":
            opts.ascii = True
        elif a in ("units", "tokens", "end"):
            if i + 1 >= len(args):
                raise ConfigError(f"'{a}' needs a value after it")
            value = args[i + 1]
            if a == "units":
                opts.units = parse_units(value)
            elif value.lstrip("-").isdigit():
                setattr(opts, a, int(value))
            else:
                raise ConfigError(f"{a} must be a whole number, got '{value}'")
            i += 1
        elif a.lstrip("-").isdigit() and opts.layer is None:
            opts.layer = int(a)
        else:
            raise ConfigError(f"unknown /gates argument '{args[i]}': {USAGE}")
        i += 1
    return opts


def choose_units(gates: dict[str, np.ndarray], kind: str, units: int | list[int] | None, hidden: int) -> list[int]:
    """Units to show: the given ones, or the `units` whose gates vary most over the shown tokens
    (sum over the panels' gates of each unit's standard deviation over time)."""
    if isinstance(units, list):
        if not units:
            raise ConfigError("give at least one unit")
        bad = [u for u in units if not 0 <= u < hidden]
        if bad:
            raise ConfigError(f"unit {bad[0]} is out of range: this layer has units 0..{hidden - 1}")
        return units
    if units is None:
        units = min(DEFAULT_UNITS, hidden)
    if not 1 <= units <= hidden:
        raise ConfigError(f"units must be between 1 and {hidden} (this layer's size), got {units}")
    change = sum(gates[name].std(axis=0) for name, _ in PANELS[kind])  # (H,)
    return [int(u) for u in np.argsort(-change, kind="stable")[:units]]


def gate_lines(
    tokenizer,
    ids: list[int],
    offset: int,
    trace: LayerTrace,
    kind: str,
    layer: int,
    opts: GateOptions,
    width: int,
    ascii: bool,
) -> list[Text]:
    """One layer's trace laid out: a heat map per gate, the cell (or hidden) state, its magnitude over time."""
    hidden = trace.h.shape[-1]
    labels = [token_label(tokenizer, t, ascii) for t in ids[offset:]]
    unit_w = len(str(hidden - 1)) + 1  # "u17"
    row_w = max(unit_w, 3) + 1
    note_w = 5  # " 0.93": the row's mean over the shown tokens
    start, stop, cell = fit_map(width, row_w, note_w, offset, len(ids), opts.tokens, opts.end)
    a, b = start - offset, stop - offset
    gates = {name: v[0, a:b].float().cpu().numpy() for name, v in trace.gates.items()}  # (n, H)
    col_labels = [labels[p - offset] for p in range(start, stop)]
    header = min(MAX_HEADER, max(len(x) for x in col_labels))
    n_maps = len(PANELS[kind]) + 1  # the gates, then the state
    units = opts.units
    if units is None and opts.height:  # each map: a blank, its title, the column labels, one row per unit
        units = max(1, min(DEFAULT_UNITS, hidden, (opts.height - 9) // n_maps - 2 - header))
    units = choose_units(gates, kind, units, hidden)
    row_labels = [f"u{u}" for u in units]

    how = "chosen" if isinstance(opts.units, list) else "whose gates change most"
    sym = "c" if trace.c is not None else "h"
    # the legends first: they stay on screen above the maps instead of scrolling away below them
    lines = [
        legend(ascii, "1", "gates; a gate row's mean is at its right"),
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
    for name, title in PANELS[kind]:
        values = gates[name][:, units].T  # (units, n)
        notes = [f" {m:.2f}" for m in values.mean(axis=1)]
        lines += [Text(), Text(title, style="bold")]
        lines += heatmap_lines(values, row_labels, col_labels, vmax=1.0, ascii=ascii, cell=cell, row_notes=notes)

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
        move = "--end N, size with --tokens N" if opts.flags else "end N, size with tokens N"
        lines.append(Text(f"showing tokens {start}..{stop - 1}; move with {move}", style="dim"))
    return lines


def render_gates(console: Console, model, tokenizer, ids: list[int], opts: GateOptions) -> None:
    """Trace the gates on the text `ids`, lay out the layer chosen in opts, print it."""
    if "gates" not in model.capabilities:
        raise ConfigError("a transformer has no gates; try /attn")
    if not ids:
        raise ConfigError("there is no text to look at yet: give a prompt first")
    cfg = model.cfg
    layer = cfg.n_layers - 1 if opts.layer is None else opts.layer
    if not 0 <= layer < cfg.n_layers:
        raise ConfigError(f"layer {layer} is out of range: this model has layers 0..{cfg.n_layers - 1}")
    offset, traces = trace_gates(model, ids)
    ascii = use_ascii(console, opts.ascii)
    if opts.height is None and console.is_terminal:  # a screen: fit its height too (a pipe scrolls freely)
        opts = replace(opts, height=console.height)
    print_blocks(
        console, [gate_lines(tokenizer, ids, offset, traces[layer], cfg.kind, layer, opts, console.width, ascii)], ascii
    )


def show_gates(console: Console, model, tokenizer, ids: list[int], args: list[str]) -> None:
    """The chat REPL's /gates [args] on its running text (args: the words after /gates)."""
    if "gates" not in model.capabilities:
        raise ConfigError("a transformer has no gates; try /attn")
    if args and args[0].lower() in ("help", "?"):
        console.print(Text(HELP))
        return
    render_gates(console, model, tokenizer, ids, parse_args(args))
