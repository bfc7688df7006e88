"""`charlm eval` on the screen: a progress bar while a text is scored, then a table of the scores (or the
JSON object --json prints)."""

from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn
from rich.table import Table
from rich.text import Text

from charlm.evaluate import EvalResult
from charlm.storage.checkpoint import Checkpoint
from charlm.views.text import duration, safe, safe_text


class EvalProgress:
    """A transient progress bar for scoring a text (on a terminal only); call it with (done, total). It takes
    over from `before` (a Loading spinner) at the first call. The time left is measured from the second call
    on: the first batch pays for warming up (oneDNN builds its kernels), which would make it read several
    times too long."""

    def __init__(self, console: Console, label: str = "evaluating", before=None):
        self.console, self.label, self.before = console, label, before
        self.progress: Progress | None = None
        self.task = None
        self.since: tuple[float, int] | None = None  # (time, tokens done) at the first call

    def __enter__(self) -> EvalProgress:
        return self

    def __call__(self, done: int, total: int) -> None:
        if not self.console.is_terminal:
            return
        now = time.perf_counter()
        if self.progress is None:
            if self.before is not None:
                self.before.__exit__(None, None, None)
            self.progress = Progress(
                TextColumn("{task.description}", markup=False),
                BarColumn(bar_width=None),  # the room the words leave it
                TextColumn("{task.fields[right]}", markup=False),
                console=self.console,
                transient=True,
            )
            self.progress.start()
            self.task = self.progress.add_task("", total=total, right="")
            self.since = (now, done)
        t0, d0 = self.since
        rate = (done - d0) / (now - t0) if done > d0 and now > t0 else None
        left = f"{duration((total - done) / rate)} left" if rate else "measuring speed"
        # the numbers whole; the label (a run's name) shortened with an ellipsis when the line has no room for it
        right = f"{done:,}/{total:,} tokens · {left}"
        if len(right) + 20 > self.console.width:
            right = f"{done:,}/{total:,} · {left}"
        label, room = safe_text(self.label), max(4, self.console.width - len(right) - 10)
        label = label if len(label) <= room else label[: room - 1] + "…"
        self.progress.update(self.task, completed=done, total=total, right=right, description=label, refresh=True)

    def __exit__(self, *exc) -> None:
        if self.progress is not None:
            self.progress.stop()


def render_eval(console: Console, ckpt: Checkpoint, path, result: EvalResult) -> None:
    title = safe(ckpt.name, "bold") + safe(f" on {Path(path).name}")
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    table.add_row("bits/char", f"{result.bits_per_char:.4f}")
    table.add_row("bits/byte", f"{result.bits_per_byte:.4f}")
    table.add_row("loss", f"{result.loss:.4f} nats/token · perplexity {result.perplexity:.2f}")
    table.add_row("scored", f"{result.tokens:,} tokens · {result.chars:,} chars · {result.bytes:,} bytes")
    how = (
        "one pass, state carried"
        if result.stride is None
        else f"windows of {ckpt.model_config.context}, stride {result.stride}"
    )
    table.add_row("model", f"{ckpt.model_config.kind} · {ckpt.tokenizer.kind} tokenizer · {how}")
    table.add_row("time", f"{duration(result.seconds)} ({result.tokens / max(result.seconds, 1e-9):,.0f} tokens/s)")
    if result.unknown_dropped:
        table.add_row(
            "dropped", Text(f"{result.unknown_dropped:,} characters this model never saw (not scored)", style="yellow")
        )
    console.print(table)
