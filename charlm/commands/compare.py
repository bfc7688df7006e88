"""`charlm compare` as functions: several checkpoints loaded for the same prompt (charlm.comparison runs
them round-robin), and compare -i, the chat input loop with every prompt going to all of them."""

from __future__ import annotations

from charlm import checkpoint
from charlm.commands.repl import Hint, Session
from charlm.comparison import Comparison
from charlm.config import ConfigError, SampleConfig
from charlm.runtime import pick_device
from charlm.views.repl import LEAVE_HINT


def compare(ckpts: list[str], settings: SampleConfig, *, device: str = "auto") -> Comparison:
    """The checkpoints (files or run directories), loaded side by side: Comparison.run(prompt) generates."""
    if len(ckpts) < 2:
        raise ConfigError("compare needs at least two checkpoints (files or run directories)")
    settings.validate()
    device = pick_device(device)
    return Comparison([checkpoint.load(c, device=device) for c in ckpts], settings)  # a bad one: CheckpointError


class CompareSession(Session):
    """`charlm compare -i`: chat's input loop and its shared commands (/set, /help, /bye); each prompt goes to
    every model, shown by show(prompt) (the view). On a terminal it prompts; otherwise each line of stdin is a
    prompt and hints go to stderr."""

    CHAT_ONLY = ("/show", "/clear", "/reset", "/load", "/mode", "/attn", "/gates", "/save")  # one model's running text

    def __init__(self, comparison: Comparison, show, console, interactive: bool | None = None):
        super().__init__(comparison.settings, console, interactive)
        self.comparison, self.show = comparison, show

    def banner(self) -> None:
        self.hint(
            f"type a prompt: every model continues it · /help for commands · Ctrl-C stops a generation · {LEAVE_HINT}",
            style="dim",
        )

    def own_command(self, name: str, rest: str) -> None:
        if name in self.CHAT_ONLY:
            raise Hint(
                f"{name} works on one model's running text: use it in 'charlm chat CKPT'; "
                "compare -i has /set, /help and /bye"
            )
        super().own_command(name, rest)

    def generate(self, prompt: str) -> None:
        self.comparison.settings = self.settings
        self.show(prompt)
