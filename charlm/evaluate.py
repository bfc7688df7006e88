"""How well does a model predict a text? Loss, perplexity, bits per character and bits per byte over a
whole file.

The score of a text of tokens t_1..t_N is the model's total surprise at each token given everything
before it: nats = -sum_{j=2..N} log p(t_j | t_<j). The first token has nothing before it, so it is
not scored. A character counts when its first UTF-8 byte lies in a scored token (for a char model:
every character but the first; for BPE: the characters of the decoded tokens 2..N), and a byte counts
when it lies in a scored token. Then

    loss = nats / tokens    bits/char = nats / chars / ln 2    bits/byte = nats / bytes / ln 2

Per character and per byte the number no longer depends on the tokenizer, so char and BPE models,
LSTMs and Transformers are compared on one scale.

How the text is read:
- Transformer (any model with a `window`): its context is finite, so the text is read in windows of `context` tokens that advance
  by `stride` tokens (default context // 2). Each window scores only the targets no earlier window
  scored (its last `stride`), so every token is scored exactly once, with at least context - stride
  tokens of left context — all of it while the text still fits the context. The final window is moved
  left to end at the last token, so it is full-length too. stride = context is the fastest (one
  forward pass per token) but the first tokens of each window see almost nothing; stride = context // 2
  costs two passes per token and gives every token at least half a context, 3/4 on average.
- LSTM/GRU (no window): the text is read in chunks of RNN_CHUNK tokens with the recurrent state carried from
  one to the next, so the result is exactly one pass over the whole text; the chunks only bound memory.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from charlm.config import UNKNOWN
from charlm.data import Batches, CorpusError, bits_per_char, corpus_sha256, encode_corpus, iter_corpus, load_tokens
from charlm.errors import ConfigError
from charlm.tokenizer import BPETokenizer, CharTokenizer, UnknownCharactersError

Tokenizer = CharTokenizer | BPETokenizer
Progress = Callable[[int, int], None]


class UnknownCharactersInFile(CorpusError):
    """The text has characters a char model never saw (and --unknown is error)."""


@dataclass
class EvalResult:
    nats: float  # total surprise over the scored tokens
    tokens: int  # scored tokens: all but the first
    chars: int  # characters whose first byte lies in a scored token
    bytes: int  # UTF-8 bytes of the scored tokens
    seconds: float  # encoding + scoring
    stride: int | None  # the transformer's window stride (None for an RNN: one pass)
    unknown_dropped: int = 0  # characters a char model could not encode, left out (--unknown drop)

    @property
    def loss(self) -> float:
        return self.nats / self.tokens

    @property
    def perplexity(self) -> float:
        return math.exp(self.loss)

    @property
    def bits_per_char(self) -> float:
        return bits_per_char(self.nats, chars=self.chars)

    @property
    def bits_per_byte(self) -> float:
        return bits_per_char(self.nats, chars=self.bytes)

    def to_dict(self) -> dict:
        return {
            "loss": self.loss,
            "bits_per_char": self.bits_per_char,
            "bits_per_byte": self.bits_per_byte,
            "perplexity": self.perplexity,
            "tokens": self.tokens,
            "chars": self.chars,
            "bytes": self.bytes,
            "seconds": round(self.seconds, 3),
            "stride": self.stride,
            "unknown_dropped": self.unknown_dropped,
        }


# ---- reading ------------------------------------------------------------------------------------


def encode_file(path: str | os.PathLike, tokenizer: Tokenizer, unknown: str = "error") -> tuple[np.ndarray, int]:
    """The token ids of a UTF-8 text file (read with iter_corpus: CRLF -> LF, BOM removed) and how many
    characters were dropped because a char tokenizer does not know them (unknown="drop")."""
    if unknown not in UNKNOWN:
        raise ConfigError(f"--unknown must be error, drop or replace, got {unknown!r}")
    parts, missing, dropped = [], {}, 0
    for chunk in iter_corpus(path):
        try:
            ids = tokenizer.encode_array(chunk)
        except UnknownCharactersError as e:
            # replace: scored as the tokenizer's replacement character; otherwise left out of the score
            ids = np.asarray(
                tokenizer.encode(chunk, unknown="replace" if unknown == "replace" else "drop"), dtype=np.int64
            )
            dropped += len(chunk) - len(ids)
            missing.update(dict.fromkeys(e.chars))
        parts.append(np.asarray(ids, dtype=np.int32))
    if missing and unknown == "error":
        shown = ", ".join(repr(c) for c in list(missing)[:10]) + (", ..." if len(missing) > 10 else "")
        raise UnknownCharactersInFile(
            f"{path} has {len(missing)} character{'s' if len(missing) != 1 else ''} this model never saw: {shown} "
            f"({dropped} occurrence{'s' if dropped != 1 else ''}); add --unknown drop to score the text without them"
        )
    return np.concatenate(parts), dropped


# ---- scoring ------------------------------------------------------------------------------------


def window_plan(n_tokens: int, context: int, stride: int) -> list[tuple[int, int, int]]:
    """Windows (start, end, first) over a text of n_tokens: inputs ids[start:end], targets
    ids[start+1:end+1], of which the ones at text positions >= first are scored (the rest were
    scored by an earlier window). Every target 1..n_tokens-1 is scored exactly once."""
    plan, done, start = [], 0, 0
    while done < n_tokens - 1:
        start = min(start, max(0, n_tokens - 1 - context))  # the last window ends at the last token
        end = min(start + context, n_tokens - 1)
        plan.append((start, end, done + 1))
        done, start = end, start + stride
    return plan


def _nats(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """-log p(target) per position: (B, T, V), (B, T) -> (B, T), in float32 whatever the model's dtype."""
    B, T, V = logits.shape
    return F.cross_entropy(logits.float().view(B * T, V), targets.reshape(-1), reduction="none").view(B, T)


@torch.inference_mode()
def token_nats(
    model, ids: np.ndarray, stride: int | None = None, batch_size: int = 16
) -> Iterator[tuple[int, np.ndarray]]:
    """Yields (j, nats): nats[i] = -log p(ids[j + i] | the text before it), in text order, each target
    j = 1..len(ids)-1 exactly once. The model must be in eval mode."""
    context, device = model.cfg.context, next(model.parameters()).device
    n = len(ids)
    if model.window is None:  # an RNN: no window to run out of
        yield from _rnn_nats(model, ids, device)
        return
    stride = context // 2 if stride is None else stride
    if not 1 <= stride <= context:
        raise ConfigError(f"--stride must be between 1 and the model's context ({context}), got {stride}")
    plan = window_plan(n, context, stride)
    for b in range(0, len(plan), batch_size):
        group = plan[b : b + batch_size]
        # all windows are `context` long, except a single one when the whole text is shorter
        w = np.stack([np.asarray(ids[s : e + 1], dtype=np.int64) for s, e, _ in group])  # (B, T+1)
        w = torch.from_numpy(w).to(device)
        nats = _nats(model(w[:, :-1])[0], w[:, 1:]).double().cpu().numpy()  # (B, T)
        for (s, e, first), row in zip(group, nats):
            yield first, row[first - s - 1 : e - s]


RNN_CHUNK = 1024  # tokens an RNN reads per call: long calls, few of them (the state is carried across)


def _rnn_nats(model, ids: np.ndarray, device) -> Iterator[tuple[int, np.ndarray]]:
    """token_nats for an RNN: one pass over the text, in chunks of RNN_CHUNK tokens that only bound memory
    (the state is carried from each chunk to the next, so the chunking cannot change a score). On a CPU the
    recurrence runs on one thread: each step is a small matrix-vector product, which a second thread makes
    slower, not faster (and far slower when another process holds the other core: every step waits for it)."""
    state = model.new_cache(1)
    with _threads(1 if device.type == "cpu" else None):
        for start in range(0, len(ids) - 1, RNN_CHUNK):
            end = min(start + RNN_CHUNK, len(ids) - 1)
            w = torch.from_numpy(np.asarray(ids[start : end + 1], dtype=np.int64)).to(device)[None]  # (1, T+1)
            logits, _ = model(w[:, :-1], cache=state)
            yield start + 1, _nats(logits, w[:, 1:])[0].double().cpu().numpy()


@contextmanager
def _threads(n: int | None):
    """torch's intra-op threads set to n inside the block (None: unchanged), restored after."""
    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _token_tables(tokenizer: Tokenizer) -> tuple[np.ndarray, np.ndarray]:
    """Per token id: its UTF-8 bytes, and how many characters start in it (bytes that are not
    continuation bytes 10xxxxxx)."""
    raw = [tokenizer.token_bytes(i) for i in range(tokenizer.vocab_size)]
    n_bytes = np.array([len(b) for b in raw], dtype=np.int64)
    n_chars = np.array([sum((c & 0xC0) != 0x80 for c in b) for b in raw], dtype=np.int64)
    return n_bytes, n_chars


def evaluate_ids(
    model,
    tokenizer: Tokenizer,
    ids: np.ndarray,
    stride: int | None = None,
    batch_size: int = 16,
    progress: Progress | None = None,
) -> EvalResult:
    """Score token ids (see the module docstring for what is counted)."""
    if len(ids) < 2:
        raise CorpusError("the text is too short to evaluate: it needs at least 2 tokens")
    t0 = time.perf_counter()
    total, scored = 0.0, 0
    for j, nats in token_nats(model, ids, stride, batch_size):
        total += float(nats.sum())
        scored += len(nats)
        if progress:
            progress(j + len(nats) - 1, len(ids) - 1)
    assert scored == len(ids) - 1, "every token but the first is scored once"
    n_bytes, n_chars = _token_tables(tokenizer)
    rest = np.asarray(ids[1:], dtype=np.int64)
    return EvalResult(
        nats=total,
        tokens=scored,
        chars=int(n_chars[rest].sum()),
        bytes=int(n_bytes[rest].sum()),
        seconds=time.perf_counter() - t0,
        stride=None if model.window is None else (stride or model.cfg.context // 2),
    )


def evaluate_file(
    model,
    tokenizer: Tokenizer,
    path: str | os.PathLike,
    stride: int | None = None,
    unknown: str = "error",
    batch_size: int = 16,
    progress: Progress | None = None,
) -> EvalResult:
    """Loss and bits per char/byte of `model` on a whole UTF-8 text file."""
    t0 = time.perf_counter()
    ids, dropped = encode_file(path, tokenizer, unknown)
    if len(ids) < 2:
        raise CorpusError(f"{path} is too short to evaluate: it needs at least 2 tokens, it has {len(ids)}")
    result = evaluate_ids(model, tokenizer, ids, stride, batch_size, progress)
    result.unknown_dropped = dropped
    result.seconds = time.perf_counter() - t0
    return result


def validation_part(ck) -> tuple[np.ndarray | None, str | None]:
    """(the validation tokens of the corpus a run was trained on, by the trainer's own split, None) while that
    file is still there and unchanged; else (None, why not), for the caller's message."""
    corpus = ck.saved.corpus
    if corpus is None or not corpus.path:
        return None, "its checkpoint does not record where its corpus was"
    if not os.path.isfile(corpus.path):
        return None, f"it was trained on {corpus.path}, which is no longer there"
    if corpus_sha256(corpus.path) != corpus.sha256:
        return None, f"it was trained on {corpus.path}, which has changed since (another sha256)"
    tokens = load_tokens(encode_corpus(corpus.path, ck.tokenizer, sha256=corpus.sha256))
    return Batches(tokens, ck.model_config.context, ck.train_config.val_fraction).val, None
