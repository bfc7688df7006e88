"""Several checkpoints continue the same prompt with the same seed and settings, taking turns one
generation step each (round-robin), so they can be watched growing side by side. Nothing here draws:
views/compare.py lays out what a Comparison holds.

Timing is per model: a model's tokens/s counts only the time spent inside its own generation steps,
not the time the others (or the screen) took in between. The models still share the CPU's caches while
they take turns, so a model can measure slower here than alone (`charlm sample --stats`). To keep the
order from favouring anyone, every model is warmed up before the first timed run, and the turn order
flips every round. Characters per second are reported beside tokens per second: a BPE token holds
several characters, so tokens/s alone compares unlike units. How much a rate wobbles within the run (its
range over the run's quarters, `rate_range`) tells a real difference from noise.

settings.max_tokens counts tokens, as everywhere, while the models' tokens are alike (all char models, or
one BPE vocabulary); when they differ (a char and a BPE model), it counts characters, so every model writes
a text as long and the panels are comparable (`counts_chars`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from charlm.evaluate import EvalResult, UnknownCharactersInFile, evaluate_file
from charlm.generate import SampleConfig, Streamer
from charlm.models import count_params
from charlm.storage.checkpoint import Checkpoint
from charlm.tokenizer import UnknownCharactersError


@dataclass
class Contestant:
    """One model in the comparison, and what it did in the last run."""

    ckpt: Checkpoint
    gen: Streamer
    prompt: str = ""
    output: str = ""
    note: str | None = None  # why this model produced nothing (e.g. a prompt it cannot encode)
    seconds: float = 0.0  # time spent in its own generation steps
    tokens: int = 0
    ttft_ms: float | None = None
    done: bool = False
    eval: EvalResult | None = None
    eval_note: str | None = None
    steps: list[tuple[float, int]] = field(
        default_factory=list, repr=False
    )  # (seconds, chars) per token after the first
    stream: Iterator[str] | None = field(default=None, repr=False)
    label: str = ""  # its name in tables and titles: the run's, with the file where two share a run
    params: int = 0  # its parameters, as the checkpoint says (or counted)

    @property
    def tokens_per_s(self) -> float | None:
        return self.tokens / self.seconds if self.tokens and self.seconds > 0 else None

    @property
    def chars_per_s(self) -> float | None:
        return len(self.output) / self.seconds if self.tokens and self.seconds > 0 else None

    def rate_range(self, chars: bool = False, parts: int = 4) -> tuple[float, float] | None:
        """(lowest, highest) tokens/s (or chars/s) over the `parts` quarters of the run after its first
        token (which also holds the prompt's prefill): how much the rate wobbles. None: too few tokens."""
        if len(self.steps) < 2 * parts:
            return None
        rates = []
        for k in range(parts):
            block = self.steps[k * len(self.steps) // parts : (k + 1) * len(self.steps) // parts]
            seconds = sum(dt for dt, _ in block)
            rates.append((sum(n for _, n in block) if chars else len(block)) / seconds if seconds > 0 else float("inf"))
        return min(rates), max(rates)


class Comparison:
    """Runs prompts through every model, round-robin one step per model, and keeps what each did."""

    def __init__(self, ckpts: list[Checkpoint], settings: SampleConfig):
        self.players = [
            # the numpy step, never the compiled one: compare may read prompts at a readline prompt (see chat.py)
            Contestant(
                c, Streamer(c.model, c.tokenizer, compiled=False), params=c.saved.params or count_params(c.model)
            )
            for c in ckpts
        ]
        names = [p.ckpt.name for p in self.players]
        for p in (
            self.players
        ):  # best.safetensors and last.safetensors of one run: "run (best.safetensors)", "run (last.safetensors)"
            p.label = p.ckpt.name if names.count(p.ckpt.name) == 1 else f"{p.ckpt.name} ({p.ckpt.path.name})"
        labels = [p.label for p in self.players]
        for p in self.players:  # the same file twice, or two best.safetensors of runs of one name: the paths
            if labels.count(p.label) > 1:
                p.label = str(p.ckpt.path)
        self.settings = settings
        self.counts_chars = counts_chars(ckpts)
        self.last_seed = settings.seed
        self.eval_path = None
        self.warm = False

    def evaluate(self, path, progress: Callable[[str], contextlib.AbstractContextManager] | None = None) -> None:
        """Each model's bits/char on the file at `path`, once. progress(name), if given, is a context
        manager yielding evaluate_file's progress callback for that model."""
        self.eval_path = path
        for p in self.players:
            try:
                with progress(p.label) if progress else contextlib.nullcontext() as callback:
                    p.eval = evaluate_file(p.ckpt.model, p.ckpt.tokenizer, path, progress=callback)
            except UnknownCharactersInFile as e:  # this model's problem; a bad file stops everything
                p.eval_note = str(e)

    def _start(self, prompt: str) -> None:
        seed = self.settings.seed if self.settings.seed is not None else int.from_bytes(os.urandom(4), "little")
        self.last_seed = seed
        settings = self.settings
        if self.counts_chars:  # a token holds at least a byte, a character at most 4: _step stops each in time
            settings = dataclasses.replace(settings, max_tokens=4 * settings.max_tokens)
        for p in self.players:
            p.gen.reset()
            p.prompt, p.output, p.note, p.seconds, p.tokens, p.ttft_ms, p.done = prompt, "", None, 0.0, 0, None, False
            p.steps = []
            try:
                ids = p.ckpt.tokenizer.encode(prompt, unknown=self.settings.unknown)
            except UnknownCharactersError as e:
                p.note, p.done = str(e), True
                continue
            # every model gets its own generator with the same seed: same settings, same luck
            p.stream = p.gen.stream(ids, settings, torch.Generator().manual_seed(seed))

    def _step(self, p: Contestant) -> None:
        t0 = time.perf_counter()
        try:
            piece = next(p.stream)
        except StopIteration:
            piece, p.done = "", True
        dt = time.perf_counter() - t0
        if self.counts_chars and len(p.output) + len(piece) >= self.settings.max_tokens:  # max_tokens characters
            piece, p.done = piece[: self.settings.max_tokens - len(p.output)], True
            p.stream.close()
        p.seconds += dt
        p.output += piece
        if p.gen.stats.tokens > p.tokens and p.ttft_ms is not None:
            p.steps.append((dt, len(piece)))
        p.tokens = p.gen.stats.tokens
        if p.tokens and p.ttft_ms is None:
            p.ttft_ms = p.gen.stats.ttft_ms

    def warm_up(self) -> None:
        """A short untimed generation by each model's own generator, so one-time setup costs (PyTorch
        allocates, picks kernels and builds the cache on a model's first calls) land on no one's timing."""
        for p in self.players:
            p.gen.complete([0], SampleConfig(max_tokens=4, seed=0))
            p.gen.reset()
        self.warm = True

    def run(self, prompt: str, on_tick: Callable[[], None] | None = None) -> None:
        """Generate from every model; on_tick() after each round (one step of each model). The order flips
        every round: going second (after the other model warmed the CPU's caches) is no one's privilege."""
        if not self.warm:
            self.warm_up()
        self._start(prompt)
        rounds = 0
        while not all(p.done for p in self.players):
            for p in self.players if rounds % 2 == 0 else reversed(self.players):
                if not p.done:
                    self._step(p)
            rounds += 1
            if on_tick:
                on_tick()

    def summary(self) -> dict:
        """What the last run did, as plain data (`compare --json`)."""
        models = [
            {
                **p.ckpt.summary(),
                "eval_bpc": p.eval.bits_per_char if p.eval else None,
                "eval_note": p.eval_note,
                "text": p.output,
                "note": p.note,
                "tokens": p.tokens,
                "chars": len(p.output),
                "seconds": round(p.seconds, 6),  # a fast model writes 30 tokens in ~2 ms: 4 places were 2% off
                "tokens_per_s": _round(p.tokens_per_s),
                "chars_per_s": _round(p.chars_per_s),
                "ttft_ms": _round(p.ttft_ms, 2),
            }
            for p in self.players
        ]
        return {
            "prompt": self.players[0].prompt if self.players else "",
            "seed": self.last_seed,
            "settings": {k: v for k, v in self.settings.to_dict().items() if k != "seed"},
            "max_tokens_counts": "characters" if self.counts_chars else "tokens",
            "eval_file": str(self.eval_path) if self.eval_path is not None else None,
            "models": models,
        }


def counts_chars(ckpts: list[Checkpoint]) -> bool:
    """Whether max_tokens counts characters: when the models' tokens are not alike (not all char tokens, and
    not one vocabulary), a count of tokens would give texts of very different lengths."""
    tokenizers = [c.tokenizer for c in ckpts]
    return any(t.kind != "char" for t in tokenizers) and len({t.to_json() for t in tokenizers}) > 1


def _round(x: float | None, digits: int = 1) -> float | None:
    return None if x is None else round(x, digits)
