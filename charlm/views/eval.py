"""`charlm eval` on the screen: a progress bar while a text is scored, then a table of the scores (or the
JSON object --json prints)."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from charlm.checkpoint import Checkpoint
from charlm.evaluate import EvalResult
from charlm.views.text import safe


class EvalProgress:
    """A transient progress bar for scoring a text (on a terminal only); call it with (done, total)."""

    def __init__(self, console: Console, label: str = "evaluating"):
        self.console, self.label = console, label
        self.progress: Progress | None = None
        self.task = None

    def __enter__(self) -> EvalProgress:
        if self.console.is_terminal:
            self.progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("tokens"),
                TimeRemainingColumn(),
                console=self.console,
                transient=True,
            )
            self.progress.start()
        return self

    def __call__(self, done: int, total: int) -> None:
        if self.progress is None:
            return
        if self.task is None:
            self.task = self.progress.add_task(self.label, total=total)
        self.progress.update(self.task, completed=done, total=total)

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
    table.add_row("time", f"{result.seconds:.1f}s ({result.tokens / max(result.seconds, 1e-9):,.0f} tokens/s)")
    if result.unknown_dropped:
        table.add_row(
            "dropped", Text(f"{result.unknown_dropped:,} characters this model never saw (not scored)", style="yellow")
        )
    console.print(table)
