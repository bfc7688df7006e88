"""heads CKPT: every attention head of a trained Transformer described by measured scores, so a person
knows which heads are worth drawing with `charlm attn`.

The probe is a random sequence of P tokens followed by the same P tokens again (Olsson et al. 2022):
  previous-token  mean weight a token puts on the token just before it
  induction       in the repeat, mean weight on the token that followed the current token's first
                  occurrence (a head that copies what came next last time)
  distance        tokens looked back, weighted by attention, mean over queries
  entropy         bits of each query's attention, mean (0: one key; log2(i+1): uniform)
  nearest, cosine the most similar other head: cosine of two heads' attention maps
"""

from __future__ import annotations

import numpy as np
import torch

from charlm.config import ConfigError
from charlm.lab.common import (
    Chart,
    Clock,
    LabResult,
    load_run,
    record,
)
from charlm.models.probes import capture_attention

QUICK: dict = {}
PREVIOUS, INDUCTION = 0.4, 0.3  # scores from which a head is named for that pattern
LOCAL = 2.5  # mean distance (tokens) up to which a head is local


def probe_ids(tokenizer, period: int, seed: int) -> list[int]:
    """P random tokens, twice. Letters and digits only when the vocabulary has enough of them, so a char
    model reads symbols rather than a storm of newlines and separators."""
    vocab = list(range(tokenizer.vocab_size))
    plain = [i for i in vocab if tokenizer.decode([i]).isalnum()]
    pool = plain if len(plain) >= 4 else vocab
    gen = torch.Generator().manual_seed(seed)
    half = [pool[int(k)] for k in torch.randint(len(pool), (period,), generator=gen)]
    return half + half


def score_heads(weights: np.ndarray, period: int) -> list[dict]:
    """Scores of every head from attention weights (L, H, T, T) on a sequence whose second half repeats its
    first (period P, T = 2P). Pure numbers in, records out."""
    L, H, T, _ = weights.shape
    i = np.arange(T)
    back = np.clip(i[:, None] - i[None, :], 0, None)
    rows = np.arange(1, T)  # the first token can only look at itself
    rep = np.arange(period, T)  # queries in the repeat
    flat = weights[:, :, 1:].reshape(L * H, -1).astype(np.float64)
    unit = flat / np.maximum(np.linalg.norm(flat, axis=1, keepdims=True), 1e-12)
    sim = unit @ unit.T
    np.fill_diagonal(sim, -np.inf)
    uniform_entropy = float(np.mean(np.log2(rows + 1)))
    out = []
    for layer in range(L):
        for head in range(H):
            w = weights[layer, head].astype(np.float64)
            prev = float(w[rows, rows - 1].mean())
            ind = float(w[rep, rep - period + 1].mean())
            dist = float((w[rows] * back[rows]).sum(axis=1).mean())
            p = w[rows]
            ent = float(np.mean(-np.sum(np.where(p > 0, p * np.log2(np.where(p > 0, p, 1)), 0), axis=1)))
            k = layer * H + head
            near = int(np.argmax(sim[k])) if L * H > 1 else k
            out.append(
                record(
                    layer=layer,
                    head=head,
                    head_id=k,
                    previous=prev,
                    induction=ind,
                    distance=dist,
                    entropy=ent,
                    nearest=f"L{near // H}H{near % H}",
                    cosine=float(sim[k, near]) if L * H > 1 else 1.0,
                    role=role(prev, ind, dist, ent, uniform_entropy),
                )
            )
    return out


def role(prev: float, ind: float, dist: float, ent: float, uniform_entropy: float) -> str:
    if ind >= INDUCTION and ind >= prev:
        return "induction"
    if prev >= PREVIOUS:
        return "previous-token"
    if dist <= LOCAL:
        return "local"
    if ent >= 0.5 * uniform_entropy:
        return "global"
    return "distant"  # focused, but far back (e.g. a copy head at a fixed offset)


def run(ckpt: str, seed: int = 0, text=None, progress=print, period: int | None = None) -> LabResult:
    clock = Clock()
    ck = load_run(ckpt)
    if "attention" not in ck.model.capabilities:
        raise ConfigError(
            f"{ckpt} is an {ck.model_config.kind.upper()}: it has no attention heads; "
            "try charlm lab ablate for its gates"
        )
    P = period or min(64, ck.model_config.context // 2)
    _, weights = capture_attention(ck.model, probe_ids(ck.tokenizer, P, seed))
    records = score_heads(weights, P)
    return LabResult(
        "heads",
        {"checkpoint": str(ck.path), "period": P, "seed": seed},
        records,
        reading(records, P),
        Chart("head_id", ("previous", "induction"), None, "head (layer × heads + head)", "score"),
        seconds=clock(),
    )


def reading(records: list[dict], period: int) -> str:
    def name(r):
        return f"L{r['layer']}H{r['head']}"

    parts = [f"On {period} random tokens repeated once, {len(records)} heads:"]
    for what in ("induction", "previous-token", "local", "distant", "global"):
        heads = [r for r in records if r["role"] == what]
        if heads:
            parts.append(f"{what} {', '.join(name(r) for r in heads)};")
    best_ind = max(records, key=lambda r: r["induction"])
    best_prev = max(records, key=lambda r: r["previous"])
    far = max(records, key=lambda r: r["distance"])
    parts.append(
        f"the strongest induction score is {name(best_ind)}'s {best_ind['induction']:.2f} "
        f"(uniform attention would give about {1 / period:.2f}), the strongest previous-token score "
        f"{name(best_prev)}'s {best_prev['previous']:.2f}, and {name(far)} looks furthest back "
        f"({far['distance']:.1f} tokens on average)."
    )
    if not any(r["role"] == "induction" for r in records):
        parts.append(
            "No head copies what followed the last occurrence: this model has no induction head "
            "(one needs two layers, a previous-token head feeding it, and enough training)."
        )
    twins = [r for r in records if r["cosine"] >= 0.9]
    if twins:
        parts.append(
            f"{len(twins)} head(s) attend almost like another one (cosine ≥ 0.9), e.g. "
            f"{name(twins[0])} and {twins[0]['nearest']}: candidates for pruning."
        )
    parts.append(
        f"Draw one with: charlm attn CKPT --prompt TEXT --layer {best_ind['layer']} --head {best_ind['head']}."
    )
    return " ".join(parts)
