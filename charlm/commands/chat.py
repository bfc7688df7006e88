"""The REPL behind `charlm chat` and `charlm compare -i`: the one input loop, what each /command does, and
chat itself, which streams a model's continuation of each prompt, token by token, and shows the attention
or the gates over its running text. Drawing is charlm.views (chat.py, attention.py, gates.py).

LineReader reads the lines; Session holds what both commands share (the loop, /help, /set, /bye, hints);
Chat is chat, commands.compare.CompareSession is compare -i. The commands follow `ollama run` where it has
one (/bye, /clear, /?, /set parameter KEY VALUE, /load), so its habits work here. On a terminal: line
editing and history (readline; the history file lives in the charlm cache directory), tab completion of
/commands, a multi-line paste arrives as one prompt (readline's bracketed paste), multi-line input between
\"\"\" marks, Ctrl-C stops a running generation or clears the line (it never leaves: that loses the running
text and the settings), Ctrl-D or /bye leaves. With stdin not a terminal, every input line is a prompt and
the output is plain text: scriptable.

/set KEY VALUE takes every field of config.SampleConfig, /attn and /gates the fields of options.AttnConfig
and GatesConfig as words: a new setting there is a new word here, with its help.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from pathlib import Path

from rich.console import Console
from rich.text import Text

from charlm import checkpoint, files
from charlm.checkpoint import Checkpoint
from charlm.commands import look
from charlm.commands.runs import model_path
from charlm.config import SampleConfig
from charlm.data import cache_dir
from charlm.errors import CheckpointError, ConfigError
from charlm.generate import Streamer
from charlm.models import count_params
from charlm.options import AttnConfig, ChatOptions, GatesConfig
from charlm.runtime import pick_device
from charlm.settings import NONE_WORDS, flag_fields, from_text
from charlm.tokenizer import UnknownCharactersError
from charlm.views.attention import draw_attention
from charlm.views.chat import StreamPrinter, print_banner, print_rows, status_line
from charlm.views.gates import draw_gates, units_that_fit
from charlm.views.heatmap import Screen
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
QUIT = {"/bye": "leave (also /quit, /exit, Ctrl-D)"}
QUIT_WORDS = ("/bye", "/quit", "/exit", "/q")
ALSO = ("/reset",)  # other names of chat's commands (/clear)
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
MODES = ("fresh", "continue")
VIEWERS = {"attn": AttnConfig, "gates": GatesConfig}
FENCE = '"""'
PROMPT, MORE = ">>> ", "... "


class Hint(Exception):
    """A one-line message for the user (a bad command or value); the REPL goes on."""


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

    def __init__(self, settings: SampleConfig, console: Console | None, interactive: bool | None):
        self.settings = settings
        self.interactive = sys.stdin.isatty() if interactive is None else interactive
        self.console = console or Console(highlight=False)
        # hints and confirmations: beside the text on a terminal, on stderr when scripted (stdout: text only)
        self.info = self.console if self.interactive else Console(stderr=True, highlight=False)

    def run(self) -> None:
        self.start()
        self.loop()

    def start(self) -> None:
        if self.interactive:
            with keys_unechoed():  # keys typed meanwhile wait for the prompt
                self.banner()

    def loop(self) -> None:
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
                with keys_unechoed():  # keys typed meanwhile (^C too) stay out of the model's text
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
        # on a terminal Rich wraps at spaces (the terminal would cut words and numbers); a pipe gets whole lines
        self.info.print(Text(safe_text(message), style=style), soft_wrap=not self.info.is_terminal)

    def command(self, line: str) -> bool:
        name, _, rest = line.strip().partition(" ")
        rest = rest.strip()
        name = name.lower()
        if name in QUIT_WORDS:
            return False
        if name in ("/help", "/?"):
            print_rows(self.console, [*self.COMMANDS.items(), *self.HELP_ROWS])
        elif name == "/set":
            self.set(rest)
        else:
            self.own_command(name, rest)
        return True

    def own_command(self, name: str, rest: str) -> None:
        """A command beyond the shared ones (the subclass's); unknown ones raise Hint."""
        known = [*self.COMMANDS, *QUIT_WORDS, *(ALSO if "/clear" in self.COMMANDS else ())]
        raise Hint(
            f"unknown command {name}{did_you_mean(name, known)}: /help lists them (text starting with /: a space first)"
        )

    def goes_on(self) -> bool:
        """Whether Enter on an empty line generates (chat's continue mode)."""
        return False

    def set(self, rest: str) -> None:
        """/set KEY VALUE (or KEY=VALUE, or ollama's /set parameter KEY VALUE): any SampleConfig field."""
        rest = re.sub(r"^parameter\s+", "", rest, flags=re.I)
        m = re.match(r"([A-Za-z_-]+)\s*(?:=|\s|$)(.*)", rest)
        key, value = (m.group(1).lower().replace("-", "_"), unquote(m.group(2).strip())) if m else ("", "")
        key = ALIASES.get(key, key)
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
            self.settings = dataclasses.replace(self.settings, **{key: parsed}).validate()
        except ConfigError as e:
            raise Hint(f"bad value for {key}: {e}") from None
        self.hint(f"{key} = {show_value(parsed)}", style="green")


class Chat(Session):
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
        interactive: bool | None = None,
    ):
        self.talk_to(ckpt, use_cache)
        super().__init__(settings, console, interactive)
        self.mode = mode
        self.transcript: list[tuple[str, str]] = []

    # ---- generation -----------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        tok, unknown = self.ckpt.tokenizer, self.settings.unknown
        try:
            return tok.encode(text, unknown="error")
        except UnknownCharactersError as e:
            shown = ", ".join(safe_text(repr(c)) for c in e.chars[:10]) + (", ..." if len(e.chars) > 10 else "")
            if unknown == "error":
                raise Hint(f"the model never saw {shown}: nothing sent (/set unknown drop or replace)") from None
            done = "dropped" if unknown == "drop" else "replaced"
            self.hint(f"{done} {len(e.chars)} character{'s' if len(e.chars) != 1 else ''} the model never saw: {shown}")
            return tok.encode(text, unknown=unknown)

    def talk_to(self, ckpt: Checkpoint, use_cache: bool) -> None:
        """Talk to `ckpt` from now on, with an empty running text."""
        self.ckpt = ckpt
        self.gen = Streamer(ckpt.model, ckpt.tokenizer, use_cache=use_cache)
        self.total = 0  # tokens in the running text (a Transformer sees the last gen.context of them)

    def generate(self, prompt: str) -> None:
        ids = self.encode(prompt)
        # the prompt as the model got it: with the characters it never saw dropped or replaced
        prompt = self.ckpt.tokenizer.decode(ids)
        if self.mode == "fresh":
            self.gen.reset()
            self.total = 0
        self.total += len(ids)
        if self.gen.sliding and self.total > self.gen.context and self.interactive:
            what = "the prompt" if self.total == len(ids) else "the running text with this prompt"
            self.hint(f"{what} is {self.total} tokens: the model sees its last {self.gen.context} (its context)")
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
        self.total += self.gen.stats.tokens
        self.transcript.append((prompt, text))
        if self.interactive:
            shown = text or prompt
            if shown and not shown.endswith("\n"):
                self.console.print()
            window = self.gen.context if self.gen.sliding else None
            status = status_line(self.gen.stats, window, self.total, stopped)
            self.console.print(status, soft_wrap=not self.console.is_terminal)
        else:
            self.console.print()  # one continuation per line of output (plus its own newlines)

    # ---- commands -------------------------------------------------------------------------------

    def own_command(self, name: str, rest: str) -> None:
        if name == "/show":
            self.show()
        elif name in ("/clear", "/reset"):
            self.gen.reset()
            self.total = 0
            self.hint("the running text is empty now", style="green")
        elif name == "/load":
            self.load(rest)
        elif name == "/mode":
            if rest not in MODES:
                raise Hint(
                    f"/mode is {self.mode}{did_you_mean(rest, MODES) if rest else ''}: use /mode fresh or /mode continue"
                )
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

    def about(self) -> str:
        return f"{self.ckpt.model_config.describe()}, {count_params(self.ckpt.model):,} parameters"

    def show(self) -> None:
        rows = [
            ("model", self.about()),
            ("tokenizer", f"{self.ckpt.tokenizer.kind}, {self.ckpt.tokenizer.vocab_size} tokens"),
        ]
        rows += [(key, show_value(getattr(self.settings, key))) for key in SETTINGS]
        rows += [
            ("mode", self.mode),
            ("cache", "on" if self.gen.use_cache else "off (--no-cache)"),
            ("running text", self.running_text()),
        ]
        print_rows(self.console, rows, title=self.ckpt.name)

    def running_text(self) -> str:
        if self.gen.sliding and self.total > self.gen.context:
            return f"{self.total:,} tokens (the model sees the last {self.gen.context})"
        return f"{self.total:,} tokens"

    def viewer(self, name: str, args: list[str]) -> None:
        """/attn or /gates with the words after it, on the running text."""
        want = "attention" if name == "attn" else "gates"
        if want not in self.ckpt.model.capabilities:
            other = "gates" if name == "attn" else "attn"
            raise Hint(
                f"this {self.ckpt.model_config.kind} has no {want}; /{other} shows its {'attention' if other == 'attn' else 'gates'}"
            )
        if args and args[0].lower() in ("help", "?"):
            print_rows(self.console, words_help(VIEWERS[name], name))
            return
        try:
            opts = parse_words(VIEWERS[name], args, name)  # a mistyped word first: it needs fixing anyway
            if not self.gen.ids:
                raise Hint(f"there is no text yet: type a prompt, then /{name}")
            screen = Screen.of(self.console, opts.ascii)
            ids = list(self.gen.ids)
            if name == "attn":
                att = look.attention(self.ckpt.model, self.ckpt.tokenizer, ids, opts)
                draw_attention(self.console, self.ckpt.tokenizer, att, opts, screen)
            else:
                cfg = self.ckpt.model_config
                layer = cfg.n_layers - 1 if opts.layer is None else opts.layer
                fits = lambda t: units_that_fit(self.ckpt.tokenizer, ids, cfg.kind, layer, t, opts, screen)  # noqa: E731
                draw_gates(
                    self.console, self.ckpt.tokenizer, look.gates(self.ckpt.model, ids, opts, fits), opts, screen
                )
        except ConfigError as e:
            raise Hint(str(e)) from None

    def load(self, path: str) -> None:
        if not path:
            raise Hint("usage: /load CKPT (a checkpoint file or a run directory)")
        device = next(self.ckpt.model.parameters()).device
        try:
            ckpt = checkpoint.load(model_path(str(Path(path).expanduser())), device=str(device))
        except CheckpointError as e:
            raise Hint(f"{e}; still talking to {self.ckpt.name}") from None
        self.talk_to(ckpt, self.gen.use_cache)
        self.hint(
            f"loaded {ckpt.name} ({self.about()}, {ckpt.tokenizer.kind} tokens); the running text is empty",
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
        n = len(self.transcript)
        self.hint(f"saved {n} turn{'s' if n != 1 else ''} to {target}", style="green")

    def banner(self) -> None:
        print_banner(
            self.console,
            self.ckpt.name,
            self.about(),
            f"type a prompt; /help for commands; Ctrl-C stops a generation; {LEAVE_HINT}",
        )


def chat(
    ckpt: str,
    settings: SampleConfig,
    opts: ChatOptions | None = None,
    *,
    console: Console | None = None,
    interactive: bool | None = None,
) -> None:
    """`charlm chat CKPT`: the REPL on a checkpoint (a file or a run directory), until /bye or Ctrl-D."""
    open_chat(ckpt, settings, opts, console=console, interactive=interactive).run()


def open_chat(
    ckpt: str,
    settings: SampleConfig,
    opts: ChatOptions | None = None,
    *,
    console: Console | None = None,
    interactive: bool | None = None,
) -> Chat:
    """The chat on a checkpoint, loaded and ready: .run() is the REPL (.start() its banner, .loop() the rest)."""
    settings.validate()
    opts = (opts or ChatOptions()).validate()
    ck = checkpoint.load(ckpt, device=pick_device(opts.device))
    return Chat(ck, settings, console, mode=opts.mode, use_cache=not opts.no_cache, interactive=interactive)


# ---- the words of /attn and /gates, from the config fields ------------------------------------------


def parse_words(cls, words: list[str], command: str):
    """The words after /attn or /gates as a config: a field's name turns a switch on (overview) or takes the
    next word as its value (tokens 40); a choice is its value alone (abs); bare numbers fill the
    positional fields in order (/attn 1 2: layer 1, head 2); an optional text may go without a value
    (focus: the last token)."""
    fields = {f.name: f for f in flag_fields(cls)}
    positional = [f for f in fields.values() if f.metadata["positional"]]
    values, numbers, i = {}, [], 0
    while i < len(words):
        word, key = words[i], words[i].lower().replace("-", "_")
        f = fields.get(key)
        choice = next((c for c in fields.values() if key in (c.metadata["choices"] or ())), None)
        if f is not None and f.type == "bool":
            values[key] = True
        elif f is not None:
            takes_text = f.type == "str | None" and not f.metadata["choices"]
            if i + 1 < len(words) and not (takes_text and words[i + 1].lower() in fields):
                values[key] = from_text(f, words[i + 1])
                i += 1
            elif takes_text:
                values[key] = ""
            else:
                raise ConfigError(f"'{word}' needs a value after it: try /{command} help")
        elif choice is not None:
            values[choice.name] = key
        elif re.fullmatch(r"-?\d+", word):
            numbers.append(int(word))
        else:
            words_known = [*fields, *(c for f in fields.values() for c in f.metadata["choices"] or ())]
            raise ConfigError(
                f"unknown /{command} argument '{word}'{did_you_mean(key, words_known)}: try /{command} help"
            )
        i += 1
    if len(numbers) > len(positional):
        names = " and ".join(f"a {f.name}" for f in positional)
        raise ConfigError(f"/{command} takes at most {names}, got {len(numbers)} numbers: try /{command} help")
    values.update({f.name: n for f, n in zip(positional, numbers)})
    return cls(**values).validate()


def words_help(cls, command: str) -> list[tuple[str, str]]:
    """/attn help, /gates help: every word with its field's help."""
    fields = flag_fields(cls)
    positional = [f.name.upper() for f in fields if f.metadata["positional"]]
    rows = [
        (
            f"/{command} " + " ".join(f"[{p}" for p in positional) + "]" * len(positional),
            "the view of the running text; words may follow:",
        )
    ]
    for f in fields:
        if f.metadata["positional"]:
            continue
        if f.type == "bool":
            word = f.name
        elif f.metadata["choices"]:
            word = "|".join(f.metadata["choices"])
        else:
            word = f"{f.name} {'[TEXT]' if f.type == 'str | None' else 'N'}"
        rows.append((f"  {word}", f.metadata["help"].replace("--", "")))
    rows += [
        (f"  {p}", f.metadata["help"]) for p, f in zip(positional, [f for f in fields if f.metadata["positional"]])
    ]
    return rows


def did_you_mean(word: str, options) -> str:
    """' (did you mean X?)' for a mistyped word, when one of options is close to it; else ''."""
    import difflib

    close = difflib.get_close_matches(word.lower(), list(options), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def unquote(value: str) -> str:
    """A value typed in quotes, as a shell would read it: "\\n" -> \\n (its escapes are the setting's to read)."""
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def show_value(value) -> str:
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
