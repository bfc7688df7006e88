"""`charlm compare` on the screen: the models' continuations in columns as the tokens arrive (plain blocks
when the output is not a terminal), then a table of what each model is and how it did; and
`compare --interactive`, the chat input loop with every prompt going to all models.

The generation itself, round-robin with per-model timing, is charlm.comparison; this module only draws.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from charlm.comparison import Comparison, Contestant
from charlm.models import count_params
from charlm.views.repl import Hint, Session
from charlm.views.text import safe_text

MIN_COLUMN = 40  # narrower than this per model, the panels are stacked instead
FPS = 20  # at most this many screen refreshes per second while streaming


def human(n: float) -> str:
    """12345 -> '12.3k', 1234567 -> '1.23M'."""
    for div, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if n >= div:
            return f"{n / div:.3g}{unit}"
    return str(int(n))


def _seconds(s: float) -> str:
    return f"{s:.0f}s" if s < 120 else f"{s / 60:.1f}m"


def _finite(x) -> float | None:
    return x if isinstance(x, (int, float)) and math.isfinite(x) else None


def header(p: Contestant) -> tuple[Text, Text]:
    m, tok = p.ckpt.model_config, p.ckpt.tokenizer
    params = p.ckpt.saved.params or count_params(p.ckpt.model)
    title = Text(safe_text(p.ckpt.name), style="bold")
    sub = Text(f"{m.kind} · {tok.kind} · {human(params)} params")
    return title, sub


class CompareView:
    """Draws a Comparison: live panels while it runs, then the results table and notes."""

    def __init__(self, comparison: Comparison, console: Console):
        self.comparison, self.console = comparison, console
        self.players = comparison.players

    # read live: /set replaces the settings, a run sets the seed, evaluate() the eval file
    @property
    def eval_path(self):
        return self.comparison.eval_path

    @property
    def settings(self):
        return self.comparison.settings

    @property
    def last_seed(self):
        return self.comparison.last_seed


    def panels(self):
        panels = []
        for p in self.players:
            title, sub = header(p)
            body = Text.assemble((safe_text(p.prompt), "dim"), safe_text(p.output))
            if p.note:
                body = Text(safe_text(p.note), style="yellow")
            panels.append(Panel(body, title=title, subtitle=sub, title_align="left", subtitle_align="left"))
        if self.console.width // len(panels) < MIN_COLUMN:
            return Group(*panels)
        grid = Table.grid(expand=True, padding=(0, 1))
        for _ in panels:
            grid.add_column(ratio=1)
        grid.add_row(*panels)
        return grid

    def show(self, prompt: str) -> None:
        """Generate and display: live columns on a terminal, plain blocks otherwise; then the table."""
        if self.console.is_terminal:
            last = 0.0
            with Live(self.panels(), console=self.console, auto_refresh=False, vertical_overflow="ellipsis") as live:
                def tick():
                    nonlocal last
                    if time.perf_counter() - last >= 1 / FPS:
                        live.update(self.panels(), refresh=True)
                        last = time.perf_counter()

                try:
                    self.comparison.run(prompt, tick)
                finally:
                    live.update(self.panels(), refresh=True)
        else:
            self.comparison.run(prompt)
            for p in self.players:
                title, sub = header(p)
                self.console.print(Text("== ") + title + Text(f" ({sub.plain}) =="), soft_wrap=True)
                self.console.print(Text(safe_text(p.note or p.prompt + p.output)), soft_wrap=True)
                self.console.print()
        table = self.table()
        if self.console.is_terminal:
            self.console.print(table)
        else:  # a file or a pipe has no width: print the whole table rather than squeeze it into 80 columns
            wide = self.console.measure(table, options=self.console.options.update_width(1000)).maximum
            Console(file=self.console.file, width=max(self.console.width, wide), highlight=False).print(table)

    def table(self) -> Table:
        plain = not self.console.is_terminal
        cols = ["params", "steps", "trained", "val bpc"]
        if self.eval_path is not None:
            cols.append("eval bpc")
        cols += ["tok/s", "TTFT"]
        # (value, text) per model per column; value None: nothing to compare
        rows = []
        for p in self.players:
            d = p.ckpt.saved
            params = d.params or count_params(p.ckpt.model)
            row = [(None, human(params)), (None, f"{d.step:,}"), (None, _seconds(d.train_seconds))]
            bpc = _finite(d.best_val_bpc)
            row.append((bpc, f"{bpc:.3f}" if bpc is not None else "—"))
            if self.eval_path is not None:
                e = p.eval.bits_per_char if p.eval else None
                row.append((e, f"{e:.3f}" if e is not None else "—"))
            tps = p.tokens_per_s
            row.append((-tps if tps else None, f"{tps:,.0f}" if tps else "—"))  # negated: higher is better
            row.append((p.ttft_ms, f"{p.ttft_ms:.1f}" if p.ttft_ms is not None else "—"))
            rows.append(row)
        # the best (lowest) value of each measured column; params, steps and time describe the runs
        best = []
        for i in range(len(cols)):
            values = [r[i][0] for r in rows if r[i][0] is not None]
            best.append(min(values) if len(values) > 1 else None)
        s = self.settings
        lines = ["val bpc: best validation bits/char in training (each on its own corpus)"]
        if self.eval_path is not None:
            lines.append(safe_text(f"eval bpc: bits/char on {Path(self.eval_path).name}, the whole file"))
        lines.append(f"tok/s, TTFT (time to first token, ms): this run · seed {self.last_seed} · temperature {s.temperature:g}"
                     + (f" · top-k {s.top_k}" if s.top_k else "") + (f" · top-p {s.top_p:g}" if s.top_p < 1 else ""))
        lines.append("best of each column " + ("marked *" if plain else "in green"))
        table = Table(caption=Text("\n".join(lines), style="dim"), caption_justify="left", box=box.SIMPLE_HEAD,
                      show_edge=False, collapse_padding=True)
        table.add_column("model", min_width=8, overflow="fold")  # wrapped, never cut: names tell runs apart
        for c in cols:
            table.add_column(c, justify="right", no_wrap=True)
        for p, row in zip(self.players, rows):
            cells = [Text(safe_text(p.ckpt.name))]
            for i, (value, text) in enumerate(row):
                is_best = value is not None and value == best[i]
                cells.append(Text(text + ("*" if is_best and plain else ""), style="bold green" if is_best else ""))
            table.add_row(*cells)
        return table

    def notes(self) -> None:
        for p in self.players:
            if p.eval_note:
                self.console.print(Text(safe_text(f"{p.ckpt.name}: {p.eval_note}"), style="yellow"), soft_wrap=True)


class CompareRepl(Session):
    """`charlm compare -i`: chat's input loop and its shared commands (/set, /help, /quit); each prompt goes to
    every model. On a terminal it prompts; otherwise each line of stdin is a prompt and hints go to stderr."""

    CHAT_ONLY = ("/show", "/reset", "/mode", "/attn", "/gates", "/save")  # about one model's running text

    def __init__(self, view: CompareView, interactive: bool | None = None):
        comparison = view.comparison
        super().__init__(comparison.settings, view.console, comparison.unknown, interactive)
        self.view = view

    def banner(self) -> None:
        self.console.print(Text("type a prompt: every model continues it · /help for commands · "
                                "Ctrl-C stops a generation · /quit or Ctrl-D leaves", style="dim"), soft_wrap=True)

    def own_command(self, name: str, rest: str) -> None:
        if name in self.CHAT_ONLY:
            raise Hint(f"{name} works on one model's running text: use it in 'charlm chat CKPT'; "
                       "compare -i has /set, /help and /quit")
        super().own_command(name, rest)

    def generate(self, prompt: str) -> None:
        self.view.comparison.settings, self.view.comparison.unknown = self.settings, self.unknown
        self.view.show(prompt)
