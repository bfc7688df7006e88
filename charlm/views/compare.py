"""Side by side: several checkpoints continue the same prompt with the same seed and settings, streamed
in columns as the tokens arrive; then a table of what each model is and how it did. Also renders
`charlm eval`.

Timing is per model: a model's tokens/s counts only the time spent inside its own generation steps,
not the time the others (or the screen) took in between. The models still share the CPU's caches while
they take turns, so a model can measure slower here than alone (`charlm sample --stats`).
"""

from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import torch
from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from charlm.checkpoint import Checkpoint
from charlm.evaluate import EvalResult, UnknownCharactersInFile, evaluate_file
from charlm.generate import Generator, SampleConfig
from charlm.models import count_params
from charlm.tokenizer import UnknownCharactersError
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


# ---- eval ---------------------------------------------------------------------------------------


class EvalProgress:
    """A transient progress bar for scoring a text (on a terminal only); call it with (done, total)."""

    def __init__(self, console: Console, label: str = "evaluating"):
        self.console, self.label = console, label
        self.progress: Progress | None = None
        self.task = None

    def __enter__(self) -> "EvalProgress":
        if self.console.is_terminal:
            self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                     TextColumn("tokens"), TimeRemainingColumn(), console=self.console, transient=True)
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


def eval_summary(ckpt: Checkpoint, path, result: EvalResult) -> dict:
    """What `charlm eval --json` prints."""
    return {"checkpoint": str(ckpt.path), "run": ckpt.name, "model": ckpt.model_config.kind,
            "tokenizer": ckpt.tokenizer.kind, "file": str(path), **result.to_dict()}


def render_eval(console: Console, ckpt: Checkpoint, path, result: EvalResult) -> None:
    title = Text(f"{ckpt.name}", style="bold") + Text(f" on {Path(path).name}")
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    table.add_row("bits/char", f"{result.bits_per_char:.4f}")
    table.add_row("bits/byte", f"{result.bits_per_byte:.4f}")
    table.add_row("loss", f"{result.loss:.4f} nats/token · perplexity {result.perplexity:.2f}")
    table.add_row("scored", f"{result.tokens:,} tokens · {result.chars:,} chars · {result.bytes:,} bytes")
    how = "one pass, state carried" if result.stride is None else f"windows of {ckpt.model_config.context}, stride {result.stride}"
    table.add_row("model", f"{ckpt.model_config.kind} · {ckpt.tokenizer.kind} tokenizer · {how}")
    table.add_row("time", f"{result.seconds:.1f}s ({result.tokens / max(result.seconds, 1e-9):,.0f} tokens/s)")
    if result.unknown_dropped:
        table.add_row("dropped", Text(f"{result.unknown_dropped:,} characters this model never saw (not scored)", style="yellow"))
    console.print(table)


# ---- compare ------------------------------------------------------------------------------------


@dataclass
class Contestant:
    """One model in the comparison, and what it did in the last run."""

    ckpt: Checkpoint
    gen: Generator
    prompt: str = ""
    output: str = ""
    note: str | None = None  # why this model produced nothing (e.g. a prompt it cannot encode)
    seconds: float = 0.0  # time spent in its own generation steps
    tokens: int = 0
    ttft_ms: float | None = None
    done: bool = False
    eval: EvalResult | None = None
    eval_note: str | None = None
    stream: Iterator[str] | None = field(default=None, repr=False)

    @property
    def tokens_per_s(self) -> float | None:
        return self.tokens / self.seconds if self.tokens and self.seconds > 0 else None

    def header(self) -> tuple[Text, Text]:
        m, tok = self.ckpt.model_config, self.ckpt.tokenizer
        params = self.ckpt.saved.params or count_params(self.ckpt.model)
        title = Text(safe_text(self.ckpt.name), style="bold")
        sub = Text(f"{m.kind} · {tok.kind} · {human(params)} params")
        return title, sub


class Comparison:
    """Runs prompts through every model, round-robin one step per model, and renders the result."""

    def __init__(self, ckpts: list[Checkpoint], settings: SampleConfig, console: Console, unknown: str = "error"):
        self.players = [Contestant(c, Generator(c.model, c.tokenizer)) for c in ckpts]
        self.settings, self.console, self.unknown = settings, console, unknown
        self.seed = settings.seed
        self.last_seed = settings.seed
        self.eval_path = None
        self.warm = False

    # -- evaluation on a file, once
    def evaluate(self, path, err_console: Console) -> None:
        self.eval_path = path
        for p in self.players:
            try:
                with EvalProgress(err_console, f"eval {p.ckpt.name}") as progress:
                    p.eval = evaluate_file(p.ckpt.model, p.ckpt.tokenizer, path, progress=progress)
            except UnknownCharactersInFile as e:  # this model's problem; a bad file stops everything
                p.eval_note = str(e)

    # -- generation
    def _start(self, prompt: str) -> None:
        seed = self.seed if self.seed is not None else int.from_bytes(os.urandom(4), "little")
        self.last_seed = seed
        for p in self.players:
            p.gen.reset()
            p.prompt, p.output, p.note, p.seconds, p.tokens, p.ttft_ms, p.done = prompt, "", None, 0.0, 0, None, False
            try:
                ids = p.ckpt.tokenizer.encode(prompt, unknown=self.unknown)
            except UnknownCharactersError as e:
                p.note, p.done = str(e), True
                continue
            # every model gets its own generator with the same seed: same settings, same luck
            p.stream = p.gen.stream(ids, self.settings, torch.Generator().manual_seed(seed))

    def _step(self, p: Contestant) -> None:
        t0 = time.perf_counter()
        try:
            piece = next(p.stream)
        except StopIteration:
            piece, p.done = "", True
        p.seconds += time.perf_counter() - t0
        p.output += piece
        p.tokens = p.gen.stats.tokens
        if p.tokens and p.ttft_ms is None:
            p.ttft_ms = p.gen.stats.ttft_ms

    def warm_up(self) -> None:
        """A short untimed generation per model, so one-time setup costs (PyTorch allocates and picks
        kernels on a model's first calls) do not land on whichever model happens to go first."""
        for p in self.players:
            Generator(p.ckpt.model, p.ckpt.tokenizer).complete([0], SampleConfig(max_tokens=2, seed=0))
        self.warm = True

    def run(self, prompt: str, on_tick: Callable[[], None] | None = None) -> None:
        """Generate from every model; on_tick() after each round (one step of each model)."""
        if not self.warm:
            self.warm_up()
        self._start(prompt)
        while not all(p.done for p in self.players):
            for p in self.players:
                if not p.done:
                    self._step(p)
            if on_tick:
                on_tick()

    # -- rendering
    def panels(self):
        panels = []
        for p in self.players:
            title, sub = p.header()
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
                    self.run(prompt, tick)
                finally:
                    live.update(self.panels(), refresh=True)
        else:
            self.run(prompt)
            for p in self.players:
                title, sub = p.header()
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
            lines.append(f"eval bpc: bits/char on {Path(self.eval_path).name}, the whole file")
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


HELP = "type a prompt: every model continues it · /quit or Ctrl-D leaves · Ctrl-C stops a generation"
PROMPT = ">>> "  # as in charlm chat


def _terminal_lines(console: Console) -> Iterator[str]:
    try:
        import readline  # noqa: F401  (input() gets line editing and history)
    except ImportError:
        readline = None
    while True:
        try:
            yield input(PROMPT)
        except EOFError:  # Ctrl-D
            console.print()
            return
        except KeyboardInterrupt:  # Ctrl-C: leave at an empty prompt, else drop the line (as in chat)
            console.print()
            if readline is None or not readline.get_line_buffer().strip():
                return


def repl(comparison: Comparison, lines: Iterator[str] | None = None) -> None:
    """Each prompt goes to all models. /quit, Ctrl-D, or Ctrl-C at an empty prompt leaves. On a
    terminal it prompts; otherwise each line of stdin is a prompt and nothing else is printed."""
    console = comparison.console
    if lines is None:
        if sys.stdin.isatty():
            console.print(Text(HELP, style="dim"), soft_wrap=True)
            lines = _terminal_lines(console)
        else:
            lines = (line.rstrip("\n") for line in sys.stdin)
    for line in lines:
        command = line.strip()
        if not command:
            continue
        if command in ("/quit", "/exit", "/q"):
            return
        if command in ("/help", "/?"):
            console.print(Text(HELP, style="dim"), soft_wrap=True)
            continue
        if command.startswith("/") and " " not in command:
            console.print(Text(f"unknown command {safe_text(command)}: /help lists the commands", style="yellow"))
            continue
        try:
            comparison.show(line)
        except KeyboardInterrupt:
            console.print(Text("stopped", style="yellow"))
