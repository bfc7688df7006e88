"""`charlm compare` on the screen: the models' continuations in columns as the tokens arrive (plain blocks
when the output is not a terminal), then a table of what each model is and how it did (also after each
prompt of `compare --interactive`, whose input loop is charlm.commands.compare).

The generation itself, round-robin with per-model timing, is charlm.comparison, run by commands.compare; this
module only draws: the progress it is shown (callbacks) and the result.
"""

from __future__ import annotations

import math
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from charlm.config import SampleConfig
from charlm.settings import flag_fields, flag_name
from charlm.views.text import duration, safe_text

if TYPE_CHECKING:  # (charlm.comparison imports torch; this module draws what it holds)
    from charlm.comparison import Comparison, Contestant

MIN_COLUMN = 40  # narrower than this per model, the panels are stacked instead
FPS = 20  # at most this many screen refreshes per second while streaming
# Timings are starred only beyond their noise. A rate (tok/s, chars/s): when its slowest quarter of the run
# beats every other model's fastest quarter. TTFT is one measurement per model, of a millisecond or so that a
# busy CPU can stretch tenfold: only when at most half of every other's.


def human(n: float) -> str:
    """12345 -> '12.3k', 1234567 -> '1.23M'."""
    for div, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if n >= div:
            return f"{n / div:.3g}{unit}"
    return str(int(n))


def _finite(x) -> float | None:
    return x if isinstance(x, (int, float)) and math.isfinite(x) else None


def _best(values: list, margin: float) -> int | None:
    """The index of the lowest value, when there are two or more to compare and it is below every other
    by more than `margin` (a fraction of theirs; 0: strictly below)."""
    known = sorted((v, i) for i, v in enumerate(values) if v is not None)
    if len(known) < 2:
        return None
    (low, i), (runner_up, _) = known[0], known[1]
    return i if low < runner_up * (1 - margin) else None


def _fastest(ranges: list) -> int | None:
    """The index of the (lowest, highest) rate range that lies wholly above every other, if one does."""
    known = [(r, i) for i, r in enumerate(ranges) if r is not None]
    if len(known) < 2:
        return None
    (lo, _), i = max(known, key=lambda k: k[0][0])
    return i if all(lo > hi for (_, hi), j in known if j != i) else None


def _pack(items: list[Text], width: int, sep: Text) -> list[Text]:
    """Items joined by sep into lines of at most `width` cells, never breaking an item."""
    lines = [Text()]
    for item in items:
        if lines[-1].plain and lines[-1].cell_len + sep.cell_len + item.cell_len > width:
            lines.append(Text())
        if lines[-1].plain:
            lines[-1].append_text(sep)
        lines[-1].append_text(item)
    return lines


def header(p: Contestant) -> tuple[Text, Text]:
    m, tok = p.ckpt.model_config, p.ckpt.tokenizer
    title = Text(safe_text(p.label), style="bold")
    sub = Text(f"{m.kind} · {tok.kind} · {human(p.params)} params")
    return title, sub


def _shown(value) -> str:
    """A setting's value in the notes: a number as %g, anything else as safe text (a setting may hold text)."""
    return f"{value:g}" if isinstance(value, (int, float)) and not isinstance(value, bool) else safe_text(str(value))


def panels(players: list[Contestant], width: int):
    """Each model's prompt and text so far in a panel: side by side when each gets MIN_COLUMN cells, else
    stacked. A word longer than its column folds onto the next line, never ends in …."""
    boxes = []
    for p in players:
        title, sub = header(p)
        body = Text.assemble((safe_text(p.prompt), "dim"), safe_text(p.output))
        if p.note:
            body = Text(safe_text(p.note), style="yellow")
        body.overflow = "fold"
        boxes.append(Panel(body, title=title, subtitle=sub, title_align="left", subtitle_align="left"))
    if width // len(boxes) < MIN_COLUMN:
        return Group(*boxes)
    grid = Table.grid(expand=True, padding=(0, 1))
    for _ in boxes:
        grid.add_column(ratio=1)
    grid.add_row(*boxes)
    return grid


class CompareView:
    """`charlm compare` on the screen. While commands.compare.compare() works it calls evaluating(label) (a bar
    on `err` while a model scores the eval file), evaluated() (what a model could not score) and generating()
    (on a terminal, live panels growing as the tokens arrive); each takes over from `before` (the Loading
    spinner). Then show() draws the result: the texts (plain blocks when the output is not a terminal; the
    panels' last frame stays on one), the results table and its notes."""

    def __init__(self, console: Console, err: Console | None = None, before=None):
        self.console, self.err, self.before = console, err or console, before

    def _take_over(self) -> None:
        if self.before is not None:
            self.before.__exit__(None, None, None)
            self.before = None

    def evaluating(self, label: str):
        """The progress of one model scoring the eval file: a context manager that is evaluate_file's callback."""
        from charlm.views.eval import EvalProgress

        self._take_over()
        return EvalProgress(self.err, f"eval {label}")

    def evaluated(self, comparison: Comparison) -> None:
        """A model that could not score the file (a char model that never saw one of its characters): said once,
        before any text."""
        for p in comparison.players:
            if p.eval_note:
                self.console.print(Text(safe_text(f"{p.label}: {p.eval_note}"), style="yellow"), soft_wrap=True)

    @contextmanager
    def generating(self, comparison: Comparison):
        """`with view.generating(comparison) as on_tick: comparison.run(prompt, on_tick)`: on a terminal, the
        panels redrawn at most FPS times a second; elsewhere on_tick is None and show() prints the texts."""
        self._take_over()
        if not self.console.is_terminal or self.console.quiet:
            yield None
            return
        players, width, last = comparison.players, self.console.width, 0.0
        live = Live(panels(players, width), console=self.console, auto_refresh=False, vertical_overflow="ellipsis")

        def tick():
            nonlocal last
            if time.perf_counter() - last >= 1 / FPS:
                live.update(panels(players, width), refresh=True)
                last = time.perf_counter()

        # not `with Live(...)`: a Ctrl-C inside Live's own first paint would skip its __exit__ and leave it
        # hooked to the console, redrawing the panels under every later line; stop() always runs here
        try:
            live.start(refresh=True)
            yield tick
        finally:
            try:
                live.update(panels(players, width), refresh=True)
            finally:
                live.stop()

    def show(self, comparison: Comparison) -> None:
        """The result of a run: the texts when the output is not a terminal (a terminal keeps the panels' last
        frame), then the results table and its notes."""
        if not self.console.is_terminal:
            for p in comparison.players:
                title, sub = header(p)
                self.console.print(Text("== ") + title + Text(f" ({sub.plain}) =="), soft_wrap=True)
                self.console.print(Text(safe_text(p.note or p.prompt + p.output)), soft_wrap=True)
                self.console.print()
        self.results(comparison)

    def columns(self, comparison: Comparison) -> tuple[list[str], list[list[Text]]]:
        """The results' column names, and per model its cells (the best of a column styled, or starred
        when the output is plain)."""
        plain = not self.console.is_terminal
        cols = ["params", "steps", "trained", "val bpc"]
        if comparison.eval_path is not None:
            cols.append("eval bpc")
        cols += ["tok/s", "chars/s", "TTFT"]
        # (value, text) per model per column; value None: nothing to compare; lower values are better
        rows = []
        for p in comparison.players:
            d = p.ckpt.saved
            row = [(None, human(p.params)), (None, f"{d.step:,}"), (None, duration(d.train_seconds))]
            bpc = _finite(d.best_val_bpc)
            row.append((bpc, f"{bpc:.3f}" if bpc is not None else "—"))
            if comparison.eval_path is not None:
                e = p.eval.bits_per_char if p.eval else None
                row.append((e, f"{e:.3f}" if e is not None else "—"))
            for chars, rate in ((False, p.tokens_per_s), (True, p.chars_per_s)):
                row.append((p.rate_range(chars), f"{rate:,.0f}" if rate else "—"))
            row.append((p.ttft_ms, f"{p.ttft_ms:.1f}" if p.ttft_ms is not None else "—"))
            rows.append(row)
        # the best of each measured column (params, steps and time describe the runs); a timing only when
        # it stands out of the noise
        best = [
            _fastest([r[i][0] for r in rows])
            if c in ("tok/s", "chars/s")
            else _best([r[i][0] for r in rows], 0.5 if c == "TTFT" else 0.0)
            for i, c in enumerate(cols)
        ]
        cells = [
            [
                Text(text + ("*" if i == best[c] and plain else ""), style="bold green" if i == best[c] else "")
                for c, (_, text) in enumerate(row)
            ]
            for i, row in enumerate(rows)
        ]
        return cols, cells

    def notes_lines(self, comparison: Comparison) -> list[str]:
        """What the columns mean and how this run was made (printed under the results)."""
        s = comparison.settings
        lines = ["val bpc: best validation bits/char in training (each on its own corpus)"]
        if comparison.eval_path is not None:
            lines.append(safe_text(f"eval bpc: bits/char on {Path(comparison.eval_path).name}, the whole file"))
        apart = ("temperature", "max_tokens", "stop", "seed", "unknown")  # shown apart, or not how a token is picked
        changed = [  # how each next token was picked: the settings changed from their defaults, from the fields
            f"{flag_name(f)} {_shown(getattr(s, f.name))}"
            for f in flag_fields(SampleConfig)
            if f.name not in apart and getattr(s, f.name) != f.default
        ]
        lines.append(
            f"tok/s, chars/s, TTFT (time to first token, ms): this run · seed {comparison.last_seed} · "
            + " · ".join([f"temperature {s.temperature:g}", *changed])
        )
        if comparison.counts_chars:  # a BPE token holds several characters: -n counted characters
            wrote = " · ".join(f"{p.label} {p.tokens:,}" for p in comparison.players if p.tokens)
            lines.append(
                f"--max-tokens {s.max_tokens} counts characters here (the models' tokens differ in size), so every "
                f"text is as long: tokens written: {wrote} (chars/s compares the rates on characters)"
            )
        mark = "marked *" if not self.console.is_terminal else "in green"
        lines.append(
            f"best of each column {mark}; timings only beyond their noise: a rate when its slowest quarter "
            "of the run beats every other's fastest, TTFT when at most half of every other's"
        )
        return lines

    def table(self, comparison: Comparison) -> Table:
        cols, cells = self.columns(comparison)
        table = Table(box=box.SIMPLE_HEAD, show_edge=False, collapse_padding=True)
        table.add_column("model", no_wrap=True)  # never folded: too narrow for it, results() lists instead
        for c in cols:
            table.add_column(c, justify="right", no_wrap=True)
        for p, row in zip(comparison.players, cells):
            table.add_row(Text(safe_text(p.label)), *row)
        return table

    def results(self, comparison: Comparison) -> None:
        """The table, or on a terminal too narrow for it, one block per model with every column (a
        squeezed table would drop columns and fold names mid-word); then the notes, wrapped at words."""
        table = self.table(comparison)
        notes = Text("\n".join(self.notes_lines(comparison)), style="dim")
        wide = self.console.measure(table, options=self.console.options.update_width(1000)).maximum
        if not self.console.is_terminal:  # a file or a pipe has no width: print the whole table
            out = Console(file=self.console.file, width=max(self.console.width, wide), highlight=False)
            out.print(table)
            out.print(notes, soft_wrap=True)
            return
        if wide <= self.console.width:
            self.console.print(table)
        else:
            cols, cells = self.columns(comparison)
            for p, row in zip(comparison.players, cells):
                self.console.print(Text(safe_text(p.label), style="bold"))
                items = [Text(f"{c} ", style="dim") + cell for c, cell in zip(cols, row)]
                for line in _pack(items, self.console.width - 2, Text(" · ", style="dim")):
                    self.console.print(Text("  ") + line, no_wrap=True, overflow="fold")
        self.console.print(notes)
