"""The one input loop of `charlm chat` and `charlm compare -i`, and chat's REPL, which streams a model's
continuation of each prompt, token by token.

LineReader reads the lines; Session holds what both commands share (the loop, /help, /set, /bye, hints);
Repl is chat, views.compare.CompareRepl is compare -i. The commands follow `ollama run` where it has one
(/bye, /clear, /?, /set parameter KEY VALUE, /load), so its habits work here. On a terminal: line editing
and history (readline; the history file lives in the charlm cache directory), tab completion of /commands,
a multi-line paste arrives as one prompt (readline's bracketed paste), multi-line input between \"\"\"
marks, Ctrl-C stops a running generation or clears the line (it never leaves: that loses the running text
and the settings), Ctrl-D or /bye leaves. With stdin not a terminal, every input line is a prompt and the
output is plain text: scriptable.

Model text is always shown through safe_text in rich Text objects: never parsed as markup, and
control characters (ESC, BEL, ...) appear as visible escapes instead of reaching the terminal.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from charlm import checkpoint, files
from charlm.checkpoint import Checkpoint, CheckpointError
from charlm.config import ConfigError
from charlm.data import cache_dir
from charlm.generate import SampleConfig, Streamer
from charlm.models import count_params
from charlm.tokenizer import UNKNOWN_POLICIES, UnknownCharactersError
from charlm.views.attention import show_attention
from charlm.views.gates import show_gates
from charlm.views.text import safe_text

SHARED_COMMANDS = {
    "/help": "this list (also /?)",
    "/set": "/set KEY VALUE: temperature, top_k, top_p, repetition_penalty, max_tokens, seed, stop, unknown",
}
QUIT = {"/bye": "leave (also /quit, /exit, Ctrl-D)"}
QUIT_WORDS = ("/bye", "/quit", "/exit", "/q")
LEAVE_HINT = "Ctrl-D or /bye leaves"
COMMANDS = {  # chat's, in the order /help lists them
    **SHARED_COMMANDS,
    "/show": "the settings and the model",
    "/clear": "forget the running text (also /reset)",
    "/load": "/load CKPT: switch to another checkpoint (a file or a run directory), keeping the settings",
    "/mode": "/mode fresh|continue: each prompt starts anew, or continues the running text",
    "/attn": "/attn [args]: the attention over the running text (transformer; /attn help)",
    "/gates": "/gates [args]: the gates over the running text (LSTM/GRU; /gates help)",
    "/save": "/save FILE: write the transcript to FILE",
    **QUIT,
}
SETTINGS = ("temperature", "top_k", "top_p", "repetition_penalty", "max_tokens", "seed", "stop", "unknown")
MODES = ("fresh", "continue")
FENCE = '"""'
PROMPT, MORE = ">>> ", "... "


def unescape(text: str) -> str:
    r"""'\n', '\t', '\r' and '\\' typed as two characters -> the character itself (for stop strings)."""
    return re.sub(r"\\([ntr\\])", lambda m: {"n": "\n", "t": "\t", "r": "\r", "\\": "\\"}[m.group(1)], text)


class Hint(Exception):
    """A one-line message for the user (a bad command or value); the REPL goes on."""


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


class LineReader:
    """Input lines as (line, fenced) pairs. On a terminal: readline editing, tab completion of `commands`,
    history in the cache directory, a paste as one line (newlines kept), \"\"\" multi-line prompts, Ctrl-C
    drops a half-typed line (at an empty prompt it says how to leave), Ctrl-D leaves. Otherwise: each line
    of stdin (\"\"\" blocks joined)."""

    def __init__(self, console: Console, interactive: bool, commands: dict[str, str]):
        self.console, self.interactive, self.commands = console, interactive, commands
        self.history: Path | None = None

    def __iter__(self):
        if not self.interactive:
            yield from self._piped_lines()
            return
        self._setup_readline()
        try:
            yield from self._terminal_lines()
        finally:
            self._save_history()

    def _terminal_lines(self):
        while True:
            try:
                line = input(PROMPT)
            except EOFError:  # Ctrl-D
                self.console.print()
                return
            except KeyboardInterrupt:  # Ctrl-C drops the line; at an empty prompt it says how to leave
                typed = _line_buffer()
                self.console.print()
                if not typed.strip():
                    self.console.print(Text(f"({LEAVE_HINT})", style="dim"))
                continue
            fenced = line.lstrip().startswith(FENCE)
            if fenced:
                try:
                    line = self._fenced(line, lambda: input(MORE))
                except KeyboardInterrupt:  # Ctrl-C inside a multi-line prompt drops that prompt
                    self.console.print()
                    continue
            yield line, fenced

    def _piped_lines(self):
        lines = (line.rstrip("\n") for line in sys.stdin)
        for line in lines:
            fenced = line.lstrip().startswith(FENCE)
            if fenced:
                line = self._fenced(line, lambda: next(lines))
            yield line, fenced

    def _fenced(self, first: str, read) -> str:
        """Multi-line input: from a line starting with \"\"\" to the next \"\"\"."""
        rest = first.lstrip()[len(FENCE) :]
        if FENCE in rest:
            return rest[: rest.index(FENCE)]
        parts = [rest] if rest else []
        while True:
            try:
                line = read()
            except (StopIteration, EOFError):  # the input ended: send what there is
                break
            if FENCE in line:
                parts.append(line[: line.index(FENCE)])
                break
            parts.append(line)
        return "\n".join(parts)

    def _setup_readline(self) -> None:
        try:
            import readline
        except ImportError:  # e.g. Windows without pyreadline: plain input() still works
            return
        readline.set_completer(lambda text, state: _complete(self.commands, text, state))
        readline.set_completer_delims(" \t\n")
        if "libedit" in (readline.__doc__ or ""):
            readline.parse_and_bind("bind ^I rl_complete")
        else:
            readline.parse_and_bind("tab: complete")
            # CPython turns bracketed paste off (for its own >>> prompt); on, readline inserts a paste, newlines
            # and all, as one edit: several pasted lines become one prompt, sent with Enter
            readline.parse_and_bind("set enable-bracketed-paste on")
        self.history = cache_dir() / "chat_history"
        readline.set_history_length(1000)
        try:
            readline.read_history_file(self.history)
        except OSError:  # no history yet, or unreadable: start without
            pass

    def _save_history(self) -> None:
        if self.history is None:
            return
        import readline

        try:
            self.history.parent.mkdir(parents=True, exist_ok=True)
            readline.write_history_file(self.history)
        except OSError:  # a read-only cache dir costs the history, not the session
            pass


class Session:
    """What chat and compare -i share: the loop over LineReader, /help, /set, /quit and one-line hints.
    A subclass gives COMMANDS, generate(prompt) and own_command(name, rest) for its own commands."""

    COMMANDS: dict[str, str] = {**SHARED_COMMANDS, **QUIT}
    HELP_ROWS: list[tuple[str, str]] = [
        ('"""', 'a multi-line prompt, up to the next """'),
        ("paste", "several lines pasted are one prompt: Enter sends it"),
        ("Ctrl-C", "stop a generation, or clear the line (it never leaves)"),
    ]

    def __init__(self, settings: SampleConfig, console: Console | None, unknown: str, interactive: bool | None):
        self.settings = settings
        self.unknown = unknown
        self.interactive = sys.stdin.isatty() if interactive is None else interactive
        self.console = console or Console(highlight=False)
        # hints and confirmations: beside the text on a terminal, on stderr when scripted (stdout: text only)
        self.info = self.console if self.interactive else Console(stderr=True, highlight=False)

    def run(self) -> None:
        if self.interactive:
            self.banner()
        lines = iter(LineReader(self.console, self.interactive, self.COMMANDS))
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
                self.generate(line)
        except Hint as e:
            self.hint(str(e))
        except KeyboardInterrupt:  # e.g. during a long /attn
            self.console.print()
            self.hint("stopped")
        except Exception as e:  # a bug: one line, never a traceback (CHARLM_DEBUG=1 shows it)
            if os.environ.get("CHARLM_DEBUG"):
                raise
            self.hint(f"unexpected {type(e).__name__}: {e} (CHARLM_DEBUG=1 shows the traceback; please report it)")
        return True

    def hint(self, message: str, style: str = "yellow") -> None:
        self.info.print(Text(safe_text(message), style=style), soft_wrap=True)

    def command(self, line: str) -> bool:
        name, _, rest = line.strip().partition(" ")
        rest = rest.strip()
        name = name.lower()
        if name in QUIT_WORDS:
            return False
        if name in ("/help", "/?"):
            self.show_help()
        elif name == "/set":
            self.set(rest)
        else:
            self.own_command(name, rest)
        return True

    def own_command(self, name: str, rest: str) -> None:
        """A command beyond the shared ones (the subclass's); unknown ones raise Hint."""
        raise Hint(
            f"unknown command {name}: /help lists them (to send text that starts with /, "
            f'begin it with a space or put it in """ marks)'
        )

    def goes_on(self) -> bool:
        """Whether Enter on an empty line generates (chat's continue mode)."""
        return False

    def show_help(self) -> None:
        table = Table(show_header=False, box=None, padding=(0, 2, 0, 0))
        table.add_column(style="bold")
        table.add_column()
        rows = [*self.COMMANDS.items(), *self.HELP_ROWS]
        for name, text in rows:
            table.add_row(Text(name), Text(text))  # Text, not str: "[args]" is not markup
        self.console.print(table)

    def set(self, rest: str) -> None:
        rest = re.sub(r"^parameter\s+", "", rest, flags=re.I)  # ollama's spelling: /set parameter temperature 0.5
        m = re.match(r"([A-Za-z_-]+)\s*(?:=|\s|$)(.*)", rest)  # KEY VALUE or KEY=VALUE
        key, value = (m.group(1).lower().replace("-", "_"), m.group(2).strip()) if m else (rest, "")
        if key not in SETTINGS:
            raise Hint(f"usage: /set KEY VALUE, with KEY one of {', '.join(SETTINGS)}")
        if not value:
            raise Hint(f"/set {key} needs a value, e.g. /set {key} {_EXAMPLES[key]}")
        if key == "unknown":
            if value not in UNKNOWN_POLICIES:
                raise Hint(f"/set unknown takes {', '.join(UNKNOWN_POLICIES)}, not {value!r}")
            self.unknown = value
            self.hint(f"unknown = {value}", style="green")
            return
        try:
            parsed = _parse_setting(key, value)
            self.settings = dataclasses.replace(self.settings, **{key: parsed}).validate()
        except (ValueError, ConfigError) as e:
            raise Hint(f"bad value for {key}: {e}") from None
        self.hint(f"{key} = {_show_value(parsed)}", style="green")


class Repl(Session):
    """`charlm chat`: one model, its running text, and the viewers on it."""

    COMMANDS = COMMANDS
    HELP_ROWS = [
        Session.HELP_ROWS[0],
        ("Enter", "on an empty line in continue mode: go on with the text"),
        *Session.HELP_ROWS[1:],
    ]

    def __init__(
        self,
        ckpt: Checkpoint,
        settings: SampleConfig,
        console: Console | None = None,
        mode: str = "fresh",
        use_cache: bool = True,
        unknown: str = "drop",
        interactive: bool | None = None,
    ):
        self.talk_to(ckpt, use_cache)
        super().__init__(settings, console, unknown, interactive)
        self.mode = mode
        self.transcript: list[tuple[str, str]] = []

    # ---- generation -----------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        tok = self.ckpt.tokenizer
        try:
            return tok.encode(text, unknown="error")
        except UnknownCharactersError as e:
            shown = ", ".join(safe_text(repr(c)) for c in e.chars[:10]) + (", ..." if len(e.chars) > 10 else "")
            if self.unknown == "error":
                raise Hint(f"the model never saw {shown}: nothing sent (/set unknown drop or replace)") from None
            done = "dropped" if self.unknown == "drop" else "replaced"
            self.hint(f"{done} {len(e.chars)} character{'s' if len(e.chars) != 1 else ''} the model never saw: {shown}")
            return tok.encode(text, unknown=self.unknown)

    def talk_to(self, ckpt: Checkpoint, use_cache: bool) -> None:
        """Talk to `ckpt` from now on, with an empty running text."""
        self.ckpt = ckpt
        self.gen = Streamer(ckpt.model, ckpt.tokenizer, use_cache=use_cache)

    def generate(self, prompt: str) -> None:
        ids = self.encode(prompt)
        # the prompt as the model got it: with the characters it never saw dropped or replaced
        prompt = self.ckpt.tokenizer.decode(ids)
        if self.mode == "fresh":
            self.gen.reset()
        printer = StreamPrinter(self.console, "cyan")
        if self.interactive and prompt:
            self.console.print(Text(safe_text(prompt), style="bold"), end="", soft_wrap=True)
        out: list[str] = []
        stopped = False
        stream = self.gen.stream(ids, self.settings)
        try:
            for piece in stream:
                out.append(piece)
                printer.write(piece)
        except KeyboardInterrupt:
            stopped = True
        finally:
            stream.close()
            printer.flush()
        text = "".join(out)
        self.transcript.append((prompt, text))
        if self.interactive:
            shown = text or prompt
            if shown and not shown.endswith("\n"):
                self.console.print()
            self.status(stopped)
        else:
            self.console.print()  # one continuation per line of output (plus its own newlines)

    def status(self, stopped: bool = False) -> None:
        s = self.gen.stats
        parts = [f"{s.tokens:,} tokens", f"{s.tokens_per_s:,.0f} tokens/s", f"first token {s.ttft_ms:.0f} ms"]
        if self.gen.sliding:
            parts.append(f"context {len(self.gen.ids)}/{self.gen.context}")
        else:
            parts.append(f"state after {len(self.gen.ids)} tokens (no context limit)")
        line = ("stopped · " if stopped else "") + " · ".join(parts)
        self.console.print(Text(line, style="dim"), soft_wrap=True)

    # ---- commands -------------------------------------------------------------------------------

    def own_command(self, name: str, rest: str) -> None:
        if name == "/show":
            self.show()
        elif name in ("/clear", "/reset"):
            self.gen.reset()
            self.hint("the running text is empty now", style="green")
        elif name == "/load":
            self.load(rest)
        elif name == "/mode":
            if rest not in MODES:
                raise Hint(f"/mode is {self.mode}: use /mode fresh or /mode continue")
            self.mode = rest
            self.hint(
                f"mode {rest}: "
                + ("each prompt starts anew" if rest == "fresh" else "prompts continue the running text"),
                style="green",
            )
        elif name in ("/attn", "/gates"):
            self.viewer(name[1:], rest.split())
        elif name == "/save":
            self.save(rest)
        else:
            super().own_command(name, rest)

    def goes_on(self) -> bool:
        return self.mode == "continue" and bool(self.gen.ids)

    def show(self) -> None:
        ck, m, s = self.ckpt, self.ckpt.model_config, self.settings
        table = Table(
            show_header=False,
            box=None,
            padding=(0, 2, 0, 0),
            title=Text(safe_text(ck.name), style="bold"),
            title_justify="left",
        )
        table.add_column(style="bold")
        table.add_column()
        size = f"{m.n_layers} layer{'s' if m.n_layers != 1 else ''} × {m.d_model}"
        if m.kind == "transformer":
            size += f", {m.n_heads} heads"
        rows = [
            ("model", f"{m.kind} ({size}, context {m.context}), {count_params(ck.model):,} parameters"),
            ("tokenizer", f"{ck.tokenizer.kind}, {ck.tokenizer.vocab_size} tokens"),
        ]
        rows += [(key, _show_value(self.unknown if key == "unknown" else getattr(s, key))) for key in SETTINGS]
        rows += [
            ("mode", self.mode),
            ("cache", "on" if self.gen.use_cache else "off (--no-cache)"),
            ("running text", f"{len(self.gen.ids)} tokens"),
        ]
        for name, value in rows:
            table.add_row(Text(name), Text(value))  # Text, not str: a stop string like "[b]" is not markup
        self.console.print(table)

    def viewer(self, name: str, args: list[str]) -> None:
        can = self.ckpt.model.capabilities
        if name == "attn" and "attention" not in can:
            raise Hint(f"this {self.ckpt.model_config.kind} has no attention; /gates shows its gates")
        if name == "gates" and "gates" not in can:
            raise Hint(f"this {self.ckpt.model_config.kind} has no gates; /attn shows its attention")
        show = show_attention if name == "attn" else show_gates
        if not self.gen.ids:
            raise Hint(f"there is no text yet: type a prompt, then /{name}")
        try:
            show(self.console, self.ckpt.model, self.ckpt.tokenizer, list(self.gen.ids), args)
        except (ConfigError, ValueError) as e:
            raise Hint(str(e)) from None

    def load(self, path: str) -> None:
        if not path:
            raise Hint("usage: /load CKPT (a checkpoint file or a run directory)")
        device = next(self.ckpt.model.parameters()).device
        try:
            ckpt = checkpoint.load(Path(path).expanduser(), device=str(device))
        except CheckpointError as e:
            raise Hint(f"{e}; still talking to {self.ckpt.name}") from None
        self.talk_to(ckpt, self.gen.use_cache)
        m = ckpt.model_config
        self.hint(
            f"loaded {ckpt.name} ({m.kind}, {ckpt.tokenizer.kind} tokens, {count_params(ckpt.model):,} parameters, "
            f"context {m.context}); the running text is empty",
            style="green",
        )

    def save(self, path: str) -> None:
        if not path:
            raise Hint("usage: /save FILE")
        target = Path(path).expanduser()
        body = "".join(f"{PROMPT}{prompt}\n{prompt}{text}\n\n" for prompt, text in self.transcript)
        try:  # all or nothing: a full disk leaves no empty or half-written file
            files.atomic_write(target, lambda f: f.write(body.encode("utf-8")))
        except files.WriteError as e:
            raise Hint(str(e)) from None
        self.hint(
            f"saved {len(self.transcript)} turn{'s' if len(self.transcript) != 1 else ''} to {target}", style="green"
        )

    def banner(self) -> None:
        m = self.ckpt.model_config
        self.console.print(
            Text.assemble(
                ("charlm chat", "bold"),
                " · ",
                safe_text(self.ckpt.name),
                (f" ({m.kind}, {count_params(self.ckpt.model):,} parameters, context {m.context})", "dim"),
            ),
            soft_wrap=True,
        )
        self.console.print(
            Text(f"type a prompt; /help for commands; Ctrl-C stops a generation; {LEAVE_HINT}", style="dim")
        )


_EXAMPLES = {
    "temperature": "0.8",
    "top_k": "40",
    "top_p": "0.9",
    "repetition_penalty": "1.2",
    "max_tokens": "300",
    "seed": "42 (or none)",
    "stop": r"\n\n (or none)",
    "unknown": "drop",
}


def _parse_setting(key: str, value: str):
    if key == "stop":
        return [] if value.lower() in ("none", "off") else [unescape(value)]
    if key == "seed" and value.lower() in ("none", "random", "off"):
        return None
    try:
        return float(value) if key in ("temperature", "top_p", "repetition_penalty") else int(value)
    except ValueError:
        kind = "a number" if key in ("temperature", "top_p", "repetition_penalty") else "a whole number"
        raise ValueError(f"{value!r} is not {kind}") from None


def _show_value(value) -> str:
    if isinstance(value, list):
        return ", ".join(safe_text(repr(v)) for v in value) or "none"
    return "none" if value is None else str(value)


def _line_buffer() -> str:
    """What is typed at the prompt so far ("" without readline)."""
    try:
        import readline
    except ImportError:
        return ""
    return readline.get_line_buffer()


def _complete(commands: dict[str, str], text: str, state: int) -> str | None:
    """readline completer: /commands, then /set keys and /mode values."""
    import readline

    words = readline.get_line_buffer().lstrip().split(" ")
    if len(words) <= 1:
        options = [c + " " for c in commands if c.startswith(text)]
    elif len(words) == 2 and words[0] == "/set":
        options = [k + " " for k in (*SETTINGS, "parameter") if k.startswith(text)]
    elif len(words) == 2 and words[0] == "/mode":
        options = [m for m in MODES if m.startswith(text)]
    else:
        options = []
    return options[state] if state < len(options) else None
