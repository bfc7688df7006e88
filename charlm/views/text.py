"""The one safe path to the terminal for every string from outside the program (model text, prompts,
paths, corpus and run names, checkpoint fields): shown literally, never parsed as markup, and control
characters made visible, so text full of ANSI/OSC escapes or BEL cannot drive the user's terminal."""

from __future__ import annotations

import json
import os
import shlex
import unicodedata
from typing import NoReturn

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


def print_error(message: str) -> None:
    """One line on stderr, printed literally: a path such as 'notes[1].txt' is not Rich markup, and a
    multi-line message from a library is folded onto one line."""
    line = " ".join(part.strip() for part in str(message).splitlines() if part.strip())
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
