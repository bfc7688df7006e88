"""`charlm compress` on the screen: a progress display while it measures (CompressProgress), then the original
and the compressed run side by side (before → after), or --report's table of every setting with its reading.
The table fits the console: one table where it is wide enough, else two (size and speed, then quality), each
with the setting's whole name."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from charlm.storage.checkpoint import BEST
from charlm.views.text import err_console, safe_text

# a header wraps at its spaces in a narrow column
SIZE = ("params", "bits per weight", "file", "tok/s (1 thread)")
QUALITY = ("bits per char", "Δ bits per char", "top-1 agree", "KL nats per token")
COLUMNS = ("setting", *SIZE, *QUALITY)


def _cells(m, base) -> dict[str, str]:
    return {
        "setting": safe_text(m.name),
        "params": f"{m.params:,}",
        "bits per weight": f"{m.bits_per_weight:.2f}",
        "file": f"{m.file_bytes / 1e6:.2f} MB ({m.file_bytes / base.file_bytes:.0%})",
        "tok/s (1 thread)": f"{m.tokens_per_s:,.0f}",
        "bits per char": f"{m.bpc:.4f}",
        "Δ bits per char": f"{m.bpc - base.bpc:+.4f}",
        "top-1 agree": f"{m.top1:.1%}",
        "KL nats per token": f"{m.kl:.4f}",
    }


def _table(title: str | None, columns, rows, base, tight: bool = False) -> Table:
    """The table of `columns`; tight: each column as narrow as its widest cell (its header wrapped at spaces)."""
    table = Table(title=Text(title) if title else None, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    cells = [_cells(m, base) for m in rows]
    for name in columns:  # no cell ever cut: the table that does not fit is replaced by a narrower layout
        widest = max([len(c[name]) for c in cells] + [len(word) for word in name.split()])
        justify = "left" if name == "setting" else "right"
        table.add_column(name, justify=justify, width=widest if tight else None, no_wrap=not tight, overflow="fold")
    for c in cells:
        table.add_row(*(c[name] for name in columns))
    return table


def _width(table: Table, console: Console) -> int:
    return console.measure(table, options=console.options.update_width(10_000)).maximum


def _print_tables(console: Console, title: str, rows, base) -> None:
    """One table; else two, size and speed then quality, their headers wrapped; else, on a console too narrow
    for those, each setting on a line of its own with its numbers on the lines below."""
    whole = _table(title, COLUMNS, rows, base)
    if _width(whole, console) <= console.width:
        console.print(whole)
        return
    split = [_table(title, ("setting", *SIZE), rows, base, True), _table(None, ("setting", *QUALITY), rows, base, True)]
    if all(_width(t, console) <= console.width for t in split):
        for t in split:
            console.print(t)
        return
    console.print(Text(title))
    for m in rows:
        cells = _cells(m, base)
        console.print(Text(cells["setting"], style="bold"))
        for names in (SIZE, QUALITY):  # as many as fit on a line, a line broken between two, never inside one
            lines = [""]
            for item in (f"{name} {cells[name]}" for name in names):
                joined = f"{lines[-1]} · {item}" if lines[-1] else f"  {item}"
                lines[-1:] = [joined] if len(joined) <= console.width or not lines[-1] else [lines[-1], f"  {item}"]
            for line in lines:
                console.print(Text(line))


def render_compressed(console: Console, done) -> None:
    title = safe_text(f"{done.original.name} → {done.result.name}")
    _print_tables(console, title, [done.original, done.result], done.original)
    console.print(Text(safe_text(f"scored on {done.source}")))
    if done.dropped:
        what = ", ".join(f"{layer}.{i}" for layer, i in done.dropped[:16]) + (" …" if len(done.dropped) > 16 else "")
        console.print(Text(f"dropped (layer.index): {what}"))
    console.print(Text(safe_text(f"written: {done.path / BEST} (every command opens {done.path})")))


def render_report(console: Console, rep) -> None:
    _print_tables(console, safe_text(f"charlm compress {rep.ckpt} --report"), rep.rows, rep.rows[0])
    console.print(Text(safe_text(f"scored on {rep.tokens:,} tokens of {rep.source}")))
    for line in rep.reading:
        console.print(Text(safe_text(line)))


class CompressProgress:
    """`with CompressProgress() as progress:` pass `progress` to commands.compress's functions as their
    progress(what, done, total): on a terminal, a bar on stderr with the phase under way and the time it has
    taken (a spinner alone while the number of phases is not known); gone when the block ends. Elsewhere (a
    pipe, a file, a test) nothing."""

    def __init__(self, console: Console | None = None):
        self.console, self.bar, self.task = console or err_console(), None, None

    def __enter__(self) -> CompressProgress:
        if self.console.is_terminal:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                SpinnerColumn,
                TextColumn,
                TimeElapsedColumn,
            )

            self.bar = Progress(
                SpinnerColumn(),
                TextColumn("{task.description}", markup=False),  # a path is no markup
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=self.console,
                transient=True,
            )
            self.bar.start()
            self.task = self.bar.add_task("loading torch", total=None)
        return self

    def __call__(self, what: str, done: int, total: int) -> None:
        if self.bar is not None:
            self.bar.update(self.task, description=safe_text(what), completed=done, total=total or None)
            self.bar.refresh()

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None
