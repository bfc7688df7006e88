"""The attention viewer: what each token of the text looked at, as terminal heat maps.

Views (overview, stats and focus combine; the map is shown when none of them is asked for):
  map       one head (layer L, head H) or the mean over a layer's heads: rows = query tokens,
            columns = key tokens, nothing above the diagonal (a token never sees the future)
  overview  every layer × head as a small map, so local (diagonal) and global heads stand out
  stats     per head: attention entropy and mean distance looked back, naming the most local and
            the most global head
  focus     one query token: the keys it attended to most, as bars with weights

The numbers come from charlm.commands.look.attention (the model's own forward pass over the text's last
`context` tokens, and every head's statistics); this module only lays them out and prints. Layers and
heads count from 0.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from rich import box
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

from charlm.errors import ConfigError
from charlm.options import AttnConfig
from charlm.views.heatmap import (
    ASCII_PROSE,
    MAX_HEADER,
    MAX_LABEL,
    Screen,
    clip_label,
    fit_map,
    heatmap_lines,
    height_of,
    legend,
    level_style,
    pad,
    print_blocks,
    ramp,
    shade_index,
    token_label,
    window,
)

D_NOTE = Text(
    "d: mean distance looked back (tokens) · a bright diagonal is a local head, spread-out columns a global one",
    style="dim",
)
OVERVIEW_MAX = 64  # tokens per small map on a terminal large enough for them
OVERVIEW_TOKENS = 24  # tokens per small map in the overview, unless --tokens says otherwise
BAR_EIGHTHS = " ▏▎▍▌▋▊▉█"

if TYPE_CHECKING:  # (the probe's results are only drawn here: importing a view loads no torch)
    from charlm.models.probes import Attention, HeadStats


def _title(att: Attention) -> str:
    n_heads = att.weights.shape[1]
    return (
        f"layer {att.layer}, head {att.head}" if att.head is not None else f"layer {att.layer}, mean of {n_heads} heads"
    )


MAX_CELL = 4  # characters per column the map may widen to, to use a wide terminal


def map_lines(tokenizer, att: Attention, opts: AttnConfig, screen: Screen) -> list[Text]:
    """The heat map of the chosen head (or layer mean), fitted to the screen: its width, and on a terminal its
    height, measured with the legends and titles as they wrap at this width (nothing scrolls off the top)."""
    labels = [token_label(tokenizer, t, screen.ascii) for t in att.ids[att.offset :]]
    header = min(MAX_HEADER, max(len(x) for x in labels))
    if not screen.height:
        return _map_lines(tokenizer, att, opts, screen, labels, None)
    # the prompt after it, and the line above it when the model sees only the text's last tokens
    room = screen.height - 1 - (1 if att.offset else 0)
    rows = room - 6 - header  # a first guess: legend, rows line, title, footer, column labels
    for _ in range(4):
        lines = _map_lines(tokenizer, att, opts, screen, labels, max(2, rows))
        over = height_of(lines, screen.width) - room
        if over <= 0 or rows <= 2:
            break
        rows -= over
    return lines


def _map_lines(tokenizer, att: Attention, opts: AttnConfig, screen: Screen, labels, rows) -> list[Text]:
    ids, offset, w, ascii = att.ids, att.offset, att.chosen, screen.ascii
    digits = len(str(len(ids) - 1))
    label_w = min(MAX_LABEL, max(cell_len(x) for x in labels))
    row_w = digits + 1 + label_w + 1  # "<pos> <token> "
    note_w = 5  # " 0.93": the row's largest weight
    start, stop, cell = fit_map(
        screen.width, row_w, note_w, offset, len(ids), opts.tokens, opts.end, rows, max_cell=MAX_CELL
    )
    first = start  # the first query row: on a terminal its height limits the rows, never the columns
    if rows is not None and opts.tokens is None:
        # columns: as many keys as fit in cells two wide (wider for a short text); rows: the last queries the
        # height holds, each looking at keys that reach back past the first row
        start, stop = window(offset, len(ids), max(2, (screen.width - row_w - note_w) // 2), None, opts.end)
        cell = max(1, min(MAX_CELL, (screen.width - row_w - note_w) // (stop - start)))
        first = max(start, stop - max(2, rows))
    a, b, q = start - offset, stop - offset, first - offset
    values = w[q:b, a:b]
    # query first + i sees keys start .. first + i: the rest is never drawn
    drawn = np.arange(start, stop)[None, :] <= np.arange(first, stop)[:, None]
    # each row's scale is its largest weight over every key it saw, also those left of the window, so a
    # row that mostly looks off-screen stays faint: its note says so with an arrow
    row_max = w[q:b, :b].max(axis=1)
    off_screen = w[q:b, :b].argmax(axis=1) < a
    vmax = row_max if opts.scale == "row" else 1.0
    row_labels = [
        pad(str(p), digits, right=True) + " " + pad(clip_label(labels[p - offset], label_w, ascii), label_w)
        for p in range(first, stop)
    ]
    left = "<" if ascii else "←"
    notes = [f"{left if off else ' '}{m:.2f}" for m, off in zip(row_max, off_screen)]
    # the legend first: what the shades mean stays on screen above the map, never scrolls away below it
    what = "each row's largest weight, shown at its right" if opts.scale == "row" else "weight 1"
    lines = [
        legend(ascii, "1" if opts.scale == "abs" else "row max", what),
        Text("rows: each token (query) · columns: the tokens it could see (keys)", style="dim"),
    ]
    if off_screen.any():
        lines.append(Text(f"{left}: the row's largest weight is on a token left of the window", style="dim"))
    shown = f" · tokens {start}..{stop - 1} of {len(ids)}" + (f" (rows from {first})" if first > start else "")
    lines.append(Text(_title(att), style="bold") + Text(shown, style="dim"))
    lines += heatmap_lines(
        values,
        row_labels,
        [labels[p - offset] for p in range(start, stop)],
        vmax=vmax,
        drawn=drawn,
        ascii=ascii,
        cell=cell,
        row_notes=notes,
    )
    if start > 0 or stop < len(ids):
        lines.append(Text(f"showing tokens {start}..{stop - 1}; {screen.move_hint()}", style="dim"))
    return lines


def overview_lines(tokenizer, att: Attention, opts: AttnConfig, screen: Screen) -> list[Text]:
    """Every head as a small map of the last tokens, layer after layer, as many side by side as the width
    holds; on a terminal the maps take the largest size (6..64 tokens) that lets all of them fit its height."""
    ids, offset, weights, width, ascii = att.ids, att.offset, att.weights, screen.width, screen.ascii
    L, H = weights.shape[:2]
    gap = 2
    # as many tokens as let a layer's heads sit side by side (within 12..24), or --tokens
    size = min(opts.tokens or max(12, min(OVERVIEW_TOKENS, (width + gap) // H - gap)), width)
    if size < 2:
        raise ConfigError(f"width {width} is too narrow for the overview")
    first_layer = 0  # on a screen too short for every layer's maps, the first ones are left out (a hint says so)
    if screen.height and not opts.tokens:  # every map on one screen: the largest size that fits, down to 6 tokens
        title = Text(f"attention overview: {L} layers × {H} heads, tokens {len(ids)}..{len(ids)}")
        # the title, the notes as they wrap at this width, the text line, a line above when the text is longer
        # than the context, and the shell's prompt after
        prose = height_of([title, D_NOTE, _extremes(att.stats)], width) + 2 + (1 if offset else 0)

        def tall(k: int, layers: int = L) -> int:  # lines the maps of k tokens take, and the prose
            per_line = max(1, (width + gap) // (max(k, 6) + gap))
            return -(-layers * H // per_line) * (k + 2) + prose

        most = min(OVERVIEW_MAX, len(ids) - offset)  # a wide, tall terminal: larger maps, up to the text shown
        size = max([k for k in range(6, most + 1) if k <= width and tall(k) <= screen.height] or [6])
        if tall(size) > screen.height:
            hint = height_of([_left_out(L - 1, L, ascii)], width)
            first_layer = L - max([n for n in range(1, L) if tall(size, n) + hint <= screen.height] or [1])
    start, stop = window(offset, len(ids), size, size, opts.end)
    n = stop - start
    tile = max(n, 6)  # room for a title like "L0H1"
    per_line = max(1, (width + gap) // (tile + gap))
    stats = {(s.layer, s.head): s for s in att.stats}
    chars = ramp(ascii)
    a, b = start - offset, stop - offset
    drawn = np.tril(np.ones((n, n), dtype=bool))
    out = [Text(f"attention overview: {L} layers × {H} heads, tokens {start}..{stop - 1}", style="bold")]
    maps = [(layer, head) for layer in range(first_layer, L) for head in range(H)]
    for first in range(0, len(maps), per_line):
        block = [Text(no_wrap=True, overflow="crop") for _ in range(n + 2)]
        for k, (layer, head) in enumerate(maps[first : first + per_line]):
            s = stats[(layer, head)]
            if k:
                for line in block:
                    line.append(" " * gap)
            block[0].append(pad(clip_label(f"L{layer}H{head}", tile, ascii), tile), "bold")
            block[1].append(pad(clip_label(f"d {s.distance:.1f}", tile, ascii), tile), "dim")
            values = weights[layer, head, a:b, a:b]
            row_max = np.where(drawn, values, 0).max(axis=1)
            for r in range(n):
                line = block[r + 2]
                for c in range(n):
                    level = shade_index(float(values[r, c]), float(row_max[r]), len(chars)) if drawn[r, c] else 0
                    line.append(chars[level], level_style(level, len(chars)))
                line.append(" " * (tile - n))
        out += block
    text = "".join(token_label(tokenizer, t, ascii) for t in ids[start:stop])
    out.append(Text("text: ", style="dim") + Text(clip_label(text, max(1, width - 6), ascii)))
    out.insert(
        1,
        D_NOTE,
    )
    out += [_extremes(att.stats)]
    if first_layer:
        out.append(_left_out(first_layer, L, ascii))
    return out


def _left_out(first_layer: int, n_layers: int, ascii: bool) -> Text:
    """The overview's hint when the screen's height holds only its last layers."""
    which = "layer 0" if first_layer == 1 else f"layers 0..{first_layer - 1}"
    return Text(f"{which} of {n_layers} left out (no room): | less or a taller terminal shows all", style="yellow")


def _extremes(stats: list[HeadStats]) -> Text:
    local = min(stats, key=lambda s: s.distance)
    far = max(stats, key=lambda s: s.distance)
    return Text(
        f"most local: L{local.layer}H{local.head} (looks {local.distance:.1f} tokens back) · "
        f"most global: L{far.layer}H{far.head} (looks {far.distance:.1f} tokens back)",
        style="bold",
    )


def stats_table(stats: list[HeadStats], ascii: bool, n_tokens: int) -> tuple[Table, Text]:
    local = min(stats, key=lambda s: s.distance)
    far = max(stats, key=lambda s: s.distance)
    # narrow headers, so the table keeps one line per head at 60 columns; the legend line says what they mean
    table = Table(
        title=f"attention heads over {n_tokens} tokens",
        title_justify="left",
        box=box.ASCII if ascii else box.SIMPLE_HEAD,
        caption=Text(STATS_LEGEND.translate(ASCII_PROSE) if ascii else STATS_LEGEND, style="dim"),
        caption_justify="left",
    )
    table.add_column("head", no_wrap=True)
    table.add_column("entropy", justify="right", no_wrap=True)
    table.add_column("distance", justify="right", no_wrap=True)
    table.add_column("top key", justify="right", no_wrap=True)
    table.add_column("", no_wrap=True)
    for s in stats:
        where = {0: "itself", 1: "previous"}.get(s.offset, f"{s.offset} back")
        tag = "most local" if s is local else "most global" if s is far else ""
        table.add_row(
            f"L{s.layer}H{s.head}",
            f"{s.entropy:.2f}",
            f"{s.distance:.1f}",
            f"{where} {s.offset_share:.0%}",
            tag,
            style="bold" if tag else None,
        )
    return table, _extremes(stats)


STATS_LEGEND = (
    "entropy (bits): low = focused on a few tokens, high = spread out (diffuse) · distance: tokens looked "
    "back, on average · top key: where each token's strongest key most often is (previous = the token "
    "just before it) and how often"
)


def focus_lines(tokenizer, att: Attention, opts: AttnConfig, screen: Screen) -> list[Text]:
    """For the focus token: the text before it shaded by attention, then its top keys as bars."""
    ids, offset, q, width, ascii = att.ids, att.offset, att.focus, screen.width, screen.ascii
    row = att.chosen[q - offset, : q - offset + 1]  # the keys it could see
    label = token_label(tokenizer, ids[q], ascii)
    out = [
        Text(f"what did token {q} '", style="bold") + Text(label) + Text(f"' look at? ({_title(att)})", style="bold")
    ]
    # the text leading up to it, each token shaded underneath by the weight it got
    chars = ramp(ascii)
    top_w = float(row.max())
    first, used = q + 1, 0
    while first > offset:  # as many tokens before it as fit the width
        lab = clip_label(token_label(tokenizer, ids[first - 1], ascii), MAX_LABEL, ascii)
        if used + cell_len(lab) > width:
            break
        first, used = first - 1, used + cell_len(lab)
    text_line, shade_line = Text(no_wrap=True, overflow="crop"), Text(no_wrap=True, overflow="crop")
    for p in range(first, q + 1):
        lab = clip_label(token_label(tokenizer, ids[p], ascii), MAX_LABEL, ascii)
        level = shade_index(float(row[p - offset]), top_w, len(chars))
        text_line.append(lab, "reverse" if p == q else "")
        shade_line.append(chars[level] * cell_len(lab), level_style(level, len(chars)))
    out += [text_line, shade_line]
    # the top keys as a bar list
    order = np.argsort(-row, kind="stable")[: opts.top]
    digits = len(str(len(ids) - 1))
    label_w = min(MAX_LABEL, max(cell_len(token_label(tokenizer, ids[offset + k], ascii)) for k in order))
    bar_w = max(1, width - (digits + 1 + label_w + 1) - 16)
    for k in order:
        p = offset + int(k)
        weight = float(row[k])
        back = q - p
        where = "itself" if back == 0 else f"{back} back"
        line = Text(pad(str(p), digits, right=True) + " ", style="dim", no_wrap=True, overflow="crop")
        line.append(pad(clip_label(token_label(tokenizer, ids[p], ascii), label_w, ascii), label_w) + " ", "bold")
        line.append(pad(_bar(weight / top_w if top_w > 0 else 0.0, bar_w, ascii), bar_w), "cyan")
        line.append(f" {weight:.3f} " + pad(where, 9), "dim")
        out.append(line)
    return out


def _bar(fraction: float, width: int, ascii: bool) -> str:
    if ascii:
        return "#" * max(1, round(fraction * width))
    eighths = max(1, round(fraction * width * 8))
    return "█" * (eighths // 8) + (BAR_EIGHTHS[eighths % 8] if eighths % 8 else "")


def attention_blocks(tokenizer, att: Attention, opts: AttnConfig, screen: Screen) -> list[list]:
    """The views chosen in opts, laid out: one block (a list of Text lines or tables) per view."""
    blocks: list[list] = []
    if opts.show_map:
        blocks.append(map_lines(tokenizer, att, opts, screen))
    if opts.overview:
        blocks.append(overview_lines(tokenizer, att, opts, screen))
    if opts.stats:
        blocks.append(list(stats_table(att.stats, screen.ascii, len(att.ids) - att.offset)))
    if att.focus is not None:
        blocks.append(focus_lines(tokenizer, att, opts, screen))
    if att.offset:
        n = len(att.ids)
        blocks[0].insert(0, Text(f"(the model sees the last {n - att.offset} of {n} tokens)", style="dim"))
    return blocks


def draw_attention(console: Console, tokenizer, att: Attention, opts: AttnConfig, screen: Screen) -> None:
    print_blocks(console, attention_blocks(tokenizer, att, opts, screen), screen.ascii)
