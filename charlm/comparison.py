"""Several checkpoints continue the same prompt with the same seed and settings, taking turns one
generation step each (round-robin), so they can be watched growing side by side. Nothing here draws:
views/compare.py lays out what a Comparison holds.

Timing is per model: a model's tokens/s counts only the time spent inside its own generation steps,
not the time the others (or the screen) took in between. The models still share the CPU's caches while
they take turns, so a model can measure slower here than alone (`charlm sample --stats`).
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field
from typing import Callable, ContextManager, Iterator

import torch

from charlm.checkpoint import Checkpoint
from charlm.evaluate import EvalResult, UnknownCharactersInFile, evaluate_file
from charlm.generate import Generator, SampleConfig
from charlm.tokenizer import UnknownCharactersError


@dataclass
class Contestant:
    """One model in the comparison, and what it did in the last run."""

    ckpt: Checkpoint
    gen: Generator
    prompt: str = ""
    output: str = ""
    note: str | None = None  # why this model produced nothing (e.g. a prompt it cannot encode)
    seconds: float = 0.0  # time spent in its own generation steps
    tokens: int = 0
    ttft_ms: float | None = None
    done: bool = False
    eval: EvalResult | None = None
    eval_note: str | None = None
    stream: Iterator[str] | None = field(default=None, repr=False)

    @property
    def tokens_per_s(self) -> float | None:
        return self.tokens / self.seconds if self.tokens and self.seconds > 0 else None


class Comparison:
    """Runs prompts through every model, round-robin one step per model, and keeps what each did."""

    def __init__(self, ckpts: list[Checkpoint], settings: SampleConfig, unknown: str = "error"):
        self.players = [Contestant(c, Generator(c.model, c.tokenizer)) for c in ckpts]
        self.settings, self.unknown = settings, unknown
        self.last_seed = settings.seed
        self.eval_path = None
        self.warm = False

    def evaluate(self, path, progress: Callable[[str], ContextManager] | None = None) -> None:
        """Each model's bits/char on the file at `path`, once. progress(name), if given, is a context
        manager yielding evaluate_file's progress callback for that model."""
        self.eval_path = path
        for p in self.players:
            try:
                with progress(p.ckpt.name) if progress else contextlib.nullcontext() as callback:
                    p.eval = evaluate_file(p.ckpt.model, p.ckpt.tokenizer, path, progress=callback)
            except UnknownCharactersInFile as e:  # this model's problem; a bad file stops everything
                p.eval_note = str(e)

    def _start(self, prompt: str) -> None:
        seed = self.settings.seed if self.settings.seed is not None else int.from_bytes(os.urandom(4), "little")
        self.last_seed = seed
        for p in self.players:
            p.gen.reset()
            p.prompt, p.output, p.note, p.seconds, p.tokens, p.ttft_ms, p.done = prompt, "", None, 0.0, 0, None, False
            try:
                ids = p.ckpt.tokenizer.encode(prompt, unknown=self.unknown)
            except UnknownCharactersError as e:
                p.note, p.done = str(e), True
                continue
            # every model gets its own generator with the same seed: same settings, same luck
            p.stream = p.gen.stream(ids, self.settings, torch.Generator().manual_seed(seed))

    def _step(self, p: Contestant) -> None:
        t0 = time.perf_counter()
        try:
            piece = next(p.stream)
        except StopIteration:
            piece, p.done = "", True
        p.seconds += time.perf_counter() - t0
        p.output += piece
        p.tokens = p.gen.stats.tokens
        if p.tokens and p.ttft_ms is None:
            p.ttft_ms = p.gen.stats.ttft_ms

    def warm_up(self) -> None:
        """A short untimed generation per model, so one-time setup costs (PyTorch allocates and picks
        kernels on a model's first calls) do not land on whichever model happens to go first."""
        for p in self.players:
            Generator(p.ckpt.model, p.ckpt.tokenizer).complete([0], SampleConfig(max_tokens=2, seed=0))
        self.warm = True

    def run(self, prompt: str, on_tick: Callable[[], None] | None = None) -> None:
        """Generate from every model; on_tick() after each round (one step of each model)."""
        if not self.warm:
            self.warm_up()
        self._start(prompt)
        while not all(p.done for p in self.players):
            for p in self.players:
                if not p.done:
                    self._step(p)
            if on_tick:
                on_tick()
