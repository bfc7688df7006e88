"""Generation: a pure sampling step, and a streaming generator that carries the model's cache.

sample_next_token(logits, settings, generator) -> token id is a function of its inputs alone: the same
logits, settings and generator state always give the same token.

Streamer keeps the running text (token ids) and the model's cache (the Transformer's KV cache, the
LSTM's state) so each new token costs one position, not a recompute of the whole text.
"""

from __future__ import annotations

import codecs
import math
import os
import time
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass

import numpy as np
import torch

from charlm.config import SampleConfig
from charlm.models import compiled_decode
from charlm.models.compiled_decode import CompiledDecoder
from charlm.models.fast_decode import FastDecoder
from charlm.models.fast_rnn import FastRNN

# Temperatures below this are greedy: dividing logits by a tiny (or subnormal) number overflows to inf and
# turns the distribution into NaNs, and long before that it is one-hot anyway (a logit gap of 0.01 becomes e^100).
GREEDY_BELOW = 1e-4


def _sane(logits: torch.Tensor) -> torch.Tensor:
    """Logits that are not all numbers (a model with huge weights overflows): NaN has no mass, and the +inf
    ones, if any, share all of it."""
    logits = logits.nan_to_num(nan=-math.inf, posinf=math.inf, neginf=-math.inf)
    if bool(torch.isposinf(logits).any()):
        logits = torch.where(torch.isposinf(logits), 0.0, -math.inf)
    return logits


def sampling_probs(logits: torch.Tensor, s: SampleConfig, history: torch.Tensor | None = None) -> torch.Tensor:
    """logits (vocab,) -> the probabilities sample_next_token draws from (float32, summing to 1).

    Order: repetition penalty, temperature, top-k, top-p. Temperature 0 (or below GREEDY_BELOW) puts all
    mass on the argmax (torch's: NaN counts as the largest). Else NaN logits have no mass and +inf ones all
    of it (_sane); all -inf: every token alike.
    """
    logits = logits.float()
    if s.repetition_penalty != 1.0 and history is not None and history.numel():
        seen = logits[history]
        # CTRL's penalty: shrink positive logits, push negative ones further down
        logits = logits.clone()
        logits[history] = torch.where(seen > 0, seen / s.repetition_penalty, seen * s.repetition_penalty)
    if s.temperature < GREEDY_BELOW:
        return torch.zeros_like(logits).index_fill_(0, logits.argmax().view(1), 1.0)
    top = logits.max()  # NaN if any logit is
    if not math.isfinite(top):
        logits = _sane(logits)
        top = logits.max()
    # the largest 0 before dividing (a logit of 1e38 / 0.5 would overflow to inf); all -inf: every token alike
    logits = (logits - top if math.isfinite(top) else torch.zeros_like(logits)) / s.temperature
    if 0 < s.top_k < logits.numel():
        # scatter the k best back, rather than mask below the k-th value: ties there would keep more than k
        values, order = torch.topk(logits, s.top_k)
        logits = torch.full_like(logits, float("-inf")).scatter_(0, order, values)
    probs = torch.softmax(logits, dim=-1)
    if s.top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        # keep a token while the tokens ranked above it have not reached top_p (so the first is always kept)
        # (a top_p below float32's smallest, 1e-50, is 0 there: still the first)
        n_keep = max(int(((sorted_probs.cumsum(-1) - sorted_probs) < s.top_p).sum()), 1)
        kept = sorted_probs[:n_keep]
        probs = torch.zeros_like(probs).scatter_(0, order[:n_keep], kept / kept.sum())
    return probs


def sample_next_token(
    logits: torch.Tensor | np.ndarray,
    s: SampleConfig,
    generator: torch.Generator | None = None,
    history: torch.Tensor | None = None,
    uniform: Callable[[], float] | None = None,
) -> int:
    """logits (vocab,) -> the next token id, drawn from sampling_probs with one uniform number from
    `generator` (inverse CDF: one cheap draw, where torch.multinomial costs ~30 µs a call), or from
    `uniform()` when given (Uniforms: the same numbers, drawn ahead). The logits may be a numpy array
    (the numpy decode step's): the common case then never touches torch."""
    if s.temperature < GREEDY_BELOW and (s.repetition_penalty == 1.0 or history is None):
        return int(logits.argmax())
    on_cpu = isinstance(logits, np.ndarray) or logits.device.type == "cpu"
    if on_cpu and s.plain(len(logits)):
        # the common case, softmax(logits / temperature), in numpy: half the time of the torch ops
        z = logits if isinstance(logits, np.ndarray) else logits.float().numpy()
        top = z.max()  # NaN or inf: logits that are not all numbers, which sampling_probs sorts out
        if math.isfinite(top):
            probs = np.subtract(z, top, dtype=np.float64)
            probs *= 1.0 / s.temperature
            np.exp(probs, out=probs)
        else:
            probs = sampling_probs(torch.as_tensor(logits), s, history).cpu().numpy()
    else:
        probs = sampling_probs(torch.as_tensor(logits), s, history).cpu().numpy()
    cdf = probs.cumsum(dtype=np.float64)
    u = uniform() if uniform is not None else torch.rand((), generator=generator, dtype=torch.float64).item()
    i = int(cdf.searchsorted(u * cdf[-1], "right"))  # a zero-probability token is never chosen
    if i >= len(cdf):  # u * total rounded up to the total: take the last token that has any mass
        i = int(np.flatnonzero(probs)[-1])
    return i


class Uniforms:
    """generator's uniform numbers (float64, as torch.rand draws them one at a time), drawn `block` at a
    time: mid-stream, with the caches cold from the model's weights, one torch.rand per token costs
    ~25 µs, a tenth of a token at nanoGPT size. Torch draws a block in the order single draws come;
    close() puts back the numbers not taken, so the generator ends where one draw per number taken
    leaves it (tests/test_generate.py checks both)."""

    def __init__(self, generator: torch.Generator, block: int = 256):
        self.generator, self.block, self.left = generator, block, []

    def __call__(self) -> float:
        if not self.left:
            self.state = self.generator.get_state()
            self.left = torch.rand(self.block, generator=self.generator, dtype=torch.float64).tolist()[::-1]
        return self.left.pop()

    def close(self) -> None:
        if self.left:
            self.generator.set_state(self.state)
            torch.rand(self.block - len(self.left), generator=self.generator, dtype=torch.float64)  # those taken
            self.left = []


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
    tokens: int = 0  # new tokens generated
    seconds: float = 0.0  # prefill and generation, all of it
    ttft_ms: float = 0.0  # time to first token: prefill of the prompt + one sampling step
    prompt_tokens: int = 0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @staticmethod
    def total(runs: list[Stats]) -> Stats:
        """Several runs as one: tokens and seconds added up, the mean time to first token."""
        ttft = sum(r.ttft_ms for r in runs) / len(runs) if runs else 0.0
        return Stats(
            sum(r.tokens for r in runs), sum(r.seconds for r in runs), ttft, runs[0].prompt_tokens if runs else 0
        )

    def to_dict(self) -> dict:
        return {
            "tokens": self.tokens,
            "seconds": round(self.seconds, 4),
            "tokens_per_s": round(self.tokens_per_s, 1),
            "ttft_ms": round(self.ttft_ms, 2),
            "prompt_tokens": self.prompt_tokens,
        }


class Streamer:
    """Streams text from a model, keeping the running text and the model's cache between calls.

    A Transformer sees at most its context, so the running text keeps the last `context` tokens. Once
    the text outgrows it, a RoPE model's cache rolls: a ring buffer keeps the last `context` tokens'
    keys and values, and each new token costs one step, for ever. A model with absolute positions
    (learned, sinusoidal) cannot shift its cached keys, so it prefills the last `context` tokens again
    for every new token, as recomputing the window does. An RNN's state has no length limit.

    A rolled cache is sliding-window attention: each position attends to the `context` positions up
    to it, whose keys were computed from windows of their own. With two layers or more, what a token
    sees therefore reaches further back than one window, and text past the context differs from what
    use_cache=False writes: that recomputes the window for every token (nanoGPT's generate), to show
    what the cache saves. fast_decode=False runs every one-token step in torch, never in numpy; compiled=False
    runs a Transformer's in numpy (models/fast_decode.py), never in the compiled step (models/compiled_decode.py),
    which otherwise takes over once loaded (it starts loading once a stream would bring this Streamer's tokens to
    LOAD_AFTER, or is loaded already).
    """

    def __init__(self, model, tokenizer, use_cache: bool = True, fast_decode: bool = True, compiled: bool = True):
        self.model, self.tokenizer, self.use_cache, self.fast_decode = model, tokenizer, use_cache, fast_decode
        self.compiled = compiled and fast_decode
        self._numpy_steps = 0  # one-token steps the numpy step took (the compiled one loads from LOAD_AFTER on)
        self.context = model.cfg.context  # an RNN is trained on windows of it too (its repetition penalty's reach)
        self.sliding = model.window is not None  # an RNN's state has no length limit
        self.rolling = model.rolling_cache
        self.device = next(model.parameters()).device
        self.ids: list[int] = []  # the running text (for a Transformer: the window it sees)
        self.text: list[int] = []  # the whole running text, of which a Transformer sees the last `context`
        self.cache = None
        self._fed = 0  # the cache holds self.ids[:self._fed] (a rolled one: its last context tokens)
        self._last = None  # the logits after them
        self.fast = (
            None  # the numpy one-token step over self.cache (FastDecoder, FastRNN), where one supports the model
        )
        self.stats = Stats()

    def reset(self) -> None:
        """Forget the running text (the cache object is kept and emptied, not reallocated)."""
        self.ids, self.text = [], []
        self._drop_cache()

    def _drop_cache(self) -> None:
        if self.cache is not None:
            self.cache.reset()
        self._fed = 0
        self._last = None

    def next_logits(self) -> torch.Tensor | np.ndarray:
        """Logits (vocab,) for the token after the running text, feeding the model only what it has not
        seen: a numpy array from the numpy step, which stream() samples from without a round trip through
        torch (torch's part runs in inference mode, numpy's needs none)."""
        if not self.use_cache:
            if self.sliding:
                self.ids = self.ids[-self.context :]
            with torch.inference_mode():
                return self.model(torch.tensor([self.ids], dtype=torch.long, device=self.device))[0][0, -1]
        if self.cache is None:
            with torch.inference_mode():
                self.cache = self.model.new_cache(1, rolling=True) if self.rolling else self.model.new_cache(1)
        new = self.ids[self._fed :]
        if not new and self._last is not None:  # asked twice: nothing new to feed
            return self._last
        if self.sliding and self.cache.pos + len(new) > self.context and not (self.rolling and len(new) < self.context):
            self._drop_cache()  # start again from the last context tokens (a long prompt, or absolute positions)
            new = self.ids[-self.context :]
        # a rolling cache takes what fits in its free slots at once, and the rest one token at a time
        first = min(len(new), max(self.context - self.cache.pos, 1)) if self.rolling else len(new)
        logits = self._feed(new[:first])
        for token in new[first:]:
            logits = self._feed([token])
        if self.sliding:
            self.ids = self.ids[-self.context :]
        self._fed, self._last = len(self.ids), logits
        return logits

    def _feed(self, tokens: list[int]) -> torch.Tensor | np.ndarray:
        if len(tokens) == 1 and self.fast_decode:
            if self.fast is None or not self.fast.current() or self._upgrade():
                kinds = (CompiledDecoder, FastDecoder, FastRNN) if self.compiled else (FastDecoder, FastRNN)
                step = next((kind for kind in kinds if kind.supports(self.model)), None)
                self.fast = step(self.model, self.cache) if step is not None else None
            if self.fast is not None:
                self._numpy_steps += type(self.fast) is FastDecoder
                return self.fast.step_np(tokens[0])
        with torch.inference_mode():
            return self.model.decode(tokens, self.cache)

    def _upgrade(self) -> bool:
        # the numpy step serves until the compiled one is ready (stream() starts loading it once this Streamer's
        # tokens reach LOAD_AFTER); both read the same weights, so the hand-over keeps a seed's text
        return self.compiled and type(self.fast) is FastDecoder and compiled_decode.ready()

    def stream(
        self, prompt_ids: list[int], settings: SampleConfig, generator: torch.Generator | None = None
    ) -> Iterator[str]:
        """Append prompt_ids to the running text, then yield the continuation as text pieces.

        Stops after settings.max_tokens tokens or at a stop string (cut off from the text yielded;
        the running text keeps the tokens that made it). self.stats holds the numbers of the last call.
        """
        if generator is None:
            generator = torch.Generator()
            generator.manual_seed(
                settings.seed if settings.seed is not None else int.from_bytes(os.urandom(8), "little") >> 1
            )
        self.stats = Stats(prompt_tokens=len(prompt_ids))
        long = self._numpy_steps + settings.max_tokens >= compiled_decode.LOAD_AFTER
        if long and self.compiled and FastDecoder.supports(self.model):
            compiled_decode.kernel()  # start loading the compiled step (a short sample never does)
        self.ids.extend(prompt_ids)
        self.text.extend(prompt_ids)
        if not self.ids:  # nothing to condition on: start as a new line would (or token 0)
            self.ids.extend(self.tokenizer.encode("\n", unknown="drop")[:1] or [0])
            self.text.extend(self.ids)
        utf8 = Utf8Stream()
        hold = max((len(s) for s in settings.stop), default=1) - 1  # chars that may begin a stop string
        pending = ""  # decoded text not yet yielded (held back while it could start a stop string)
        start = time.perf_counter()
        with one_thread(), closing(Uniforms(generator)) as uniform:
            for n in range(settings.max_tokens):
                try:
                    logits = self.next_logits()
                    history = None
                    if settings.repetition_penalty != 1.0:
                        history = torch.tensor(self.ids[-self.context :], device=self.device).unique()
                    token = sample_next_token(logits, settings, generator, history, uniform)
                except BaseException:  # e.g. Ctrl-C inside the model: the cache may be half-written
                    self._drop_cache()
                    raise
                self.ids.append(token)
                self.text.append(token)
                if n == 0:
                    self.stats.ttft_ms = (time.perf_counter() - start) * 1000
                self.stats.tokens = n + 1
                pending += utf8.push(self.tokenizer.token_bytes(token))
                cut = _find_stop(pending, settings.stop)
                if cut is not None:
                    pending = pending[:cut]
                    break
                if len(pending) > hold:
                    self.stats.seconds = time.perf_counter() - start
                    yield pending[: len(pending) - hold]
                    pending = pending[len(pending) - hold :]
            else:
                pending += utf8.flush()
            self.stats.seconds = time.perf_counter() - start
            if pending:
                yield pending

    def complete(self, prompt_ids: list[int], settings: SampleConfig, generator: torch.Generator | None = None) -> str:
        return "".join(self.stream(prompt_ids, settings, generator))


_one_thread_users = 0
_saved_threads = 1


@contextmanager
def one_thread():
    """Run torch on one thread inside the block. One token at a time is a chain of tiny ops: a second
    thread only adds synchronisation, and on a busy CPU waiting for it costs up to 30x. Streams may
    interleave (compare runs two side by side): the first in saves the thread count, the last out
    restores it. (Switching per token is no good: resizing the thread pool costs ~0.5 ms.)"""
    global _one_thread_users, _saved_threads
    if _one_thread_users == 0:
        _saved_threads = torch.get_num_threads()
        torch.set_num_threads(1)
    _one_thread_users += 1
    try:
        yield
    finally:
        _one_thread_users -= 1
        if _one_thread_users == 0:
            torch.set_num_threads(_saved_threads)


def _find_stop(text: str, stops: list[str]) -> int | None:
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(hits) if hits else None
