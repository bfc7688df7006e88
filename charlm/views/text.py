"""The one safe path to the terminal for every string from outside the program (model text, prompts,
paths, corpus and run names, checkpoint fields): shown literally, never parsed as markup, and control
characters made visible, so text full of ANSI/OSC escapes or BEL cannot drive the user's terminal."""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
import unicodedata
from contextlib import contextmanager
from typing import NoReturn

from rich.cells import cell_len
from rich.console import Console
from rich.text import Text

# bidirectional overrides and isolates can reorder what the terminal shows ("Trojan Source")
_BIDI = set("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f")


def _visible(ch: str) -> str:
    if ch in "\n\t":
        return ch
    if ch == "\r":
        return "\\r"
    if unicodedata.category(ch) in ("Cc", "Cs") or ch in _BIDI:  # Cs: a lone surrogate (an undecodable byte)
        code = ord(ch)
        return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
    return ch


def safe_text(text: str) -> str:
    """text with every control character (but newline and tab) written as an escape like \\x1b."""
    if text.isprintable():  # fast path: nothing to escape (isprintable is False for \n too)
        return text
    return "".join(_visible(ch) for ch in text)


def safe(text: object, style: str = "") -> Text:
    """An outside string as Rich Text: never markup, control characters visible."""
    return Text(safe_text(str(text)), style=style)


def shell_quote(text: object) -> str:
    """A path or name quoted for a command line the user may copy: shlex.quote, or bash's $'...' with
    escapes when it holds control characters, so the printed command is both harmless and exact."""
    text = str(text)
    if text.isprintable():
        return shlex.quote(text)
    escaped = (
        _visible(ch) if ch not in "\\'\n\t" else {"\\": "\\\\", "'": "\\'", "\n": "\\n", "\t": "\\t"}[ch] for ch in text
    )
    return "$'" + "".join(escaped) + "'"


# one word of a shell command: quoted pieces (which may hold spaces) and other characters, up to a space
_SHELL_WORD = re.compile(r"""(?:\$'(?:\\.|[^'\\])*'|'[^']*'|"(?:\\.|[^"\\])*"|[^\s'"$]|\$)+""")


def command_lines(command: str, width: int | None, indent: str = "  ", lead: str | None = None) -> list[str]:
    """A command to be copied into a shell (its words quoted already), as lines that fit `width`, the first after
    `lead` (default: the indent): broken only between words, a flag kept with its value, each broken line ending
    in ' \\' so the lines paste as one command. A word longer than a line stands alone on its own (the terminal
    folds it; nothing splits it)."""
    lead = indent if lead is None else lead
    words = _SHELL_WORD.findall(command)
    if width is None or cell_len(lead + command) <= width:
        return [lead + command]
    more = indent + "  "
    units: list[list[str]] = []
    for word in words:  # "--out PATH" stays together...
        if units and len(units[-1]) == 1 and units[-1][0].startswith("-") and not word.startswith("-"):
            units[-1].append(word)
        else:
            units.append([word])
    # ...unless the two do not fit one line together
    pieces = []
    for unit in units:
        pieces += [" ".join(unit)] if cell_len(more + " ".join(unit)) + 2 <= width else unit
    lines, line = [], lead + pieces[0]
    for piece in pieces[1:]:
        if cell_len(line + " " + piece) + 2 <= width:  # room for the piece and a ' \\' after it
            line += " " + piece
        else:
            lines.append(line + " \\")
            line = more + piece
    return [*lines, line]


def duration(seconds: float) -> str:
    """How long something took or will take, one way everywhere: '0.4s', '9.7s', '45s', '2m04s', '1h05m'
    (what --max-time reads back: settings.parse_duration)."""
    if seconds < 9.95:
        return f"{seconds:.1f}s"
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


MAX_WORD = 512  # characters of one word of an error shown whole (a path is rarely longer; 100 KB of argument is)
MAX_LINE = 4096  # characters of an error line shown whole


def _cut(text: str, head: int, tail: int) -> str:
    return f"{text[:head]}...[{len(text) - head - tail:,} characters]...{text[-tail:]}"


def clip(line: str) -> str:
    """line with every word (a run without spaces) longer than MAX_WORD cut in the middle, saying how much,
    and then the line itself if it is longer than MAX_LINE: an error that quotes what the user typed
    (`charlm help <100 KB>`) stays a line, not a screenful."""
    if len(line) <= MAX_WORD:
        return line
    line = re.sub(rf"\S{{{MAX_WORD + 1},}}", lambda m: _cut(m.group(0), MAX_WORD // 2, 64), line)
    return _cut(line, MAX_LINE // 2, MAX_LINE // 4) if len(line) > MAX_LINE else line


def print_error(message: str) -> None:
    """One line on stderr, printed literally: a path such as 'notes[1].txt' is not Rich markup, a
    multi-line message from a library is folded onto one line, and a huge word in it, or a huge line, is cut (clip)."""
    line = clip(" ".join(part.strip() for part in str(message).splitlines() if part.strip()))
    if int(os.environ.get("WORLD_SIZE", 1)) > 1:  # under torchrun: say which process failed
        line = f"rank {os.environ.get('RANK', '?')}: {line}"
    err_console().print(Text.assemble(("error: ", "red"), safe(line)), soft_wrap=True)


def err_console(**kw) -> Console:
    return Console(stderr=True, highlight=False, **kw)


class PipeClosed(Exception):
    """stdout's reader went away."""


def _pipe_closed() -> NoReturn:
    raise PipeClosed


def out_console(**kw) -> Console:
    """Where a command's results go. A reader that goes away (`| head`) raises PipeClosed, for the CLI to end
    quietly as SIGPIPE would (Rich's own answer is exit 1, which reads as a failure)."""
    console = Console(highlight=False, **kw)
    console.on_broken_pipe = _pipe_closed
    return console


def print_notes(notes: list[str]) -> None:
    """What a command skipped (a damaged line of a run file): one yellow line each, on stderr."""
    for note in notes:
        err_console().print(safe(note, "yellow"), soft_wrap=True)


def print_json(value) -> None:
    """A command's result as one JSON object on stdout (--json)."""
    print(json.dumps(value))


class Loading:
    """`with Loading("loading RUN") as status:` a spinner and what is going on, on stderr, drawn the moment the
    block starts (a slow step: importing torch, loading a model, encoding a text), gone when it ends; only on a
    terminal (a pipe or a file gets nothing). status.update(what) says what comes next."""

    def __init__(self, what: str, console: Console | None = None):
        self.console, self.what, self.live = console or err_console(), what, None

    def __enter__(self) -> Loading:
        if self.console.is_terminal:
            from rich.live import Live
            from rich.spinner import Spinner

            self.spinner = Spinner("dots", safe(self.what, "dim"))
            self.live = Live(self.spinner, console=self.console, transient=True, refresh_per_second=12.5)
            self.live.start(refresh=True)  # now, not at the first tick of its thread
        return self

    def update(self, what: str) -> None:
        if self.live is not None:
            self.spinner.update(text=safe(what, "dim"))
            self.live.refresh()

    def __exit__(self, *exc) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None


@contextmanager
def keys_unechoed(stream=None, keep_ctrl_d: bool = False):
    """Keys typed inside the block are not echoed by the terminal (nor ^C for Ctrl-C): they wait in its input
    buffer, and readline shows them at the next prompt instead of above a banner or inside a model's text.
    keep_ctrl_d: the terminal also leaves the keys unread as lines (no ICANON), so a Ctrl-D reaches readline
    as typed and leaves at the first prompt (a line discipline reading lines would swallow it).
    Nothing happens when stdin is not a terminal."""
    stream = stream or sys.stdin
    try:
        import termios

        fd = stream.fileno()
        saved = termios.tcgetattr(fd) if stream.isatty() else None
    except (ImportError, OSError, ValueError, AttributeError):  # no termios (Windows), no file descriptor
        saved = None
    except termios.error:
        saved = None
    if saved is None:
        yield
        return
    quiet = list(saved)
    quiet[3] &= ~(termios.ECHO | termios.ECHOCTL | (termios.ICANON if keep_ctrl_d else 0))
    try:
        termios.tcsetattr(fd, termios.TCSANOW, quiet)  # TCSANOW: the keys typed so far stay in the buffer
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSANOW, saved)
