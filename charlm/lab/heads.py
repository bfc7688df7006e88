"""heads CKPT: every attention head of a trained Transformer described by measured scores, so a person
knows which heads are worth drawing with `charlm attn`.

The probe is a random sequence of P tokens followed by the same P tokens again (Olsson et al. 2022), for
several periods P (PERIODS of them, spread up to half the context), and each score is the mean over them:
  previous-token  mean weight a token puts on the token just before it
  induction       in the repeat, mean weight on the token that followed the current token's first
                  occurrence (a head that copies what came next last time); also shown period by period
  offset          the distance d ≥ 2 a head puts the most weight at, the same d at every period, and that
                  weight: a head that looks a fixed distance back scores high here and as induction only at
                  the period whose repeat sits that far back, so it is named "fixed offset", not induction
  distance        tokens looked back, weighted by attention, mean over queries
  entropy         bits of each query's attention, mean (0: one key; log2(i+1): uniform)
  nearest, cosine the most similar other head: cosine of two heads' attention maps
"""

from __future__ import annotations

import numpy as np
import torch

from charlm.errors import ConfigError
from charlm.lab.result import Chart, Clock, LabResult, record
from charlm.lab.training import load_run
from charlm.models import lacks
from charlm.models.inspect import entropy, offset_profile, role
from charlm.models.probes import capture_attention

QUICK: dict = {}
PERIODS = 4  # probes, of periods spread up to half the context

CHART = Chart(
    "head_id", ("previous", "induction", "offset_weight"), None, "head (layer × heads + head)", "score"
)  # how its records are drawn


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
    at_offset = offset_profile(weights)  # (L, H, T): mean weight d tokens back
    out = []
    for layer in range(L):
        for head in range(H):
            w = weights[layer, head].astype(np.float64)
            prev = float(w[rows, rows - 1].mean())
            ind = float(w[rep, rep - period + 1].mean())
            dist = float((w[rows] * back[rows]).sum(axis=1).mean())
            ent = entropy(w[rows])
            k = layer * H + head
            d = int(np.argmax(at_offset[layer, head, 2:])) + 2 if T > 2 else 1
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
                    offset=d,
                    offset_weight=float(at_offset[layer, head, d]) if T > 2 else 0.0,
                    nearest=f"L{near // H}H{near % H}",
                    cosine=float(sim[k, near]) if L * H > 1 else 1.0,
                    role=role(prev, ind, dist, ent, uniform_entropy, float(at_offset[layer, head, d]) if T > 2 else 0),
                )
            )
    return out


def periods_for(context: int, longest: int = 64) -> list[int]:
    """PERIODS probe periods spread evenly up to half the context (at most `longest`), each at least 2."""
    top = max(2, min(longest, context // 2))
    return sorted({max(2, round(top * (k + 1) / PERIODS)) for k in range(PERIODS)})


def score_periods(model, tokenizer, periods: list[int], seed: int) -> list[dict]:
    """Every head's scores on one probe of each period (score_probes)."""
    probes = []
    for k, P in enumerate(periods):
        _, w = capture_attention(model, probe_ids(tokenizer, P, seed + k))
        probes.append((w, P))
    return score_probes(probes)


def score_probes(probes: list[tuple[np.ndarray, int]]) -> list[dict]:
    """Every head's scores from its attention weights (L, H, 2P, 2P) on probes of several periods P, each
    score the mean over the probes, with the induction score at each period and the one offset d >= 2 that
    holds the most weight over all of them (its mean weight d back, over the probes long enough to have it).
    Pure numbers in, records out."""
    per = [score_heads(w, P) for w, P in probes]
    T = max(w.shape[-1] for w, _ in probes)
    total, reach = 0.0, np.zeros(T)
    for w, _ in probes:
        prof = np.zeros(w.shape[:2] + (T,))
        prof[:, :, : w.shape[-1]] = offset_profile(w)
        total = total + prof
        reach[: w.shape[-1]] += 1
    mean_profile = total / np.maximum(reach, 1)  # (L, H, T)
    uniform_entropy = float(np.mean([np.mean(np.log2(np.arange(2, w.shape[-1] + 1))) for w, _ in probes]))
    out = []
    for i, h in enumerate(per[0]):
        prev = float(np.mean([p[i]["previous"] for p in per]))
        ind = float(np.mean([p[i]["induction"] for p in per]))
        dist = float(np.mean([p[i]["distance"] for p in per]))
        ent = float(np.mean([p[i]["entropy"] for p in per]))
        prof = mean_profile[h["layer"], h["head"]]
        d = int(np.argmax(prof[2:])) + 2
        out.append(
            record(
                layer=h["layer"],
                head=h["head"],
                head_id=h["head_id"],
                previous=prev,
                induction=ind,
                by_period=[round(p[i]["induction"], 2) for p in per],
                offset=d,
                offset_weight=float(prof[d]),
                distance=dist,
                entropy=ent,
                nearest=h["nearest"],
                cosine=h["cosine"],
                role=role(prev, ind, dist, ent, uniform_entropy, float(prof[d])),
            )
        )
    return out


def run(ckpt: str, seed: int = 0, text=None, progress=print, period: int | None = None) -> LabResult:
    clock = Clock()
    ck = load_run(ckpt)
    if "attention" not in ck.model.capabilities:
        hint = "; charlm lab ablate knocks out its parts" if "knock_out" in ck.model.capabilities else ""
        raise ConfigError(f"lab heads: {lacks(ck.model, 'attention')} ({ckpt}){hint}")
    periods = [period] if period else periods_for(ck.model_config.context)
    records = score_periods(ck.model, ck.tokenizer, periods, seed)
    return LabResult(
        "heads",
        {"checkpoint": str(ck.path), "periods": periods, "seed": seed},
        records,
        reading(records, periods, prunable="prune" in ck.model.capabilities),
        CHART,
        seconds=clock(),
    )


def reading(records: list[dict], periods: list[int], prunable: bool = True) -> str:
    def name(r):
        return f"L{r['layer']}H{r['head']}"

    parts = [
        f"On random tokens repeated once, at periods {', '.join(map(str, periods))} (each score the mean over "
        f"them), {len(records)} heads:"
    ]
    for what in ("induction", "previous-token", "fixed offset", "local", "distant", "global"):
        heads = [r for r in records if r["role"] == what]
        if heads:
            parts.append(f"{what} {', '.join(name(r) for r in heads)};")
    best_ind = max(records, key=lambda r: r["induction"])
    best_prev = max(records, key=lambda r: r["previous"])
    far = max(records, key=lambda r: r["distance"])
    uniform = float(np.mean([1 / P for P in periods]))
    parts.append(
        f"the strongest induction score is {name(best_ind)}'s {best_ind['induction']:.2f} "
        f"({' / '.join(f'{v:.2f}' for v in best_ind['by_period'])} at the periods; uniform attention would give "
        f"about {uniform:.2f}), the strongest previous-token score {name(best_prev)}'s {best_prev['previous']:.2f}, "
        f"and {name(far)} looks furthest back ({far['distance']:.1f} tokens on average)."
    )
    fixed = [r for r in records if r["role"] == "fixed offset"]
    for r in fixed:
        parts.append(
            f"{name(r)} puts {r['offset_weight']:.2f} of its weight {r['offset']} tokens back whatever the period: "
            "a fixed offset, not induction."
        )
    if not any(r["role"] == "induction" for r in records):
        parts.append(
            "No head copies what followed the last occurrence at every period: this model has no induction head "
            "(one needs two layers, a previous-token head feeding it, and enough training)."
        )
    twins = [r for r in records if r["cosine"] >= 0.9]
    if twins:
        parts.append(
            f"{len(twins)} head(s) attend almost like another one (cosine ≥ 0.9), e.g. "
            f"{name(twins[0])} and {twins[0]['nearest']}"
            + (": candidates for pruning." if prunable else " (this model's heads cannot be pruned).")
        )
    parts.append(
        f"Draw one with: charlm attn CKPT --prompt TEXT --layer {best_ind['layer']} --head {best_ind['head']}."
    )
    return " ".join(parts)
