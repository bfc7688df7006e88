"""`charlm sample` as a function: a checkpoint's continuations of a prompt, streamed piece by piece."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

from charlm import checkpoint
from charlm.config import SampleConfig
from charlm.generate import Stats, Streamer
from charlm.runtime import pick_device


@dataclass
class Continuation:
    """One sample: the prompt as the model reads it (characters it never saw dropped or replaced, as
    settings.unknown says), then its continuation as it is generated. stats: complete once pieces is."""

    prompt: str
    prompt_tokens: int
    pieces: Iterator[str]
    streamer: Streamer

    @property
    def stats(self) -> Stats:
        return self.streamer.stats


def sample(
    ckpt: str,
    prompt: str,
    settings: SampleConfig,
    *,
    num_samples: int = 1,
    device: str = "auto",
    use_cache: bool = True,
) -> Iterator[Continuation]:
    """num_samples continuations of prompt by the checkpoint (a file or a run directory). With a seed,
    sample i uses seed + i: the same seed gives the same samples."""
    from charlm.config import ConfigError

    settings.validate()
    if num_samples < 1:
        raise ConfigError(f"--num-samples must be at least 1, got {num_samples}")
    ck = checkpoint.load(ckpt, device=pick_device(device))
    ids = ck.tokenizer.encode(prompt, unknown=settings.unknown)
    shown = ck.tokenizer.decode(ids)
    streamer = Streamer(ck.model, ck.tokenizer, use_cache=use_cache)
    for i in range(num_samples):
        run = replace(settings, seed=None if settings.seed is None else settings.seed + i)
        streamer.reset()
        yield Continuation(shown, len(ids), streamer.stream(ids, run), streamer)
