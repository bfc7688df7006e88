"""`charlm chat`: one model continues each prompt, token by token, over its running text; /attn and /gates
show how it reads that text. Chat is the controller: it generates and keeps the running text, and hands
everything it shows to views.chat.ChatView. The loop, /help, /set and /bye are the shared REPL's
(commands.repl.Session); the words of /attn and /gates are commands.words'.

Chat's own commands follow `ollama run` where it has one (/clear, /load, /show): /mode fresh|continue, /save
FILE, /attn and /gates. chat() runs the REPL until /bye or Ctrl-D; open_chat() loads it, for a caller that
shows its banner before the loop (cli.py, while keys typed during the load wait).
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from charlm import files
from charlm.commands import look
from charlm.commands.repl import SETTINGS, Hint, Session, did_you_mean, show_value
from charlm.commands.runs import model_path
from charlm.commands.words import CHAT_COMMANDS, CHAT_HELP_ROWS, parse_words, words_help
from charlm.config import SampleConfig
from charlm.errors import CheckpointError, ConfigError
from charlm.generate import Streamer
from charlm.models import count_params
from charlm.options import AttnConfig, ChatOptions, GatesConfig
from charlm.runtime import pick_device
from charlm.storage import checkpoint
from charlm.storage.checkpoint import Checkpoint
from charlm.tokenizer import UnknownCharactersError
from charlm.views.repl import LEAVE_HINT, PROMPT
from charlm.views.text import safe_text

MODES = ("fresh", "continue")
VIEWERS = {"attn": AttnConfig, "gates": GatesConfig}
SHOWS = {"attn": "attention", "gates": "gates"}  # the model capability each viewer needs


class Chat(Session):
    """`charlm chat`: one model, its running text, and the viewers on it."""

    COMMANDS = CHAT_COMMANDS
    OTHER_NAMES = ("/reset",)
    COMPLETIONS = {**Session.COMPLETIONS, "/mode": list(MODES)}
    HELP_ROWS = CHAT_HELP_ROWS

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
        # never the compiled step: once numba's code loads, a Ctrl-C at the prompt went unanswered 3-6 times in
        # 10 (readline's wait; 8 of 8 answered without numba); the numpy step serves a conversation
        self.gen = Streamer(ckpt.model, ckpt.tokenizer, use_cache=use_cache, compiled=False)
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
        printer = self.view.reply(prompt)
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
        window = self.gen.context if self.gen.sliding else None
        self.view.replied(text or prompt, self.gen.stats, window, self.total, stopped)

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

    def context_hint(self, key: str) -> str:
        n = self.gen.context
        if self.gen.sliding:  # a transformer: its positions end where its training windows did
            return f"{key}: this model sees the last {n} tokens, the context it was trained with: it cannot see more"
        return f"{key}: this model reads the whole running text through its state (it was trained on {n}-token windows)"

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
        self.view.rows(rows, title=self.ckpt.name)

    def running_text(self) -> str:
        if self.gen.sliding and self.total > self.gen.context:
            return f"{self.total:,} tokens (the model sees the last {self.gen.context})"
        return f"{self.total:,} tokens"

    def viewer(self, name: str, args: list[str]) -> None:
        """/attn or /gates with the words after it, on the running text."""
        has = self.ckpt.model.capabilities
        if SHOWS[name] not in has:  # the other viewer, where the model has what it shows
            other = "".join(f"; /{v} shows its {what}" for v, what in SHOWS.items() if v != name and what in has)
            raise Hint(f"this {self.ckpt.model_config.kind} has no {SHOWS[name]}{other}")
        if args and args[0].lower() in ("help", "?"):
            self.view.rows(words_help(VIEWERS[name], name))
            return
        try:
            opts = parse_words(VIEWERS[name], args, name)  # a mistyped word first: it needs fixing anyway
            if not self.gen.ids:
                raise Hint(f"there is no text yet: type a prompt, then /{name}")
            # the whole running text, numbered from its start: the view says which part the model sees
            ids, tok = list(self.gen.text), self.ckpt.tokenizer
            if name == "attn":
                self.view.attention(tok, look.attention(self.ckpt.model, tok, ids, opts), opts)
            else:
                cfg = self.ckpt.model_config
                layer = cfg.n_layers - 1 if opts.layer is None else opts.layer
                fits = self.view.units_that_fit(tok, ids, cfg.kind, layer, opts)
                self.view.gates(tok, look.gates(self.ckpt.model, ids, opts, fits), opts)
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
        self.view.banner(
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
    opts = opts or ChatOptions()  # (configs validate themselves when they are made)
    ck = checkpoint.load(ckpt, device=pick_device(opts.device))
    return Chat(ck, settings, console, mode=opts.mode, use_cache=not opts.no_cache, interactive=interactive)
