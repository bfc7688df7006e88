"""The REPL that `charlm chat` and `charlm compare -i` share: the loop over the input lines, /help, /set,
/bye and one-line hints. Session is the shared part; commands.chat.Chat and commands.compare.CompareSession
add their own commands and what a prompt does. The lines come from views.repl.LineReader; what is shown goes
through views.chat.ChatView.

The commands follow `ollama run` where it has one (/bye, /?, /set parameter KEY VALUE), so its habits work
here. /set KEY VALUE takes every field of config.SampleConfig (a new setting there is a new key here), and
the names other programs give the same settings (ALIASES). Ctrl-C stops a running generation or clears the
line: it never leaves, which would lose the running text and the settings.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys

from rich.console import Console

from charlm.config import SampleConfig
from charlm.errors import ConfigError
from charlm.settings import NONE_WORDS, flag_fields, from_text
from charlm.views.chat import ChatView
from charlm.views.repl import LineReader
from charlm.views.text import keys_unechoed, safe_text

SETTINGS = [f.name for f in flag_fields(SampleConfig)]
# other programs' names for the same settings: ollama's (/set parameter num_predict 50), llm's and litgpt's
ALIASES = {
    "num_predict": "max_tokens",
    "max_new_tokens": "max_tokens",
    "n": "max_tokens",
    "repeat_penalty": "repetition_penalty",
    "temp": "temperature",
    "t": "temperature",
    "k": "top_k",
    "p": "top_p",
}
SHARED_COMMANDS = {
    "/help": "this list (also /?)",
    "/set": f"/set KEY VALUE: {', '.join(SETTINGS)}",
}
# ollama's and others' names for a context length: a charlm model's is fixed when it is trained (context_hint)
CONTEXT_WORDS = ("num_ctx", "n_ctx", "ctx", "context", "context_length", "num_context")
QUIT = {"/bye": "leave (also /quit, /exit, Ctrl-D)"}
QUIT_WORDS = ("/bye", "/quit", "/exit", "/q")


class Hint(Exception):
    """A one-line message for the user (a bad command or value); the REPL goes on."""


class Session:
    """What chat and compare -i share: the loop over LineReader, /help, /set, /quit and one-line hints.
    A subclass gives COMMANDS, generate(prompt) and own_command(name, rest) for its own commands."""

    COMMANDS: dict[str, str] = {**SHARED_COMMANDS, **QUIT}
    OTHER_NAMES: tuple[str, ...] = ()  # more names of the subclass's commands (chat's /reset for /clear)
    COMPLETIONS: dict[str, list[str]] = {"/set": [k + " " for k in (*SETTINGS, "parameter")]}  # Tab after them
    HELP_ROWS: list[tuple[str, str]] = [
        ('"""', 'a multi-line prompt, up to the next """'),
        ("paste", "several lines pasted are one prompt: Enter sends it"),
        ("Ctrl-C", "stop a generation, or clear the line (it never leaves)"),
        ("Ctrl-L", "clear the screen (the line typed stays)"),
    ]

    def __init__(self, settings: SampleConfig, console: Console | None, interactive: bool | None):
        self.settings = settings
        self.interactive = sys.stdin.isatty() if interactive is None else interactive
        self.view = ChatView(console, self.interactive)
        self.console = self.view.console

    def run(self) -> None:
        self.start()
        self.loop()

    def start(self) -> None:
        if self.interactive:
            with keys_unechoed():  # keys typed meanwhile wait for the prompt
                self.banner()

    def loop(self) -> None:
        lines = iter(LineReader(self.console, self.interactive, self.COMMANDS, self.COMPLETIONS))
        try:
            for line, fenced in lines:
                if not self.handle(line, fenced):
                    break
        finally:
            lines.close()  # saves the history now, also after /quit

    def banner(self) -> None:
        """What a terminal session starts with."""

    def generate(self, prompt: str) -> None:
        raise NotImplementedError

    def handle(self, line: str, fenced: bool = False) -> bool:
        """One input: a /command or a prompt (between triple quotes, always a prompt). False: the end."""
        try:
            if line.startswith("/") and not fenced:
                return self.command(line)
            if line.strip() or self.goes_on():
                with keys_unechoed():  # keys typed meanwhile (^C too) stay out of the model's text
                    self.generate(line)
        except Hint as e:
            self.hint(str(e))
        except KeyboardInterrupt:  # e.g. during a long /attn
            self.view.newline()
            self.hint("stopped")
        except Exception as e:  # a bug: one line, never a traceback (CHARLM_DEBUG=1 shows it)
            if os.environ.get("CHARLM_DEBUG"):
                raise
            self.hint(f"unexpected {type(e).__name__}: {e} (CHARLM_DEBUG=1 shows the traceback; please report it)")
        return True

    def hint(self, message: str, style: str = "yellow") -> None:
        self.view.hint(message, style)

    def command(self, line: str) -> bool:
        name, _, rest = line.strip().partition(" ")
        rest = rest.strip()
        name = name.lower()
        if name in QUIT_WORDS:
            return False
        if name in ("/help", "/?"):
            self.view.rows([*self.COMMANDS.items(), *self.HELP_ROWS])
        elif name == "/set":
            self.set(rest)
        else:
            self.own_command(name, rest)
        return True

    def own_command(self, name: str, rest: str) -> None:
        """A command beyond the shared ones (the subclass's); unknown ones raise Hint."""
        known = [*self.COMMANDS, *QUIT_WORDS, *self.OTHER_NAMES]
        raise Hint(
            f"unknown command {name}{did_you_mean(name, known)}: /help lists them (text starting with /: a space first)"
        )

    def context_hint(self, key: str) -> str:
        """Why /set num_ctx cannot change what the model sees (a subclass names its model's context)."""
        return f"{key}: a charlm model's context is fixed when it is trained (charlm train --context N)"

    def goes_on(self) -> bool:
        """Whether Enter on an empty line generates (chat's continue mode)."""
        return False

    def set(self, rest: str) -> None:
        """/set KEY VALUE (or KEY=VALUE, or ollama's /set parameter KEY VALUE): any SampleConfig field."""
        rest = re.sub(r"^parameter\s+", "", rest, flags=re.I)
        m = re.match(r"([A-Za-z_-]+)\s*(?:=|\s|$)(.*)", rest)
        key, value = (m.group(1).lower().replace("-", "_"), unquote(m.group(2).strip())) if m else ("", "")
        key = ALIASES.get(key, key)
        if key in CONTEXT_WORDS:
            raise Hint(self.context_hint(key))
        if key not in SETTINGS:
            usage = f"/set KEY VALUE, with KEY one of {', '.join(SETTINGS)}"
            if not key:
                raise Hint(f"usage: {usage}")
            raise Hint(f"no setting {key}{did_you_mean(key, [*SETTINGS, *ALIASES])}; usage: {usage}")
        f = next(f for f in flag_fields(SampleConfig) if f.name == key)
        if not value:
            raise Hint(f"/set {key} needs a value, e.g. /set {key} {f.metadata['example'] or f.default}")
        try:
            parsed = from_text(f, value)
            if f.type.startswith("list"):  # the stop strings: one value, or none
                parsed = [] if value.lower() in NONE_WORDS else [parsed]
            self.settings = dataclasses.replace(self.settings, **{key: parsed})  # (checked as it is made)
        except ConfigError as e:
            raise Hint(f"bad value for {key}: {e}") from None
        self.hint(f"{key} = {show_value(parsed)}", style="green")


def did_you_mean(word: str, options) -> str:
    """' (did you mean X?)' for a mistyped word, when one of options is close to it; else ''."""
    import difflib

    close = difflib.get_close_matches(word.lower(), list(options), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def unquote(value: str) -> str:
    """A value typed in quotes, as a shell would read it: "\\n" -> \\n (its escapes are the setting's to read).
    A quote opened and never closed is refused, as a shell refuses it (it would be part of a stop string)."""
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    if value[:1] in ("'", '"'):
        raise Hint(f"the value opens a quote ({value[0]}) and never closes it: close it, or leave the quotes out")
    return value


def show_value(value) -> str:
    """A setting's value as /set and /show say it: stop strings quoted, None as 'none'."""
    if isinstance(value, list):
        return ", ".join(safe_text(repr(v)) for v in value) or "none"
    return "none" if value is None else str(value)
