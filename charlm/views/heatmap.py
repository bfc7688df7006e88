"""A terminal heat map: rows × columns of numbers drawn as shade characters (plus colour when the
terminal has it), with token labels along both axes. Shared by the attention and the gate viewers.

The cell -> shade step is the pure function `shade_index`; `shade_grid` applies it to a whole grid and
`heatmap_lines` adds labels and colour. Everything returns rich.text.Text, never markup.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from rich.cells import cell_len
from rich.color import Color
from rich.style import Style
from rich.text import Text

from charlm.errors import ConfigError
from charlm.views.text import safe_text

UNICODE_RAMP = " ·░▒▓█"
ASCII_RAMP = " .:-=+*#%@"
UNICODE_SPARK = " ▁▂▃▄▅▆▇█"  # for one-row strips (e.g. the cell-state magnitude over time)
# Signed values carry their sign in the glyph as well as the colour (piped, NO_COLOR, colour-blind readers):
# blocks for positive, horizontal strokes ("minus" marks) for negative; same number of levels as the ramp
SIGNED_RAMPS = {False: (UNICODE_RAMP, " -─═━▬"), True: (" .+*#@", " ,-~=%")}
# the gate panels' ASCII ramp: none of the sign legend's + - ~ = % nor the space label _ (in ASCII_RAMP, + and
# - were middling gate values beside a cell-state panel where they meant a sign)
GATES_ASCII_RAMP = " .:oO@"

# viridis-like stops: faint purple for small values up to bright yellow for the largest
HEAT_STOPS = [(68, 1, 84), (59, 82, 139), (33, 145, 140), (94, 201, 98), (253, 231, 37)]
POS_STOPS = [(90, 40, 20), (250, 150, 40)]  # signed values: orange for positive...
NEG_STOPS = [(20, 50, 100), (80, 170, 250)]  # ...and blue for negative

VISIBLE = {" ": "␣", "\n": "⏎", "\t": "⇥", "\r": "␍"}
VISIBLE_ASCII = {" ": "_", "\n": "\\n", "\t": "\\t", "\r": "\\r"}
MAX_LABEL = 8  # cells of a row label's token text
MAX_HEADER = 6  # lines of a column label (written downwards)


def use_ascii(console, ascii: bool = False) -> bool:
    """Plain ASCII when asked, or when the terminal's encoding cannot show the Unicode ramp."""
    return ascii or not console.encoding.replace("-", "").startswith("utf")


@dataclass
class Screen:
    """Where a view is drawn. height: the rows a map may fill (None: no limit, as in a pipe); flags: hints
    name the command line's flags (--end N) rather than chat's words (end N)."""

    width: int
    height: int | None = None
    ascii: bool = False
    flags: bool = False

    @classmethod
    def of(cls, console, ascii: bool = False, flags: bool = False) -> Screen:
        """The console's width, its height on a terminal (a pipe scrolls freely), ASCII where it must be."""
        return cls(console.width, console.height if console.is_terminal else None, use_ascii(console, ascii), flags)

    def move_hint(self) -> str:
        return "move with --end N, size with --tokens N" if self.flags else "move with end N, size with tokens N"


# the few non-ASCII characters our own prose uses, one for one (so Text spans stay in place)
ASCII_PROSE = str.maketrans({"·": ".", "×": "x", "→": ">", "−": "-", "…": "~", "—": "-", "–": "-"})


def asciify(text: Text) -> Text:
    """text with our prose's Unicode punctuation swapped for ASCII (labels are ASCII already)."""
    out = text.copy()
    out.plain = text.plain.translate(ASCII_PROSE)
    return out


def ramp(ascii: bool) -> str:
    return ASCII_RAMP if ascii else UNICODE_RAMP


def shade_index(value: float, vmax: float, levels: int) -> int:
    """The ramp position (0..levels-1) of `value` on a scale from 0 to vmax.

    0 (blank) means nothing (value <= 0, or nothing to scale by). Any positive value gets at least the
    faintest mark, and the positive range is cut into levels-1 equal buckets: bucket k (1-based) holds
    values in [(k-1)/(levels-1), k/(levels-1)) * vmax, and vmax itself is the darkest.
    """
    if not (value > 0 and vmax > 0):  # also catches NaN
        return 0
    return 1 + min(levels - 2, int(value / vmax * (levels - 1)))


def shade_grid(values: np.ndarray, vmax, drawn: np.ndarray | None, levels: int) -> np.ndarray:
    """(R, C) int ramp positions. vmax: a number, or one per row (R,); cells where drawn is False are 0."""
    values = np.asarray(values, dtype=np.float64)
    rows = np.broadcast_to(np.asarray(vmax, dtype=np.float64), (values.shape[0],))
    out = np.zeros(values.shape, dtype=np.int64)
    for r in range(values.shape[0]):
        for c in range(values.shape[1]):
            if drawn is None or drawn[r, c]:
                out[r, c] = shade_index(float(values[r, c]), float(rows[r]), levels)
    return out


def _blend(stops: list[tuple[int, int, int]], t: float) -> Color:
    t = min(max(t, 0.0), 1.0) * (len(stops) - 1)
    i = min(int(t), len(stops) - 2)
    f = t - i
    rgb = [round(a + (b - a) * f) for a, b in zip(stops[i], stops[i + 1])]
    return Color.from_rgb(*rgb)


def level_style(level: int, levels: int, negative: bool = False, signed: bool = False) -> Style:
    """The colour of a ramp position; Rich drops it on terminals without colour."""
    if level <= 0:
        return Style()
    t = (level - 1) / max(levels - 2, 1)
    if signed:
        return Style(color=_blend(NEG_STOPS if negative else POS_STOPS, t))
    return Style(color=_blend(HEAT_STOPS, t))


def token_label(tokenizer, token_id: int, ascii: bool = False) -> str:
    """A token as it can be shown in one label: its bytes decoded (not the BPE vocab string with its
    byte markers), whitespace made visible, control characters escaped, and pure ASCII when asked."""
    text = tokenizer.token_bytes(token_id).decode("utf-8", errors="replace")
    visible = VISIBLE_ASCII if ascii else VISIBLE
    text = "".join(visible.get(ch, ch) for ch in text)
    text = safe_text(text)
    if ascii:
        text = text.encode("ascii", "backslashreplace").decode("ascii")
    return text or "∅"


def clip_label(label: str, width: int, ascii: bool = False) -> str:
    """label cut to `width` terminal cells (with an ellipsis when cut)."""
    if cell_len(label) <= width:
        return label
    more = "~" if ascii else "…"
    out = ""
    for ch in label:
        if cell_len(out + ch) > width - 1:
            break
        out += ch
    return out + more


def pad(text: str, width: int, right: bool = False) -> str:
    gap = " " * max(0, width - cell_len(text))
    return gap + text if right else text + gap


def column_header(labels: list[str], cell: int, max_lines: int, ascii: bool) -> list[str]:
    """Column labels written downwards, one character per line at the start of their `cell`-wide column:
    a char model's text reads along the first line, a BPE token down its column (cut with an ellipsis
    after max_lines). Split into pieces `cell` wide, a token would read as a stack of fragments."""
    columns = []
    for label in labels:
        pieces = [ch if 0 < cell_len(ch) == 1 else "?" for ch in label]  # a combining or wide char breaks the grid
        if len(pieces) > max_lines:
            pieces = pieces[: max_lines - 1] + ["~" if ascii else "…"]
        columns.append(pieces)
    height = max((len(p) for p in columns), default=0)
    return ["".join(pad(p[i] if i < len(p) else "", cell) for p in columns) for i in range(height)]


def heatmap_lines(
    values: np.ndarray,
    row_labels: list[str],
    col_labels: list[str],
    *,
    vmax,
    drawn: np.ndarray | None = None,
    ascii: bool = False,
    cell: int = 1,
    signed: np.ndarray | None = None,
    row_notes: list[str] | None = None,
    header_lines: int = MAX_HEADER,
    chars: str | None = None,
) -> list[Text]:
    """The map as lines of Text: the column labels on top, then one line per row:
    `<row label> <cells> <note>`. `values` are magnitudes (>= 0); `signed` (same shape, optional)
    draws negative cells with the negative ramp in blue, positive ones in orange (SIGNED_RAMPS)."""
    chars = (chars or ramp(ascii)) if signed is None else SIGNED_RAMPS[ascii][0]
    levels = len(chars)
    grid = shade_grid(values, vmax, drawn, levels)
    label_w = max((cell_len(x) for x in row_labels), default=0)
    # grid lines never wrap: a wrapped row would break the grid (callers fit them to the width)
    lines = [
        Text(" " * (label_w + 1) + h, style="dim", no_wrap=True, overflow="crop")
        for h in column_header(col_labels, cell, header_lines, ascii)
    ]
    for r, label in enumerate(row_labels):
        line = Text(pad(label, label_w, right=True) + " ", style="bold", no_wrap=True, overflow="crop")
        for c in range(grid.shape[1]):
            level = int(grid[r, c])
            negative = signed is not None and signed[r, c] < 0
            glyph = SIGNED_RAMPS[ascii][1][level] if negative else chars[level]
            line.append(glyph * cell, level_style(level, levels, negative, signed is not None))
        if row_notes:
            line.append(row_notes[r], "dim")
        lines.append(line)
    return lines


def legend(ascii: bool, vmax_text: str, what: str, chars: str | None = None) -> Text:
    """`scale: ·░▒▓█ 0 → <vmax_text> (<what>)` with each level in its colour (chars: another ramp's)."""
    chars = chars or ramp(ascii)
    t = Text("scale: ", style="dim")
    for level in range(1, len(chars)):
        t.append(chars[level], level_style(level, len(chars)))
    t.append(f"  from 0 to {vmax_text}", style="dim")
    if what:
        t.append(f"  ({what})", style="dim")
    return t


def signed_legend(ascii: bool, what: str) -> Text:
    """`+ ·░▒▓█  − -─═━▬` in their colours: how a signed map shows the sign without colour."""
    pos_chars, neg_chars = SIGNED_RAMPS[ascii]
    t = Text("sign: + ", style="dim")
    for level in range(1, len(pos_chars)):
        t.append(pos_chars[level], level_style(level, len(pos_chars), False, True))
    t.append("  − ", style="dim")
    for level in range(1, len(neg_chars)):
        t.append(neg_chars[level], level_style(level, len(neg_chars), True, True))
    if what:
        t.append(f"  ({what})", style="dim")
    return t


def spark_line(values: np.ndarray, ascii: bool, cell: int = 1) -> Text:
    """One row of values (>= 0) as bar heights, scaled to their maximum, `cell` characters each."""
    chars = ASCII_RAMP if ascii else UNICODE_SPARK
    vmax = float(np.max(values)) if len(values) else 0.0
    line = Text(no_wrap=True, overflow="crop")
    for v in values:
        level = shade_index(float(v), vmax, len(chars))
        line.append(chars[level] * cell, level_style(level, len(chars)))
    return line


def window(first: int, n_total: int, available: int, tokens: int | None, end: int | None) -> tuple[int, int]:
    """[start, stop) of the token positions to show, within [first, n_total): the last ones that fit
    `available` columns, or `tokens` of them, ending before `end` (negative: counted from the end)."""
    if tokens is not None and tokens < 1:
        raise ConfigError(f"tokens must be at least 1, got {tokens}")
    stop = n_total if end is None else (end if end >= 0 else n_total + end)
    if not first < stop <= n_total:
        raise ConfigError(f"end {end} is outside the tokens shown ({first + 1}..{n_total})")
    n = min(stop - first, available, tokens if tokens is not None else stop)
    return stop - n, stop


def fit_map(
    width: int,
    row_w: int,
    note_w: int,
    first: int,
    n_total: int,
    tokens: int | None,
    end: int | None,
    max_rows: int | None = None,
    max_cell: int = 2,
) -> tuple[int, int, int]:
    """(start, stop, cell) for a map `width` cells wide with row labels row_w and row notes note_w wide:
    the token positions [start, stop) shown (see `window`; at most max_rows of them unless `tokens` asks,
    so a map whose rows are tokens fits the screen's height) and the cells per column (two look square;
    one when space is short; up to max_cell when the width has room for them: the map uses the width given)."""
    available = width - row_w - note_w
    if available < 2:
        raise ConfigError(f"width {width} is too narrow for the map: use at least {row_w + note_w + 2}")
    fits = available if max_rows is None or tokens is not None else max(2, min(available, max_rows))
    start, stop = window(first, n_total, fits, tokens, end)
    return start, stop, max(1, min(max_cell, available // (stop - start)))


def height_of(lines: list, width: int) -> int:
    """Terminal lines `lines` take at this width: prose wraps at spaces (as Rich prints it), a grid line never
    wraps (it is cropped)."""
    import io

    from rich.console import Console

    console = Console(file=io.StringIO(), width=width)
    return sum(1 if line.no_wrap else max(1, len(line.wrap(console, width))) for line in lines)


def print_blocks(console, blocks: list, ascii: bool) -> None:
    """Print laid-out blocks (lists of Text lines or other renderables), a blank line between blocks."""
    for k, block in enumerate(blocks):
        if k:
            console.print()
        for item in block:
            console.print(asciify(item) if ascii and isinstance(item, Text) else item)
