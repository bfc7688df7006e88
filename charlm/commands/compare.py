"""`charlm compare` as functions: compare() loads several checkpoints for the same prompt, scores them on a
file if asked, and runs them (charlm.comparison, round-robin); CompareSession is compare -i, the shared REPL
(commands.repl) with every prompt going to all of them."""

from __future__ import annotations

from contextlib import nullcontext

from charlm.commands.repl import Hint, Session
from charlm.comparison import Comparison
from charlm.config import SampleConfig
from charlm.errors import ConfigError
from charlm.options import CompareOptions
from charlm.runtime import pick_device
from charlm.storage import checkpoint
from charlm.views.repl import LEAVE_HINT


def compare(ckpts: list[str], settings: SampleConfig, opts: CompareOptions | None = None, watch=None) -> Comparison:
    """The checkpoints (files or run directories) loaded side by side, each scored on opts.eval_file when it is
    given, then (unless opts.interactive) each continuing opts.prompt: the Comparison holds what each did
    (its summary() is `compare --json`). watch (views.compare.CompareView) is shown the work as it happens:
    evaluating(label), evaluated(comparison), generating(comparison)."""
    opts = opts or CompareOptions()
    if len(ckpts) < 2:
        raise ConfigError("compare needs at least two checkpoints (files or run directories)")
    device = pick_device(opts.device)
    comparison = Comparison([checkpoint.load(c, device=device) for c in ckpts], settings)  # a bad one: CheckpointError
    if opts.eval_file:
        comparison.evaluate(opts.eval_file, watch.evaluating if watch else None)
        if watch:
            watch.evaluated(comparison)
    if not opts.interactive:
        with watch.generating(comparison) if watch else nullcontext() as on_tick:
            comparison.run(opts.prompt, on_tick)
    return comparison


class CompareSession(Session):
    """`charlm compare -i`: chat's input loop and its shared commands (/set, /help, /bye); each prompt goes to
    every model, shown by `view` (views.compare.CompareView). On a terminal it prompts; otherwise each line of
    stdin is a prompt and hints go to stderr."""

    CHAT_ONLY = ("/show", "/clear", "/reset", "/load", "/mode", "/attn", "/gates", "/save")  # one model's running text

    def __init__(self, comparison: Comparison, view, interactive: bool | None = None):
        super().__init__(comparison.settings, view.console, interactive)
        self.comparison, self.compare_view = comparison, view

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
        with self.compare_view.generating(self.comparison) as on_tick:
            self.comparison.run(prompt, on_tick)
        self.compare_view.show(self.comparison)
