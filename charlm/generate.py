"""Generation: a pure sampling step, and a streaming generator that carries the model's cache.

sample_next_token(logits, settings, generator) -> token id is a function of its inputs alone: the same
logits, settings and generator state always give the same token.

Generator keeps the running text (token ids) and the model's cache (the Transformer's KV cache, the
LSTM's state) so each new token costs one position, not a recompute of the whole text.
"""

from __future__ import annotations

import codecs
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Iterator

import torch

from charlm.config import ConfigError


@dataclass
class SampleConfig:
    temperature: float = 0.8  # 0: greedy (always the most likely token)
    top_k: int = 0  # keep only the k most likely tokens (0: all)
    top_p: float = 1.0  # keep the smallest set of tokens whose probability reaches p (1: all)
    repetition_penalty: float = 1.0  # >1 makes tokens already in the text less likely
    max_tokens: int = 500
    stop: list[str] = field(default_factory=list)  # stop (and cut) when the text produces one of these
    seed: int | None = None

    def validate(self) -> "SampleConfig":
        def check(ok, msg):
            if not ok:
                raise ConfigError(msg)

        check(0 <= self.temperature <= 100, f"temperature must be between 0 and 100, got {self.temperature}")
        check(self.top_k >= 0, f"top_k must be 0 (off) or more, got {self.top_k}")
        check(0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}")
        check(0 < self.repetition_penalty <= 10, f"repetition_penalty must be in (0, 10], got {self.repetition_penalty}")
        check(self.max_tokens >= 0, f"max_tokens must be 0 or more, got {self.max_tokens}")
        check(all(isinstance(s, str) and s for s in self.stop), "stop strings must not be empty")
        return self

    def to_dict(self) -> dict:
        return asdict(self)


def sample_next_token(
    logits: torch.Tensor, s: SampleConfig, generator: torch.Generator | None = None, history: torch.Tensor | None = None
) -> int:
    """logits (vocab,) -> the next token id. Order: repetition penalty, temperature, top-k, top-p."""
    logits = logits.float()
    if s.repetition_penalty != 1.0 and history is not None and history.numel():
        seen = logits[history]
        # CTRL's penalty: shrink positive logits, push negative ones further down
        logits = logits.clone()
        logits[history] = torch.where(seen > 0, seen / s.repetition_penalty, seen * s.repetition_penalty)
    if s.temperature == 0:
        return int(logits.argmax())
    logits = logits / s.temperature
    if 0 < s.top_k < logits.numel():
        kth = torch.topk(logits, s.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if s.top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        # drop a token when the tokens ranked above it already reach top_p (the first is always kept)
        drop = (sorted_probs.cumsum(-1) - sorted_probs) >= s.top_p
        sorted_probs[drop] = 0.0
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    return int(torch.multinomial(probs, 1, generator=generator))


class Utf8Stream:
    """Turns token bytes into text as they come, holding back an incomplete UTF-8 character so a
    BPE token that splits one never prints '�'."""

    def __init__(self):
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, data: bytes) -> str:
        return self._decoder.decode(data)

    def flush(self) -> str:
        return self._decoder.decode(b"", final=True)


@dataclass
class Stats:
    tokens: int = 0
    seconds: float = 0.0
    ttft_ms: float = 0.0  # time to first token: prefill of the prompt + one sampling step

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict:
        return {"tokens": self.tokens, "seconds": round(self.seconds, 4), "tokens_per_s": round(self.tokens_per_s, 1),
                "ttft_ms": round(self.ttft_ms, 2)}


class Generator:
    """Streams text from a model, keeping the running text and the model's cache between calls.

    use_cache=False recomputes the whole window for every token (to show what the cache saves).
    """

    def __init__(self, model, tokenizer, use_cache: bool = True):
        self.model, self.tokenizer, self.use_cache = model, tokenizer, use_cache
        self.context = model.cfg.context
        self.sliding = model.has_attention  # an RNN's state has no length limit
        self.device = next(model.parameters()).device
        self.ids: list[int] = []  # the running text
        self.cache = None
        self.cached = 0  # how many of self.ids the cache holds
        self.stats = Stats()

    def reset(self) -> None:
        self.ids, self.cache, self.cached = [], None, 0

    @property
    def text(self) -> str:
        return self.tokenizer.decode(self.ids)

    def _window(self) -> None:
        """Keep the running text inside the Transformer's context: when it is full, keep the last half
        and start a fresh cache (the kept half is prefilled again on the next step)."""
        if self.sliding and len(self.ids) >= self.context:
            self.ids = self.ids[-(self.context // 2):]
            self.cache, self.cached = None, 0

    @torch.inference_mode()
    def _next_logits(self) -> torch.Tensor:
        """Logits for the token after self.ids, feeding the model only what it has not seen."""
        if not self.use_cache:
            window = self.ids[-self.context:] if self.sliding else self.ids
            idx = torch.tensor([window], dtype=torch.long, device=self.device)
            logits, _ = self.model(idx)
            return logits[0, -1]
        if self.cache is None:
            self.cache, self.cached = self.model.new_cache(1), 0
        idx = torch.tensor([self.ids[self.cached:]], dtype=torch.long, device=self.device)
        logits, _ = self.model(idx, cache=self.cache)
        self.cached = len(self.ids)
        return logits[0, -1]

    def stream(self, prompt_ids: list[int], settings: SampleConfig, generator: torch.Generator | None = None) -> Iterator[str]:
        """Append prompt_ids to the running text, then yield the continuation as text pieces.

        Stops after settings.max_tokens tokens or at a stop string (which is cut off). self.stats
        holds the numbers of the last call.
        """
        if generator is None:
            generator = torch.Generator()
            generator.manual_seed(settings.seed if settings.seed is not None else int.from_bytes(os.urandom(8), "little") >> 1)
        self.ids.extend(prompt_ids)
        if not self.ids:  # nothing to condition on: start from token 0, as a model needs one input
            self.ids.append(0)
        self.stats = Stats()
        utf8 = Utf8Stream()
        hold = max((len(s) for s in settings.stop), default=1) - 1  # chars that may begin a stop string
        pending = ""  # decoded text not yet yielded (held back while it could start a stop string)
        start = time.perf_counter()
        for n in range(settings.max_tokens):
            self._window()
            logits = self._next_logits()
            history = None
            if settings.repetition_penalty != 1.0:
                history = torch.tensor(self.ids[-self.context:], dtype=torch.long, device=logits.device).unique()
            token = sample_next_token(logits, settings, generator, history)
            self.ids.append(token)
            if n == 0:
                self.stats.ttft_ms = (time.perf_counter() - start) * 1000
            self.stats.tokens = n + 1
            pending += utf8.push(self.tokenizer.token_bytes(token))
            cut = _find_stop(pending, settings.stop)
            if cut is not None:
                yield pending[:cut]
                pending = ""
                break
            if len(pending) > hold:
                yield pending[: len(pending) - hold]
                pending = pending[len(pending) - hold:]
        else:
            pending += utf8.flush()
        self.stats.seconds = time.perf_counter() - start
        if pending:
            yield pending

    def complete(self, prompt_ids: list[int], settings: SampleConfig, generator: torch.Generator | None = None) -> str:
        return "".join(self.stream(prompt_ids, settings, generator))


def _find_stop(text: str, stops: list[str]) -> int | None:
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(hits) if hits else None
