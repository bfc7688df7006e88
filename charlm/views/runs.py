"""Runs at a glance: the table of `charlm runs`, and loss curves (`charlm plot`, `charlm info`) drawn
with the one terminal chart (views/plot.py)."""

from __future__ import annotations

import math
import time

from rich import box
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

from charlm.config import shape_words
from charlm.data import bits_per_char
from charlm.views.plot import line_chart
from charlm.views.text import duration, safe_text


def age(seconds: float) -> str:
    """'now', '5m ago', '3h ago', '2d ago'."""
    if seconds < 60:
        return "now"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size:.0f}{unit} ago"


NUMBERS = ("params", "steps", "time", "val\nbits/\nchar", "when")
DROPPED_FIRST = ("when", "time", "steps", "params")  # what a narrow terminal does without, in this order


def render_runs(console: Console, rows: list[dict], title: str, now: float | None = None) -> None:
    """rows: runs.describe() of each run, newest first. Where the width allows, a run is one line with a
    column for everything and one-line headers; else two lines a run (name over corpus, model over size). A
    run's name stays whole (it is what chat, sample and --resume take): where the table would not fit, the
    columns that matter least go, then names fold."""
    now = time.time() if now is None else now
    layouts = [(set(), False, True)] + [(set(DROPPED_FIRST[:k]), k == len(DROPPED_FIRST), False) for k in range(5)]
    for dropped, fold, wide in layouts:
        table = _runs_table(rows, title, now, dropped, fold, wide)
        if console.measure(table, options=console.options.update_width(10_000)).minimum <= console.width:
            break
    console.print(table)


def _runs_table(rows: list[dict], title: str, now: float, dropped: set[str], fold: bool, wide: bool) -> Table:
    table = Table(
        title=Text(safe_text(title)),
        title_justify="left",
        header_style="bold",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        padding=0,
    )  # the box's one space between columns, no padding: 8 columns fit in 60
    # the user's names: whole, or (when nothing else is left to drop) folded, never cut short
    keys = ("run",) if wide else ("run", "corpus")
    names = max((cell_len(safe_text(str(r.get(k) or "?"))) for r in rows for k in keys), default=8)
    table.add_column("run" if wide else "run\ncorpus", overflow="fold", min_width=8 if fold else max(8, names))
    if wide:
        table.add_column("corpus", no_wrap=True)
    table.add_column("model", no_wrap=True)
    if wide:
        table.add_column("size", no_wrap=True)
    shown = [name for name in NUMBERS if name.split("\n")[0] not in dropped]
    for name in shown:
        table.add_column(
            " ".join(name.replace("\n", " ").split()).replace("/ ", "/") if wide else name,
            justify="right",
            no_wrap=True,
        )
    for r in rows:
        # directory and corpus names are the user's text, never markup
        corpus = Text(safe_text(r.get("corpus") or "?"), style="dim")
        run = Text(safe_text(r["run"])) if wide else Text(safe_text(r["run"])) + Text("\n") + corpus
        when = age(now - r["modified"])
        if "error" in r:  # under the name: a long message folds, keeping the other columns
            run = Text(safe_text(r["run"])) + Text("\n" + safe_text(r["error"]), style="red", overflow="fold")
            blank = [""] * (2 if wide else 0)
            table.add_row(
                run, *blank, Text("unreadable", style="red"), *[""] * (len(shown) - 1), when if "when" in shown else ""
            )
            continue
        bpc = f"{r['best_val_bpc']:.3f}" if r["best_val_bpc"] is not None else "-"
        params = f"{r['params'] / 1e6:.2f}M" if r["params"] else "?"
        cells = dict(zip(NUMBERS, (params, f"{r['steps']:,}", duration(r["train_seconds"]), bpc, when), strict=True))
        size = f"{r['layers']}×{r['d_model']} {r['tokenizer']}"
        model = [corpus, r["model"], size] if wide else [f"{r['model']}\n{size}"]
        table.add_row(run, *model, *[cells[n] for n in shown])
    return table


def train_bpc(point: dict) -> float:
    """Bits per character of the training loss: metrics.jsonl holds val_bpc and both losses, and the same
    characters per token turn either loss into bits per character."""
    if not point["val_bpc"]:  # a validation loss of 0 (a text the model predicts exactly) gives no ratio
        return 0.0 if not point["train_loss"] else math.nan
    return bits_per_char(point["train_loss"], chars_per_token=point["val_loss"] / point["val_bpc"] / math.log(2))


def loss_chart(
    curves: dict[str, list[dict]],
    *,
    y: str = "loss",
    x: str = "step",
    width: int = 72,
    height: int = 16,
    color: bool = True,
) -> str:
    """curves: a run's label -> its metrics.jsonl rows. Train and val of each run as two series
    (with one run, just "train" and "val"). y: "loss" (nats/token) or "bpc"; x: "step" or "time"."""
    xs = (lambda p: p["step"]) if x == "step" else (lambda p: p["elapsed"])
    ys = {"loss": (lambda p: p["train_loss"], lambda p: p["val_loss"]), "bpc": (train_bpc, lambda p: p["val_bpc"])}[y]
    series = {}
    for label, points in curves.items():
        prefix = f"{safe_text(label)} " if len(curves) > 1 else ""  # a run's name: never an escape sequence
        for split, value in zip(("train", "val"), ys):
            series[prefix + split] = ([xs(p) for p in points], [value(p) for p in points])
    return line_chart(
        series,
        width=width,
        height=height,
        color=color,
        xlabel="step" if x == "step" else "training time",
        ylabel="loss (nats/token)" if y == "loss" else "bits/char",
        xformat=None if x == "step" else duration,  # '2m04s', as every other output writes a time
    )


def print_chart(console: Console, curves: dict[str, list[dict]], **kw) -> None:
    """loss_chart on the console: in colour on a terminal; piped or NO_COLOR, plain characters (the series
    told apart by their markers)."""
    color = console.is_terminal and not console.no_color
    console.file.write(loss_chart(curves, color=color, **kw).rstrip("\n") + "\n")  # (plotext's own colour codes)


def render_info(console: Console, info: dict, curves: dict[str, list[dict]]) -> None:
    """`charlm info`: what a checkpoint holds (its summary), then its run's curve of bits/char while training."""
    # names and paths come from the user's files: Text, never markup
    table = Table(title=Text(safe_text(info["run"])), show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column(overflow="fold")  # a long path wraps instead of losing its end to "…"
    shape = shape_words(
        info["layers"],
        info["d_model"],
        info["context"],
        info["heads"],
        info["mlp_ratio"],
        info["qk_norm"],
        info["positions"],
        smear=info["smear"],
        tied=info["tied"] is not False,  # None: a family without a head to tie
    )
    table.add_row("model", f"{info['model']} ({shape})")
    table.add_row("parameters", f"{info['params']:,}" if info["params"] else "?")
    if info.get("compressed"):  # charlm compress
        table.add_row("compressed", Text(safe_text(info["compressed"])))
    if info.get("teacher"):  # train --teacher
        table.add_row("distilled from", Text(safe_text(info["teacher"])))
    table.add_row("tokenizer", f"{info['tokenizer']}, {info['vocab_size']} tokens")
    table.add_row(
        "trained", Text(safe_text(f"{info['steps']} steps in {duration(info['train_seconds'])} on {info['device']}"))
    )
    if info["best_val_loss"] is not None:
        table.add_row("best val", f"{info['best_val_loss']:.4f} nats/token · {info['best_val_bpc']:.3f} bits/char")
    table.add_row("corpus", Text(safe_text(f"{info['corpus']} (sha256 {str(info['corpus_sha256'])[:12]}…)")))
    table.add_row("file", Text(safe_text(info["path"])))
    console.print(table)
    if curves and len(next(iter(curves.values()))) > 1:
        console.print(Text("bits/char while training (charlm plot for more):", style="bold"))
        print_chart(console, curves, y="bpc", x="step", width=min(console.width, 100), height=14)
