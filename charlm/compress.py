"""Smaller models that keep their bits per character: quantization, structured pruning, and the measurements
that say what each costs.

  quantize      every matrix as int8 (a scale per output channel) or int4 (a scale per group of 32, two codes
                a byte); norms and biases stay float32. The format, and reading it back through the same
                safe loader, is storage/quantized.py's; after loading, commands compute in float.
  drop heads    a Transformer's K least important heads of every layer, sliced out of qkv and proj: a smaller
                model whose config says so (n_heads, head_dim), not a mask. Importance: the loss when the head
                alone is knocked out (models/inspect.py, as lab ablate), on the first part of the scored text.
  drop units    an LSTM/GRU's K least important hidden units of every layer, sliced out of its matrices (the
                config's hidden size). Importance: the RMS of the unit's output on the text times the norm of
                its outgoing weights (RNN.importance says why not the loss change or its gradient estimate).
                Both are the family's own importance() and prune() (models/__init__.py: the "prune"
                capability); this module names no layer.
  measure       on the run's validation text (or --text): bits/char, and against the original model the
                top-1 agreement and KL divergence KL(original || compressed) per token; parameters, bits per
                stored weight, file bytes; tokens/s generating at one thread.

Unstructured (magnitude) pruning is not offered: its zeros cost as many bytes as the weights they replace in a
dense file, and a sparse one (a 16-bit index beside each kept value) is smaller than int8's only past 2/3 zeros
(docs/compress.md).
"""

from __future__ import annotations

import codecs
import math
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from charlm import files
from charlm.config import ModelConfig, SampleConfig
from charlm.errors import ConfigError
from charlm.evaluate import validation_part
from charlm.models import config_params, family
from charlm.storage import checkpoint
from charlm.storage.checkpoint import Saved
from charlm.storage.quantized import quantize

BATCH_ROWS = 16  # windows scored at once


@dataclass
class Measured:
    """One compressed model against the original, on the same text."""

    name: str
    params: int
    bits_per_weight: float
    file_bytes: int
    bpc: float
    top1: float  # share of positions where both models' most likely next token is the same
    kl: float  # KL(original || this), nats per token
    tokens_per_s: float

    def to_dict(self) -> dict:
        return {k: (round(v, 5) if isinstance(v, float) else v) for k, v in self.__dict__.items()}


@dataclass
class Scored:
    """The text compressed models are scored on: windows of the model's context, each target scored once."""

    rows: torch.Tensor  # (N, T + 1) token ids
    source: str
    chars_per_token: float


# ---- the text --------------------------------------------------------------------------------------------


def scored_text(ck, text: str | None, tokens: int) -> Scored:
    """--text FILE, else the validation part of the corpus the run names (the trainer's own split), while that
    file is still there and unchanged; cut into windows of the context (+1 for the last target)."""
    tok, corpus = ck.tokenizer, ck.saved.corpus
    if text is not None:
        p = Path(text)
        body = _read_text(p, tokens * TEXT_BYTES_PER_TOKEN)
        ids = tok.encode(body, unknown="drop")[:tokens]
        cpt = len(tok.decode(ids)) / max(len(ids), 1)
        source = str(p)
    else:
        val, why = validation_part(ck)
        if why:
            raise ConfigError(f"no text to score {ck.path}: {why}; give one with --text FILE")
        ids, cpt, source = [int(i) for i in val[:tokens]], corpus.chars_per_token, f"{corpus.path} (validation part)"
    T = min(ck.model_config.context, len(ids) - 1)
    n = (len(ids) - 1) // T if T >= 1 else 0
    if n < 1:
        raise ConfigError(f"the text to score ({source}) is too short: give a longer one with --text FILE")
    rows = torch.tensor([ids[i * T : i * T + T + 1] for i in range(n)], dtype=torch.long)
    return Scored(rows, source, cpt)


TEXT_BYTES_PER_TOKEN = 64  # --text is read this far at most: far more than any token of the text scored needs


def _read_text(p: Path, limit: int) -> str:
    """The start of a regular file (its first `limit` bytes) as UTF-8 text; a FIFO, a device (/dev/zero never
    ends) or a directory is refused with what it is, without waiting on it."""
    try:
        fd = files.open_regular(p.resolve(), os.O_RDONLY)  # (non-blocking: a FIFO with no writer is no wait)
    except FileNotFoundError:
        raise ConfigError(f"--text: no such file {p}") from None
    except OSError as e:
        raise ConfigError(f"--text {p}: {e.strerror or e}; give a text file") from None
    with open(fd, "rb") as f:
        data = f.read(limit)
    try:  # (incremental: a character cut by the limit is left out, not an error)
        return codecs.getincrementaldecoder("utf-8")().decode(data, final=len(data) < limit)
    except UnicodeDecodeError:
        raise ConfigError(f"--text: {p} is not UTF-8 text") from None


@torch.no_grad()
def log_probs(model, rows: torch.Tensor) -> torch.Tensor:
    """(N, T, vocab) log-probabilities of each next token, in float32."""
    out = [
        F.log_softmax(model(rows[i : i + BATCH_ROWS, :-1])[0].float(), dim=-1) for i in range(0, len(rows), BATCH_ROWS)
    ]
    return torch.cat(out)


def compare_to(reference: torch.Tensor, logp: torch.Tensor, rows: torch.Tensor) -> tuple[float, float, float]:
    """(nats per token, top-1 agreement, KL(reference || logp) per token) of logp against the targets in rows."""
    nats = -logp.gather(-1, rows[:, 1:, None]).mean()
    top1 = (reference.argmax(-1) == logp.argmax(-1)).float().mean()
    kl = (reference.exp() * (reference - logp)).sum(-1).mean()
    return float(nats), float(top1), float(kl)


def tokens_per_s(ck, n: int = 200, repeats: int = 3) -> float:
    """Generation speed at one thread (the Streamer runs at one): the best of a few runs of n tokens sampled
    after a newline (on a shared CPU the best is the steadiest figure)."""
    from charlm.generate import Streamer

    best = 0.0
    for _ in range(repeats):
        streamer = Streamer(ck.model, ck.tokenizer)
        streamer.complete([], SampleConfig(max_tokens=n, seed=0))
        best = max(best, streamer.stats.tokens_per_s)
    return best


# ---- structured pruning ----------------------------------------------------------------------------------


def importance(model, rows: torch.Tensor) -> np.ndarray:
    """(layers, parts): what each head or unit is worth on rows, by the family's own measure (a head: the loss
    when it alone is knocked out, as lab ablate measures it; a unit: what it sends on)."""
    return model.importance(rows)


head_importance = unit_importance = importance  # the names commands/compress.py asks by


def prune(cfg: ModelConfig, state: dict, scores: np.ndarray, k: int, flag: str) -> tuple[ModelConfig, dict, list]:
    """The model without the k least important parts of each layer by scores (layers, parts) (the family's prune):
    (config, state dict, [(layer, part), ...]); flag: the option that asked, for the refusal."""
    cls = family(cfg.kind)
    n = cls.parts(cfg)
    if not 0 <= k < n:
        raise ConfigError(f"{flag} must be below the {n} {cls.PART}s of each layer, got {k}")
    return cls.prune(cfg, state, scores, k)


def drop_heads(cfg: ModelConfig, state: dict, scores: np.ndarray, k: int) -> tuple[ModelConfig, dict, list]:
    """The model without the k least important heads of each layer: (config, state dict, [(layer, head), ...])."""
    return prune(cfg, state, scores, k, "--drop-heads")


def drop_units(cfg: ModelConfig, state: dict, scores: np.ndarray, k: int) -> tuple[ModelConfig, dict, list]:
    """The LSTM/GRU without the k least important hidden units of each layer."""
    return prune(cfg, state, scores, k, "--drop-units")


# ---- writing ---------------------------------------------------------------------------------------------


def stored(state: dict, bits: int) -> tuple[dict, dict | None]:
    """(float tensors, quantized matrices) as a checkpoint stores `state` at `bits`. A tensor stored under two
    names (a tied head) stays one tensor, so the file holds it once."""
    model, quantized, done = {}, {}, {}
    for name, t in state.items():
        key = (t.data_ptr(), t.shape)
        if bits in (8, 4) and t.dim() == 2:
            if key not in done:
                q = quantize(t.detach().float().numpy(), bits)
                done[key] = {
                    "bits": bits,
                    "values": torch.from_numpy(q["values"]),
                    "scales": torch.from_numpy(q["scales"]),
                }
            quantized[name] = done[key]
        else:
            if key not in done:
                done[key] = t.detach().to(torch.bfloat16 if bits == 16 else torch.float32).clone()
            model[name] = done[key]
    return model, quantized or None


def bits_per_weight(model: dict, quantized: dict | None, params: int) -> float:
    tensors = {id(t): t for t in model.values()}
    for e in (quantized or {}).values():
        tensors |= {id(e["values"]): e["values"], id(e["scales"]): e["scales"]}
    return 8 * sum(t.numel() * t.element_size() for t in tensors.values()) / params


def build(
    ck,
    name: str,
    bits: int,
    cfg: ModelConfig,
    weights: tuple,
    what: dict,
    scores: tuple[float, float] | None,
    record: dict | None = None,
) -> Saved:
    """The compressed run's checkpoint: the original's record, with the new model (weights: stored()'s), its own
    score and what was done (record: the `compressed` record with the steps before, else this step alone). No
    optimizer or rng: a compressed run is for using, not for training on."""
    model, quantized = weights
    loss, bpc = scores if scores else (None, None)
    return replace(
        ck.saved,
        run_name=name,
        model_config=cfg,
        model=model,
        quantized=quantized,
        compressed=record or {"from": str(ck.path), "bits": bits, **what},
        params=config_params(cfg),
        best_val_loss=loss,
        best_val_bpc=bpc,
        metrics=None,
        optimizer=None,
        rng=None,
        scaler=None,
        world_size=1,
        weights_sha256=None,
    )


def load_seconds(path: Path, repeats: int = 3) -> float:
    """The best of a few loads through checkpoint.load (what every command does first)."""
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        checkpoint.load(path)
        best = min(best, time.perf_counter() - start)
    return best
