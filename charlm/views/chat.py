"""`charlm chat` and `compare -i` on the screen (ChatView): the streamed text, the help and settings tables,
the banner, the hints, the status line and the viewers on the running text. What each command does is
charlm.commands.repl (the shared REPL) and commands.chat (chat's controller); the input lines come from
views/repl.py.

Model text is always shown through safe_text in Rich Text objects: never parsed as markup, and control
characters (ESC, BEL, ...) appear as visible escapes instead of reaching the terminal."""

from __future__ import annotations

import time

from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

from charlm.views.text import safe, safe_text


class ChatView:
    """Where a REPL's output goes. The model's text and the tables go to `console`; hints and confirmations go
    beside them on a terminal, and to stderr when the input is scripted (stdout: the model's text only)."""

    def __init__(self, console: Console | None, interactive: bool):
        self.console = console or Console(highlight=False)
        self.info = self.console if interactive else Console(stderr=True, highlight=False)
        self.interactive = interactive

    def hint(self, message: str, style: str = "yellow") -> None:
        # on a terminal Rich wraps at spaces (the terminal would cut words and numbers); a pipe gets whole lines
        self.info.print(Text(safe_text(message), style=style), soft_wrap=not self.info.is_terminal)

    def newline(self) -> None:
        self.console.print()

    def rows(self, rows: list[tuple[str, str]], title: str | None = None) -> None:
        print_rows(self.console, rows, title)

    def banner(self, name: str, about: str, hint: str) -> None:
        print_banner(self.console, name, about, hint)

    def reply(self, prompt: str) -> StreamPrinter:
        """The start of a reply: the prompt as the model got it (on a terminal; a pipe gets the text only), and
        the printer of the streamed text after it."""
        if self.interactive and prompt:
            self.console.print(Text(safe_text(prompt), style="bold"), end="", soft_wrap=True)
        return StreamPrinter(self.console, "cyan")

    def replied(self, shown: str, stats, window: int | None, total: int, stopped: bool) -> None:
        """The end of a reply whose text on the screen ends with `shown`: on a terminal, the status line
        (status_line's arguments); in a pipe one continuation per line of output (plus its own newlines)."""
        if not self.interactive:
            self.console.print()
            return
        if shown and not shown.endswith("\n"):
            self.console.print()
        width = self.console.width if self.console.is_terminal else None  # a pipe gets one whole line
        self.console.print(status_line(stats, window, total, stopped, width), soft_wrap=width is None)

    # the viewers (imported here: `charlm sample` prints through this module too)
    def attention(self, tokenizer, att, opts) -> None:
        from charlm.views.attention import draw_attention
        from charlm.views.heatmap import Screen

        draw_attention(self.console, tokenizer, att, opts, Screen.of(self.console, opts.ascii))

    def units_that_fit(self, tokenizer, ids: list[int], kind: str, layer: int, opts):
        """fits(trace) -> how many units of the gates view fit this screen (for commands.look.gates)."""
        from charlm.views.gates import units_that_fit
        from charlm.views.heatmap import Screen

        screen = Screen.of(self.console, opts.ascii)
        return lambda trace: units_that_fit(tokenizer, ids, kind, layer, trace, opts, screen)

    def gates(self, tokenizer, found, opts) -> None:
        from charlm.views.gates import draw_gates
        from charlm.views.heatmap import Screen

        draw_gates(self.console, tokenizer, found, opts, Screen.of(self.console, opts.ascii))


class StreamPrinter:
    """Writes streamed model text to a console: made visible (safe_text), never markup, and printed at
    most `fps` times a second, since a full rich print costs ~100 µs and a token ~0.3 ms."""

    def __init__(self, console: Console, style: str, fps: float = 60.0):
        self.console, self.style, self.interval = console, style, 1.0 / fps
        self.buffer: list[str] = []
        self.last = 0.0

    def write(self, piece: str) -> None:
        self.buffer.append(piece)
        now = time.perf_counter()
        if now - self.last >= self.interval:
            self.flush()
            self.last = now

    def flush(self) -> None:
        if not self.buffer:
            return
        text = "".join(self.buffer)
        self.buffer = []
        self.console.print(Text(safe_text(text), style=self.style), end="", soft_wrap=True)


def print_rows(console: Console, rows: list[tuple[str, str]], title: str | None = None) -> None:
    """Two columns, the first bold: /help's commands, /show's settings. Every cell is Text, never markup
    ("[args]", a stop string like "[b]")."""
    table = Table(
        show_header=False,
        box=None,
        padding=(0, 2, 0, 0),
        title=Text(safe_text(title), style="bold") if title else None,
        title_justify="left",
    )
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    for name, value in rows:
        table.add_row(Text(safe_text(name)), Text(safe_text(value)))
    console.print(table)


def print_banner(console: Console, name: str, about: str, hint: str) -> None:
    console.print(
        Text.assemble(("charlm chat", "bold"), " · ", safe_text(name), (f" ({about})", "dim")),
        soft_wrap=not console.is_terminal,  # a terminal: wrapped at spaces, never inside a word
    )
    console.print(Text(hint, style="dim"))


def status_line(stats, window: int | None, total: int, stopped: bool, width: int | None = None) -> Text:
    """After a generation: tokens, speed, time to the first token, and how much of the running text (total
    tokens) the model sees: all of it, or the last `window`. Wider than `width`, it breaks between its parts,
    after a ' · ' (each part whole: a terminal would cut a number, Rich a part at a space)."""
    parts = [f"{stats.tokens:,} tokens", f"{stats.tokens_per_s:,.0f} tokens/s", f"first token {stats.ttft_ms:.0f} ms"]
    if window is None:
        parts.append(f"state after {total:,} tokens (no context limit)")
    elif total > window:
        parts.append(f"context: the last {window} of {total:,} tokens")
    else:
        parts.append(f"context {total}/{window}")
    if stopped:
        parts.insert(0, "stopped")
    lines = [parts[0]]
    for part in parts[1:]:
        if width is not None and cell_len(lines[-1]) + len(" · ") + cell_len(part) > width:
            lines[-1] += " ·"
            lines.append(part)
        else:
            lines[-1] += " · " + part
    return Text("\n".join(lines), style="dim")


def print_samples(console: Console, samples, echo: bool = True) -> list:
    """`charlm sample`'s output: each continuation as it streams (after its prompt, with echo), '---' between
    them. A terminal gets safe, styled text; a pipe or a file the exact text. Returns each sample's Stats."""
    printer = StreamPrinter(console, "")

    def write(piece: str, style: str = "") -> None:
        if not console.is_terminal:
            console.file.write(piece)
            console.file.flush()
        elif style:
            printer.flush()
            console.print(safe(piece, style), end="", soft_wrap=True)
        else:
            printer.write(piece)

    done = []
    for i, c in enumerate(samples):
        if i:
            write("---\n", "dim")
        if echo and c.prompt:
            write(c.prompt, "bold")
        last = c.prompt if echo else ""
        try:
            for last in c.pieces:
                write(last)
        finally:  # Ctrl-C included: what was generated is shown
            printer.flush()
        if last and not last.endswith("\n"):
            write("\n")
        done.append(c.stats)
    printer.flush()  # the text's last newline reaches the terminal before a stats line on stderr
    return done
