"""`charlm compress` on the screen: the original and the compressed run side by side (before → after), or
--report's table of every setting with its reading."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from charlm.checkpoint import BEST
from charlm.views.text import safe_text

COLUMNS = (
    "setting",
    "params",
    "bits/weight",
    "file",
    "bits/char",
    "Δ bits/char",
    "top-1 agree",
    "KL nats/tok",
    "tok/s 1 thread",
)


def _cells(m, base) -> list[str]:
    return [
        safe_text(m.name),
        f"{m.params:,}",
        f"{m.bits_per_weight:.2f}",
        f"{m.file_bytes / 1e6:.2f} MB ({m.file_bytes / base.file_bytes:.0%})",
        f"{m.bpc:.4f}",
        f"{m.bpc - base.bpc:+.4f}",
        f"{m.top1:.1%}",
        f"{m.kl:.4f}",
        f"{m.tokens_per_s:,.0f}",
    ]


def _table(title: str, rows, base) -> Table:
    table = Table(title=Text(title), title_justify="left")
    for i, name in enumerate(COLUMNS):
        table.add_column(name, justify="left" if i == 0 else "right")
    for m in rows:
        table.add_row(*_cells(m, base))
    return table


def render_compressed(console: Console, done) -> None:
    console.print(
        _table(safe_text(f"{done.original.name} → {done.result.name}"), [done.original, done.result], done.original)
    )
    console.print(Text(safe_text(f"scored on {done.source}")))
    if done.dropped:
        what = ", ".join(f"{layer}.{i}" for layer, i in done.dropped[:16]) + (" …" if len(done.dropped) > 16 else "")
        console.print(Text(f"dropped (layer.index): {what}"))
    console.print(Text(safe_text(f"written: {done.path / BEST} (every command opens {done.path})")))


def render_report(console: Console, rep) -> None:
    console.print(_table(safe_text(f"charlm compress {rep.ckpt} --report"), rep.rows, rep.rows[0]))
    console.print(Text(safe_text(f"scored on {rep.tokens:,} tokens of {rep.source}")))
    for line in rep.reading:
        console.print(Text(safe_text(line)))
