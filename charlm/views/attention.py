"""The attention viewer: what each token of the text looked at, as terminal heat maps.

Views (overview, stats and focus combine; the map is shown when none of them is asked for):
  map       one head (layer L, head H) or the mean over a layer's heads: rows = query tokens,
            columns = key tokens, nothing above the diagonal (a token never sees the future)
  overview  every layer × head as a small map, so local (diagonal) and global heads stand out
  stats     per head: attention entropy and mean distance looked back, naming the most local and
            the most global head
  focus     one query token: the keys it attended to most, as bars with weights

The weights and head statistics come from charlm.models.probes (the model's own forward pass); the text
runs as one window, its last `context` tokens. This module only lays them out and prints. Layers and
heads count from 0.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, replace

import numpy as np
from rich import box
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

from charlm.config import ConfigError
from charlm.models.probes import HeadStats, capture_attention, head_stats
from charlm.views.heatmap import (
    ASCII_PROSE,
    MAX_HEADER,
    MAX_LABEL,
    clip_label,
    fit_map,
    heatmap_lines,
    legend,
    level_style,
    pad,
    print_blocks,
    ramp,
    shade_index,
    token_label,
    use_ascii,
    window,
)

OVERVIEW_TOKENS = 24  # tokens per small map in the overview, unless --tokens says otherwise
BAR_EIGHTHS = " ▏▎▍▌▋▊▉█"

USAGE = "try /attn help"
HELP = """/attn                 the last layer, mean over its heads (rows: tokens; columns: what they saw)
/attn L H             layer L, head H (counted from 0)
/attn L               layer L, mean over its heads (also: /attn L mean)
/attn overview        every layer × head as small maps
/attn stats           entropy and mean distance of every head
/attn focus [N|TEXT]  what one token looked at: a position, or text (the last token of its last
                      occurrence); default: the last token
add: tokens N · end N (show the tokens before position N) · top K (focus list)
     abs (weight 1 is darkest, not each row's largest) · ascii (plain characters)"""


@dataclass
class AttnOptions:
    layer: int | None = None  # None: the last layer
    head: int | None = None  # None: the mean over the layer's heads
    mean: bool = False
    overview: bool = False
    stats: bool = False
    focus: str | None = None  # a token position (negative: from the end) or a token's text; "" = last token
    tokens: int | None = None  # how many tokens to show (default: as many as fit)
    end: int | None = None  # show the tokens before this position (default: the end of the text)
    scale: str = "row"  # row: shade relative to each row's largest weight; abs: weight 1 is darkest
    ascii: bool = False
    top: int = 10  # keys listed by the focus view
    height: int | None = None  # the screen's rows: the map and overview shrink to fit (None: no limit)
    flags: bool = False  # hints name the command line's flags (--end N), not the REPL's words (end N)

    @property
    def show_map(self) -> bool:
        # the map unless another view is asked for (the layer/head choice then applies to the focus view)
        return not (self.overview or self.stats or self.focus is not None)


def _int(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"{what} must be a whole number, got '{text}'") from None


def parse_args(args: list[str]) -> AttnOptions:
    """The words after /attn in chat, e.g. [], ["1", "2"], ["overview"], ["focus", "12"], ["stats"]."""
    opts, numbers, i = AttnOptions(), [], 0
    words = {"overview", "stats", "mean", "focus", "tokens", "end", "top", "abs", "row", "ascii"}
    while i < len(args):
        a = args[i].lower()
        if a in ("overview", "stats", "mean", "ascii"):
            setattr(opts, a, True)
        elif a in ("abs", "row"):
            opts.scale = a
        elif a == "focus":
            if i + 1 < len(args) and args[i + 1].lower() not in words:
                opts.focus = args[i + 1]
                i += 1
            else:
                opts.focus = ""
        elif a in ("tokens", "end", "top"):
            if i + 1 >= len(args):
                raise ConfigError(f"'{a}' needs a number after it")
            setattr(opts, a, _int(args[i + 1], a))
            i += 1
        elif a.lstrip("-").isdigit():
            numbers.append(int(a))
        else:
            raise ConfigError(f"unknown /attn argument '{args[i]}': {USAGE}")
        i += 1
    if len(numbers) > 2:
        raise ConfigError(f"/attn takes at most a layer and a head, got {len(numbers)} numbers: {USAGE}")
    if numbers:
        opts.layer = numbers[0]
    if len(numbers) == 2:
        opts.head = numbers[1]
    return opts


def _check_choice(opts: AttnOptions, n_layers: int, n_heads: int) -> tuple[int, int | None]:
    layer = n_layers - 1 if opts.layer is None else opts.layer
    if not 0 <= layer < n_layers:
        raise ConfigError(f"layer {layer} is out of range: this model has layers 0..{n_layers - 1}")
    if opts.head is not None and not 0 <= opts.head < n_heads:
        raise ConfigError(f"head {opts.head} is out of range: each layer has heads 0..{n_heads - 1}")
    if opts.head is not None and opts.mean:
        raise ConfigError("choose one head or the mean over heads, not both")
    if opts.scale not in ("row", "abs"):
        raise ConfigError(f"unknown scale '{opts.scale}': choose row or abs")
    if opts.top < 1:
        raise ConfigError(f"top must be at least 1, got {opts.top}")
    return layer, opts.head


def _title(layer: int, head: int | None, n_heads: int) -> str:
    return f"layer {layer}, head {head}" if head is not None else f"layer {layer}, mean of {n_heads} heads"


def map_lines(
    tokenizer, ids: list[int], offset: int, w: np.ndarray, width: int, opts: AttnOptions, ascii: bool, title: str
) -> list[Text]:
    """The heat map of one (T, T) weight matrix, fitted to `width` cells."""
    labels = [token_label(tokenizer, t, ascii) for t in ids[offset:]]
    digits = len(str(len(ids) - 1))
    label_w = min(MAX_LABEL, max(cell_len(x) for x in labels))
    row_w = digits + 1 + label_w + 1  # "<pos> <token> "
    note_w = 5  # " 0.93": the row's largest weight
    header = min(MAX_HEADER, max(len(x) for x in labels))
    # one row per token: besides them, the legend (2 lines), title, column labels, footer, a note, the prompt
    rows = opts.height - 7 - header if opts.height else None
    start, stop, cell = fit_map(width, row_w, note_w, offset, len(ids), opts.tokens, opts.end, rows)
    n = stop - start
    a, b = start - offset, stop - offset
    values = w[a:b, a:b]
    drawn = np.tril(np.ones((n, n), dtype=bool))  # query i sees keys 0..i: the rest is never drawn
    # each row's scale is its largest weight over every key it saw, also those left of the window, so a
    # row that mostly looks off-screen stays faint
    row_max = w[a:b, :b].max(axis=1)
    vmax = row_max if opts.scale == "row" else 1.0
    row_labels = [
        pad(str(p), digits, right=True) + " " + pad(clip_label(labels[p - offset], label_w, ascii), label_w)
        for p in range(start, stop)
    ]
    notes = [f" {m:.2f}" for m in row_max]
    # the legend first: what the shades mean stays on screen above the map, never scrolls away below it
    what = "each row's largest weight, shown at its right" if opts.scale == "row" else "weight 1"
    lines = [
        legend(ascii, "1" if opts.scale == "abs" else "row max", what),
        Text("rows: each token (query) · columns: the tokens it could see (keys)", style="dim"),
        Text(title, style="bold") + Text(f" · tokens {start}..{stop - 1} of {len(ids)}", style="dim"),
    ]
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
        lines.append(Text(f"showing tokens {start}..{stop - 1}; {_move_hint(opts)}", style="dim"))
    return lines


def _move_hint(opts: AttnOptions) -> str:
    return "move with --end N, size with --tokens N" if opts.flags else "move with end N, size with tokens N"


def overview_lines(
    tokenizer, ids: list[int], offset: int, weights: np.ndarray, width: int, opts: AttnOptions, ascii: bool
) -> list[Text]:
    """Every head as a small map of the last tokens, one row of maps per layer (wrapped to the width)."""
    L, H = weights.shape[:2]
    gap = 2
    # as many tokens as let a layer's heads sit side by side (within 12..24), or --tokens
    size = min(opts.tokens or max(12, min(OVERVIEW_TOKENS, (width + gap) // H - gap)), width)
    if size < 2:
        raise ConfigError(f"width {width} is too narrow for the overview")
    if opts.height and not opts.tokens:  # every layer's row of maps on one screen: smaller maps, down to 6 tokens
        tiles_down = L * -(-H // max(1, (width + gap) // (max(size, 6) + gap)))
        size = max(6, min(size, (opts.height - 6) // tiles_down - 2))
    start, stop = window(offset, len(ids), size, size, opts.end)
    n = stop - start
    tile = max(n, 6)  # room for a title like "L0H1"
    per_line = max(1, (width + gap) // (tile + gap))
    stats = {(s.layer, s.head): s for s in head_stats(weights)}
    chars = ramp(ascii)
    a, b = start - offset, stop - offset
    drawn = np.tril(np.ones((n, n), dtype=bool))
    out = [Text(f"attention overview: {L} layers × {H} heads, tokens {start}..{stop - 1}", style="bold")]
    for layer in range(L):
        for first in range(0, H, per_line):
            heads = range(first, min(H, first + per_line))
            block = [Text(no_wrap=True, overflow="crop") for _ in range(n + 2)]
            for k, head in enumerate(heads):
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
        Text(
            "d: mean distance looked back (tokens) · a bright diagonal is a local head, "
            "spread-out columns a global one",
            style="dim",
        ),
    )
    out += [_extremes(list(stats.values()))]
    return out


def _extremes(stats: list[HeadStats]) -> Text:
    local = min(stats, key=lambda s: s.distance)
    far = max(stats, key=lambda s: s.distance)
    return Text(
        f"most local: L{local.layer}H{local.head} (looks {local.distance:.1f} tokens back) · "
        f"most global: L{far.layer}H{far.head} (looks {far.distance:.1f} tokens back)",
        style="bold",
    )


def stats_table(weights: np.ndarray, ascii: bool, n_tokens: int) -> tuple[Table, Text]:
    stats = head_stats(weights)
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


def _resolve_focus(tokenizer, ids: list[int], offset: int, focus: str) -> int:
    """The position `focus` names: a number (negative: from the end), a token's text (as shown, e.g.
    '␣what', or as written, ' what'), else a piece of the text: the token holding its last character, in
    its last occurrence the model sees. On a miss, the error lists the nearest tokens."""
    if focus == "":
        return len(ids) - 1
    try:
        pos = int(focus)
    except ValueError:
        for p in range(len(ids) - 1, offset - 1, -1):  # the last token with that text
            text = tokenizer.token_bytes(ids[p]).decode("utf-8", errors="replace")
            if focus in (text, token_label(tokenizer, ids[p]), token_label(tokenizer, ids[p], ascii=True)):
                return p
        pieces = [tokenizer.token_bytes(t) for t in ids[offset:]]
        at = b"".join(pieces).rfind(focus.encode("utf-8"))
        if at >= 0:
            last, end = at + len(focus.encode("utf-8")) - 1, 0
            for p, piece in enumerate(pieces):
                end += len(piece)
                if end > last:
                    return offset + p
        if offset and focus.encode("utf-8") in b"".join(tokenizer.token_bytes(t) for t in ids):
            raise ConfigError(
                f"'{focus}' is only in the text before the last {len(ids) - offset} tokens, which the "
                f"model sees: give a position ({offset}..{len(ids) - 1}) or later text"
            ) from None
        shown = sorted({token_label(tokenizer, t) for t in ids[offset:]})
        near = difflib.get_close_matches(focus, shown, n=5, cutoff=0.3)
        hint = f"; nearest tokens: {', '.join(repr(t) for t in near)}" if near else ""
        raise ConfigError(
            f"no '{focus}' in the text the model sees{hint}; or give a position ({offset}..{len(ids) - 1})"
        ) from None
    pos = pos if pos >= 0 else len(ids) + pos
    if not offset <= pos < len(ids):
        raise ConfigError(f"focus position {focus} is outside the text the model sees ({offset}..{len(ids) - 1})")
    return pos


def focus_lines(
    tokenizer, ids: list[int], offset: int, w: np.ndarray, width: int, opts: AttnOptions, ascii: bool, title: str
) -> list[Text]:
    """For one query token: the text before it shaded by attention, then its top keys as bars."""
    q = _resolve_focus(tokenizer, ids, offset, opts.focus)
    row = w[q - offset, : q - offset + 1]  # the keys it could see
    label = token_label(tokenizer, ids[q], ascii)
    out = [Text(f"what did token {q} '", style="bold") + Text(label) + Text(f"' look at? ({title})", style="bold")]
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


def attention_blocks(
    tokenizer, ids: list[int], offset: int, weights: np.ndarray, opts: AttnOptions, width: int, ascii: bool
) -> list[list]:
    """The views chosen in opts, laid out: one block (a list of Text lines or tables) per view."""
    n_layers, n_heads = weights.shape[:2]
    layer, head = _check_choice(opts, n_layers, n_heads)
    w = weights[layer, head] if head is not None else weights[layer].mean(axis=0)
    title = _title(layer, head, n_heads)
    blocks: list[list] = []
    if opts.show_map:
        blocks.append(map_lines(tokenizer, ids, offset, w, width, opts, ascii, title))
    if opts.overview:
        blocks.append(overview_lines(tokenizer, ids, offset, weights, width, opts, ascii))
    if opts.stats:
        blocks.append(list(stats_table(weights, ascii, len(ids) - offset)))
    if opts.focus is not None:
        blocks.append(focus_lines(tokenizer, ids, offset, w, width, opts, ascii, title))
    if offset:
        blocks[0].insert(0, Text(f"(the model sees the last {len(ids) - offset} of {len(ids)} tokens)", style="dim"))
    return blocks


def render_attention(console: Console, model, tokenizer, ids: list[int], opts: AttnOptions) -> None:
    """Capture the attention on the text `ids`, lay out the views chosen in opts, print them."""
    if "attention" not in model.capabilities:
        raise ConfigError("this LSTM/GRU has no attention; try /gates")
    _check_choice(opts, model.cfg.n_layers, model.cfg.n_heads)  # a bad choice fails before the forward pass
    offset, weights = capture_attention(model, ids)
    ascii = use_ascii(console, opts.ascii)
    if opts.height is None and console.is_terminal:  # a screen: fit its height too (a pipe scrolls freely)
        opts = replace(opts, height=console.height)
    print_blocks(console, attention_blocks(tokenizer, ids, offset, weights, opts, console.width, ascii), ascii)


def show_attention(console: Console, model, tokenizer, ids: list[int], args: list[str]) -> None:
    """The chat REPL's /attn [args] on its running text (args: the words after /attn)."""
    if "attention" not in model.capabilities:
        raise ConfigError("this LSTM/GRU has no attention; try /gates")
    if args and args[0].lower() in ("help", "?"):
        console.print(Text(HELP))
        return
    render_attention(console, model, tokenizer, ids, parse_args(args))
