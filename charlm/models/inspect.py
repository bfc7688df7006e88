"""Interventions and measurements: what is inside a model, asked through its family's capabilities
(models/__init__.py) and never through its layers. `lab ablate`, `lab heads`, `lab induction`, `explore`,
`compress` and the probes all use these, so they measure the same thing the same way.

  nats(logits, ids, keep)            nats per scored target (keep: the positions a run was trained to predict)
  token_nats(logits, ids)            each target's nats, for one text
  knocked(model, part, mode)         model(idx) with a part taken out (the family's knock_out)
  knockouts(model, ids, ...)         (part, nats) with each part (or those given) taken out alone (reads: what
                                     the model reads where that is not ids, a lab run's filled input)
  each_part(model), whole_layer(...)  the parts to knock out
  entropy(w), offset_profile(w)      attention statistics of a head's rows: bits, weight d tokens back
  role(...)                          a head's name from its scores (previous-token, induction, ...)

A knock-out takes the part out at every position of every row read (mode "zero": its output held at 0;
"mean": at its mean over those positions, which keeps the part's average contribution and takes out only
what it says about this position).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from charlm.models import Part

PREVIOUS, INDUCTION, OFFSET = 0.4, 0.3, 0.4  # scores from which a head is named for that pattern
LOCAL = 2.5  # mean distance (tokens) up to which a head is local
MODES = ("zero", "mean")


# ---- scoring --------------------------------------------------------------------------------------------


def nats(logits: torch.Tensor, ids: torch.Tensor, keep: torch.Tensor | None = None) -> float:
    """Mean nats per target of logits (B, T, vocab) against ids (B, T + 1)'s next tokens; keep (B, T) bool: the
    targets scored (a lab run's trained positions), None: all."""
    each = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), ids[:, 1:].reshape(-1), reduction="none")
    return float(each.mean() if keep is None else each[keep.reshape(-1)].mean())


def token_nats(logits: torch.Tensor, ids: list[int]) -> np.ndarray:
    """Nats of each target of one text: out[i - 1] = -log p(ids[i] | before), from logits (n, vocab)."""
    if len(ids) < 2:
        return np.zeros(0)
    target = torch.tensor(ids[1:], dtype=torch.long)
    return F.cross_entropy(logits[:-1].float().cpu(), target, reduction="none").numpy()


# ---- interventions --------------------------------------------------------------------------------------


def each_part(model) -> list[Part]:
    """Every part of a model (each head, or each unit), one Part each, layer by layer."""
    n = model.parts(model.cfg)
    return [Part(layer, model.PART, (i,)) for layer in range(model.cfg.n_layers) for i in range(n)]


def whole_layer(model, layer: int) -> Part:
    """All of a layer's parts at once (every head, or every unit)."""
    return Part(layer, model.PART)


def knocked(model, part: Part, mode: str = "zero"):
    """The family's knock_out: `with knocked(model, part): model(idx)` reads with the part taken out."""
    if mode not in MODES:
        raise ValueError(f"a knock-out's mode is one of {MODES}, not {mode!r}")
    return model.knock_out(part, mode)


@torch.no_grad()
def knockouts(
    model,
    ids: torch.Tensor,
    keep: torch.Tensor | None = None,
    parts: list[Part] | None = None,
    mode: str = "zero",
    reads: torch.Tensor | None = None,
) -> list[tuple[Part, float]]:
    """(part, nats per scored target) with each part taken out alone; ids (B, T + 1), keep (B, T) the targets
    scored (None: all); parts: every part (each_part) by default; reads (B, T + 1): what the model reads where
    that is not ids (a lab run trained with a filler in place of each target: data.model_input), None: ids."""
    read = (ids if reads is None else reads)[:, :-1]
    out = []
    for part in each_part(model) if parts is None else parts:
        with knocked(model, part, mode):
            out.append((part, nats(model(read)[0], ids, keep)))
    return out


# ---- attention statistics -------------------------------------------------------------------------------


def entropy(rows: np.ndarray) -> float:
    """Bits of attention rows (queries, keys) that each sum to 1, mean over the rows (0 for none)."""
    if len(rows) == 0:
        return 0.0
    w = rows.astype(np.float64)
    return float(np.mean(-np.sum(np.where(w > 0, w * np.log2(np.where(w > 0, w, 1)), 0), axis=1)))


def common_offset(offsets: np.ndarray) -> tuple[int, float]:
    """The most common distance back to a row's strongest key, and how often it is that (offsets: one a row)."""
    if len(offsets) == 0:
        return 0, 1.0
    counts = np.bincount(offsets)
    return int(counts.argmax()), float(counts.max() / len(offsets))


def offset_profile(weights: np.ndarray) -> np.ndarray:
    """(L, H, T): each head's mean weight on the token d back, over the queries that have one, for d < T, from
    weights (L, H, T, T)."""
    L, H, T, _ = weights.shape
    out = np.zeros((L, H, T))
    for d in range(T):
        q = np.arange(d, T)
        out[:, :, d] = weights[:, :, q, q - d].mean(axis=-1)
    return out


def role(prev: float, ind: float, dist: float, ent: float, uniform_entropy: float, offset: float = 0.0) -> str:
    """A head's name from its scores: induction only where its induction score beats both its previous-token
    score and the weight it puts at its one fixed offset (over several periods, a head that looks a fixed
    distance back scores as induction at one period alone)."""
    if ind >= INDUCTION and ind >= prev and ind > offset:
        return "induction"
    if prev >= PREVIOUS:
        return "previous-token"
    if offset >= OFFSET:
        return "fixed offset"
    if dist <= LOCAL:
        return "local"
    if ent >= 0.5 * uniform_entropy:
        return "global"
    return "distant"  # focused, but far back, at no one distance
