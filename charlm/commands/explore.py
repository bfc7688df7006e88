"""`charlm explore` as functions: every number the explorer (charlm/explore/app.py) shows, computed once per
text, so a cursor or head move only looks numbers up. Nothing here draws.

  scene(model, tokenizer, ids) -> AttentionScene | GateScene

A Transformer reads a text longer than its context in windows of `context` tokens that advance by half a
context (as `charlm eval` does); each token is read in the first window that holds it with the most tokens
before it, so it sees between context/2 and context tokens. Its attention rows, its next-token logits and its
surprisal come from that one forward pass (models/probes.py capture_attention on the window: the model's own
explicit-softmax path). Head labels are `lab heads`' (models/inspect.py role) from scores measured on the
text itself: previous-token weight, induction weight (on the tokens that followed earlier occurrences of the
query's token), distance looked back and entropy. A knock-out takes one head out through the family's
knock_out, as `lab ablate` does (models/inspect.py), and re-reads every window.

An LSTM/GRU reads the last MAX_GATE_TOKENS tokens from a fresh state; its gates come from probes.trace_gates
(the same trace `charlm gates` draws), its logits from the model's forward pass; a unit is knocked out
through knock_out too.

On a lab run's own corpus (the text explored is the start of its corpus.txt), bits/char count only the
positions the run was trained to predict (its targets mask), as `lab ablate` scores it: the scene's `scored`
says which ("trained positions" or "every position"); and where the run's model was trained reading a filler in
place of each target (recall), it reads the filler there (data.model_input, as lab ablate feeds it), while the
text shown is the text itself.

Over ~450 lines on purpose: the two scenes share their predictions (Predicted), their knock-outs and their
loading, and the explorer asks one module for either.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from charlm.data import bits_per_char, filler, model_input, trained_positions
from charlm.errors import ConfigError
from charlm.models import Part, lacks
from charlm.models.inspect import common_offset, entropy, knocked, role, token_nats
from charlm.models.probes import CANDIDATES, MAX_GATE_TOKENS, capture_attention, choose_units, trace_gates
from charlm.options import ExploreOptions

MAX_TOKENS = (
    MAX_GATE_TOKENS  # longer texts: their last tokens (every head's rows are kept: tokens × layers × heads × context)
)
TOP = 5  # keys and predictions listed in the side panel
EVERY, TRAINED = "every position", "trained positions"  # what a scene's bits/char count (Predicted.scored)


# ---- windows: which tokens each token sees ------------------------------------------------------------


def windows(n: int, context: int) -> list[int]:
    """Starts of the windows a text of n tokens is read in: one when it fits, else every context//2 tokens
    and a last one ending at the text's end."""
    if n <= context:
        return [0]
    step = max(1, context // 2)
    return [*range(0, n - context, step), n - context]


def window_of(n: int, context: int) -> np.ndarray:
    """For every token, the start of the window it is read in: the first window that holds it (the one
    where it has the most tokens before it)."""
    starts = windows(n, context)
    ends = np.array(starts) + min(n, context)
    which = np.searchsorted(ends, np.arange(n), side="right")  # the first window ending after the token
    return np.array(starts)[which]


def _targets_bpc(nats: np.ndarray, chars: int, keep: np.ndarray | None = None) -> float:
    """Bits per character of per-target nats (tokens 1..n-1) on text of `chars` characters (the scored ones')."""
    return bits_per_char(float(nats.sum() if keep is None else nats[keep].sum()), chars=max(chars, 1))


def _scored_chars(tokenizer, ids: list[int], keep: np.ndarray | None) -> int:
    """Characters of the targets scored: tokens 1..n-1, or those keep marks."""
    targets = ids[1:] if keep is None else [t for t, k in zip(ids[1:], keep) if k]
    return len(tokenizer.decode(targets))


# ---- Transformer ----------------------------------------------------------------------------------------


@dataclass
class HeadLabel:
    layer: int
    head: int
    role: str  # lab heads' name: previous-token, induction, local, distant, global
    previous: float
    induction: float
    distance: float  # tokens looked back, attention-weighted, mean over queries
    entropy: float  # bits, mean over queries
    offset: int  # the most common distance to a query's strongest key
    offset_share: float  # how often that is the strongest key

    @property
    def name(self) -> str:
        """The role, with its fixed offset for a focused far-looking head (a copy head: 'offset 12')."""
        if self.role == "distant" and self.offset_share >= 0.5:
            return f"offset {self.offset}"
        return self.role


@dataclass
class Knockout:
    """A head (Transformer) or a unit (LSTM/GRU) taken out: bits/char over the text, and the change in every
    target's surprisal."""

    layer: int
    part: int  # the head, or the unit
    bpc: float
    base_bpc: float
    rise: np.ndarray  # (n - 1,) bits each target token lost (positive: the loss rose)

    @property
    def change(self) -> float:
        return self.bpc - self.base_bpc


class Predicted:
    """What both scenes say of the text's tokens: their surprisal, the predictions after each, bits/char (from
    the scene's logits (n, vocab), nats (n - 1,) and chars)."""

    @property
    def scored(self) -> str:
        """What bits/char counts: "every position", or a lab run's "trained positions"."""
        return EVERY if self.keep is None else TRAINED

    def surprisal_bits(self) -> np.ndarray:
        """(n,) bits of each token given the ones before (NaN for the first, which nothing predicts)."""
        return np.concatenate([[np.nan], bits_per_char(self.nats)])

    def predictions(self, i: int, k: int = TOP) -> list[tuple[int, float]]:
        return _top(self.logits[i], k)

    @property
    def bpc(self) -> float:
        return _targets_bpc(self.nats, self.chars, self.keep)


@dataclass
class AttentionScene(Predicted):
    """A Transformer on a text: every head's attention row of every token, its predictions, its surprisal."""

    ids: list[int]  # the text shown and predicted
    reads: list[int]  # what the model reads of it: ids, or a lab run's filled input (Trained)
    start: int  # the text's first token shown (a longer text: its last MAX_TOKENS)
    seen_from: np.ndarray  # (n,) the first token each token sees (its window's start)
    rows: np.ndarray  # (n, layers, heads, context): rows[i, l, h, k] = weight of token i on token seen_from[i] + k
    logits: torch.Tensor  # (n, vocab): the model's next-token logits after each token
    nats: np.ndarray  # (n - 1,): surprisal of tokens 1..n-1 in nats
    labels: list[HeadLabel]
    chars: int  # characters of tokens 1..n-1 (the bits/char denominator)
    context: int
    knockouts: dict = field(default_factory=dict)  # (layer, head) -> Knockout, computed on demand
    keep: np.ndarray | None = None  # (n - 1,) the targets scored (a lab run's trained positions); None: all

    @property
    def layers(self) -> int:
        return self.rows.shape[1]

    @property
    def heads(self) -> int:
        return self.rows.shape[2]

    def label(self, layer: int, head: int) -> HeadLabel:
        return self.labels[layer * self.heads + head]

    def looked_at(self, i: int, layer: int, head: int | None) -> np.ndarray:
        """(n,) how much token i attended to each token (0 outside what it sees); head None: the layer's mean."""
        row = self.rows[i, layer]
        row = row.mean(axis=0) if head is None else row[head]
        out = np.zeros(len(self.ids))
        a = int(self.seen_from[i])
        out[a : i + 1] = row[: i + 1 - a]
        return out

    def looked_from(self, j: int, layer: int, head: int | None) -> np.ndarray:
        """(n,) how much each token attended to token j (0 for tokens that do not see it)."""
        out = np.zeros(len(self.ids))
        q = np.arange(j, len(self.ids))
        q = q[self.seen_from[q] <= j]
        k = j - self.seen_from[q]
        rows = self.rows[q, layer]  # (queries, heads, context)
        w = rows.mean(axis=1) if head is None else rows[:, head]
        out[q] = w[np.arange(len(q)), k]
        return out

    def top_keys(self, i: int, layer: int, head: int | None, k: int = TOP) -> list[tuple[int, float]]:
        w = self.looked_at(i, layer, head)
        order = np.argsort(-w, kind="stable")[:k]
        return [(int(j), float(w[j])) for j in order if w[j] > 0]


def _top(logits: torch.Tensor, k: int) -> list[tuple[int, float]]:
    p = torch.softmax(logits.float(), dim=-1)
    values, ids = p.topk(min(k, p.numel()))
    return [(int(i), float(v)) for i, v in zip(ids, values)]


def head_scores(scene_rows: np.ndarray, seen_from: np.ndarray, ids: list[int]) -> list[HeadLabel]:
    """lab heads' scores of every head on this text, from the rows of every query but the first:
    previous: weight on the token before; induction: weight on the tokens that followed earlier occurrences
    of the query's token (queries with one in what they see); distance and entropy as lab heads measures
    them; the role by lab heads' own rule (inspect.role)."""
    n, L, H, C = scene_rows.shape
    ids_a = np.asarray(ids)
    q = np.arange(1, n)
    back = q[:, None] - (seen_from[q][:, None] + np.arange(C)[None, :])  # (n-1, C) how far back each key is
    valid = back >= 0
    # induction targets: key k (absolute j) with ids[j - 1] == ids[query], j - 1 >= seen_from, j < query
    keys = seen_from[q][:, None] + np.arange(C)[None, :]
    prev_tok = np.where((keys - 1 >= seen_from[q][:, None]) & valid, ids_a[np.clip(keys - 1, 0, n - 1)], -1)
    ind_mask = (prev_tok == ids_a[q][:, None]) & (keys < q[:, None]) & valid
    has_ind = ind_mask.any(axis=1)
    prev_k = (q - 1 - seen_from[q]).astype(int)
    seen = (q - seen_from[q] + 1).astype(float)
    uniform_entropy = float(np.mean(np.log2(seen))) if len(q) else 0.0  # (a one-token text has no query)
    flat = scene_rows[q].astype(np.float64)  # (n-1, L, H, C)
    out = []
    for layer in range(L):
        for head in range(H):
            w = np.where(valid, flat[:, layer, head], 0.0)  # (n-1, C)
            prev = float(w[np.arange(len(q)), prev_k].mean()) if len(q) else 0.0
            ind = float((w * ind_mask)[has_ind].sum(axis=1).mean()) if has_ind.any() else 0.0
            dist = float((w * np.clip(back, 0, None)).sum(axis=1).mean()) if len(q) else 0.0
            ent = entropy(w)
            common, share = common_offset(q - (seen_from[q] + w.argmax(axis=1)) if len(q) else np.zeros(0, int))
            out.append(
                HeadLabel(layer, head, role(prev, ind, dist, ent, uniform_entropy), prev, ind, dist, ent, common, share)
            )
    return out


def attention_scene(
    model, tokenizer, ids: list[int], keep: np.ndarray | None = None, reads: list[int] | None = None
) -> AttentionScene:
    start = max(0, len(ids) - MAX_TOKENS)
    reads = ids[start:] if reads is None else reads[start:]
    ids, keep = ids[start:], keep[start:] if keep is not None else None
    context = model.cfg.context
    seen_from = window_of(len(ids), context)
    was_training = model.training
    model.eval()
    try:
        rows, logits = _attention_windows(model, reads, seen_from)
    finally:
        model.train(was_training)
    nats = token_nats(logits, ids)
    chars = _scored_chars(tokenizer, ids, keep)
    labels = head_scores(rows, seen_from, reads)  # what the heads do with what they read
    return AttentionScene(ids, reads, start, seen_from, rows, logits, nats, labels, chars, context, keep=keep)


@torch.no_grad()
def _attention_windows(model, ids: list[int], seen_from: np.ndarray):
    """Every token's attention rows (n, L, H, C) and next-token logits (n, vocab), from the window each is
    read in: its attention as probes.capture_attention reads it, its logits from the model's forward pass."""
    n, context = len(ids), model.cfg.context
    rows, logits = None, torch.zeros(n, model.cfg.vocab_size)
    device = next(model.parameters()).device
    for a in windows(n, context):
        mine = np.nonzero(seen_from == a)[0]  # the tokens read in this window
        window = ids[a : a + context]
        _, w = capture_attention(model, window)  # (L, H, T, T); the window fits: offset 0
        if rows is None:
            rows = np.zeros((n, *w.shape[:2], min(n, context)), dtype=np.float32)
        rows[mine, :, :, : w.shape[-1]] = w[:, :, mine - a, :].transpose(2, 0, 1, 3)
        out = model(torch.tensor([window], dtype=torch.long, device=device))[0][0]  # (T, vocab)
        logits[mine] = out[mine - a].float().cpu()
    return rows, logits


@torch.no_grad()
def knock_out(model, scene: AttentionScene, layer: int, head: int) -> Knockout:
    """The text re-read with one head taken out, as lab ablate does it (the family's knock_out)."""
    if (layer, head) in scene.knockouts:
        return scene.knockouts[(layer, head)]
    n, context = len(scene.ids), scene.context
    logits = torch.zeros_like(scene.logits)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        with knocked(model, Part(layer, model.PART, (head,))):
            for a in windows(n, context):
                mine = np.nonzero(scene.seen_from == a)[0]
                idx = torch.tensor([scene.reads[a : a + context]], dtype=torch.long, device=device)
                logits[mine] = model(idx)[0][0][mine - a].float().cpu()
    finally:
        model.train(was_training)
    return _knocked(scene, layer, head, token_nats(logits, scene.ids))


def _knocked(scene, layer: int, part: int, nats: np.ndarray) -> Knockout:
    """A knock-out's result from the text's nats without the part, kept in the scene."""
    rise = bits_per_char(nats - scene.nats)
    result = Knockout(layer, part, _targets_bpc(nats, scene.chars, scene.keep), scene.bpc, rise)
    scene.knockouts[(layer, part)] = result
    return result


# ---- LSTM / GRU -----------------------------------------------------------------------------------------

BEHAVIOURS = {
    "changes": "its gates change most over the text (what charlm gates shows first)",
    "saturated": "its gates sit near 0 or 1 most of the time",
    "quotes": "it differs most inside quotes from outside (' \" “ ” ‘ ’ « », as the text uses them)",
    "brackets": "it differs most inside brackets from outside (( ) [ ] { } < >)",
    "line": "it follows the position in the line (chars since the last newline)",
}
SYNONYMS = {  # other words a student may search for
    "newline": "line", "newlines": "line", "column": "line", "position": "line", "quote": "quotes",
    "quotation": "quotes", "quoted": "quotes", "bracket": "brackets", "parentheses": "brackets", "parens": "brackets",
    "change": "changes", "saturation": "saturated",
}  # fmt: skip
QUOTES = {'"': '"', "'": "'", "“": "”", "‘": "’", "«": "»", "„": "“"}  # opening mark: its closing one
APOSTROPHES = "'’"  # between two letters (don't, o'er) an apostrophe, not a quote
BRACKETS = {"(": ")", "[": "]", "{": "}", "<": ">"}


def find_behaviour(query: str) -> str:
    """The behaviour a search names: its name, a synonym (newline: line), or the start of one; a leading / is
    ignored (typed as in chat). ConfigError naming them all otherwise."""
    q = query.strip().lower().lstrip("/").strip()
    if q:
        for word in (q, SYNONYMS.get(q)):
            if word in BEHAVIOURS:
                return word
        found = [b for b in BEHAVIOURS if b.startswith(q)] + [SYNONYMS[w] for w in SYNONYMS if w.startswith(q)]
        if found:
            return found[0]
    raise ConfigError(f"no behaviour '{query.strip()}': search for one of {', '.join(BEHAVIOURS)} (or newline)")


@dataclass
class GateScene(Predicted):
    """An LSTM/GRU on a text: every layer's gates and states at every token, its predictions, its surprisal."""

    ids: list[int]  # the text shown and predicted
    reads: list[int]  # what the model reads of it: ids, or a lab run's filled input (Trained)
    start: int  # the trace starts at token `start` of the text, from a fresh state
    kind: str  # "lstm" or "gru"
    traces: list  # probes.LayerTrace per layer; tensors (1, n, hidden)
    logits: torch.Tensor  # (n, vocab)
    nats: np.ndarray  # (n - 1,)
    chars: int
    texts: list[str]  # each token's text (for the behaviour search)
    knockouts: dict = field(default_factory=dict)  # (layer, unit) -> Knockout
    keep: np.ndarray | None = None  # (n - 1,) the targets scored (a lab run's trained positions); None: all

    @property
    def layers(self) -> int:
        return len(self.traces)

    @property
    def hidden(self) -> int:
        return self.traces[0].h.shape[-1]

    @property
    def quantities(self) -> tuple[str, ...]:
        """What can shade the text: each gate, then the cell state (LSTM) and the hidden state."""
        return (*self.traces[0].gates, *(("cell state",) if self.has_cell else ()), "hidden")

    @property
    def has_cell(self) -> bool:
        """An LSTM's cell state beside its hidden state (a GRU has only the hidden state)."""
        return self.traces[0].c is not None

    def values(self, layer: int, quantity: str) -> np.ndarray:
        """(n, hidden) of one quantity of one layer."""
        t = self.traces[layer]
        v = {"cell state": t.c, "hidden": t.h}.get(quantity)
        v = t.gates[quantity] if v is None else v
        return v[0].float().numpy()

    def rank_units(self, layer: int, behaviour: str) -> tuple[list[int], np.ndarray]:
        """Units of a layer, best first by a behaviour (BEHAVIOURS), and each unit's score. ConfigError when the
        text has nothing to rank by (no quotes, no brackets, or too few tokens)."""
        trace = self.traces[layer]
        H = self.hidden
        if len(self.ids) < 2:  # one step: no change, no spread, nothing inside or outside
            if behaviour != "changes":
                raise ConfigError("one token: a unit's behaviour needs a longer text (e: edit)")
            return list(range(H)), np.zeros(H)
        state = (trace.c if trace.c is not None else trace.h)[0].float().numpy()  # (n, H): the memory
        if behaviour == "changes":
            order = choose_units(trace, H)
            score = sum(v[0].float().std(dim=0) for name, v in trace.gates.items() if name not in CANDIDATES).numpy()
            return order, score
        if behaviour == "saturated":
            gates = [v[0].float().numpy() for name, v in trace.gates.items() if name not in CANDIDATES]
            score = np.mean([((g < 0.1) | (g > 0.9)).mean(axis=0) for g in gates], axis=0)
        elif behaviour == "line":
            score = np.abs(_correlation(state, _text_signal(self.texts, behaviour)[0]))
        elif behaviour in ("quotes", "brackets"):
            inside, marks = _text_signal(self.texts, behaviour)
            inside = inside > 0
            if not inside.any():
                raise ConfigError(f"this text has no {behaviour} ({' '.join(_MARKS[behaviour])}): units not ranked")
            if inside.all():
                raise ConfigError(f"the whole text is inside {behaviour}: nothing outside to compare with")
            gap = state[inside].mean(axis=0) - state[~inside].mean(axis=0)
            score = np.abs(gap) / (state.std(axis=0) + 1e-6)
        else:
            raise ConfigError(f"no unit behaviour '{behaviour}': choose one of {', '.join(BEHAVIOURS)}")
        order = [int(u) for u in np.argsort(-score, kind="stable")]
        return order, score

    def found(self, behaviour: str) -> str:
        """What a search found in the text: ', inside ' and “ quotes: 40 of 300 tokens' (empty for the
        behaviours read off the gates)."""
        if behaviour not in ("quotes", "brackets") or len(self.ids) < 2:
            return ""
        inside, marks = _text_signal(self.texts, behaviour)
        return f"; inside {' '.join(marks)} {behaviour}: {int((inside > 0).sum())} of {len(inside)} tokens"


def _correlation(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Pearson correlation of each column of x (n, H) with y (n,); 0 where either is constant."""
    xc, yc = x - x.mean(axis=0), y - y.mean()
    den = np.sqrt((xc**2).sum(axis=0) * (yc**2).sum())
    return np.where(den > 0, (xc * yc[:, None]).sum(axis=0) / np.where(den > 0, den, 1), 0.0)


_MARKS = {"quotes": [*QUOTES, *"”’»"], "brackets": [*BRACKETS, *BRACKETS.values()]}


def _text_signal(texts: list[str], behaviour: str) -> tuple[np.ndarray, list[str]]:
    """Per token, as its first character finds it: inside quotes (1/0), inside brackets (1/0), or characters
    since the last newline; and the marks that opened a quote or bracket, in order of first use. A quote is
    any mark of QUOTES, closed by its own closing mark; ' or ’ between two letters is an apostrophe."""
    out = np.zeros(len(texts))
    text = "".join(texts)
    used: list[str] = []
    quote, brackets, col, at = None, [], 0, 0
    for t, piece in enumerate(texts):
        out[t] = {"quotes": float(quote is not None), "brackets": float(bool(brackets)), "line": float(col)}[behaviour]
        for ch in piece:
            before, after = text[at - 1 : at], text[at + 1 : at + 2]
            at += 1
            col = 0 if ch == "\n" else col + 1
            if ch in APOSTROPHES and before.isalpha() and after.isalpha():
                continue
            if quote is not None and ch == QUOTES[quote]:
                quote = None
            elif quote is None and ch in QUOTES and not (ch in APOSTROPHES and before.isalnum()):
                quote = ch
                used += [ch] if behaviour == "quotes" and ch not in used else []
            elif ch in BRACKETS:
                brackets.append(ch)
                used += [ch] if behaviour == "brackets" and ch not in used else []
            elif brackets and ch == BRACKETS[brackets[-1]]:
                brackets.pop()
    return out, used


@torch.no_grad()
def gate_scene(
    model, tokenizer, ids: list[int], keep: np.ndarray | None = None, reads: list[int] | None = None
) -> GateScene:
    start, traces = trace_gates(model, ids if reads is None else reads, MAX_GATE_TOKENS)
    reads = ids[start:] if reads is None else reads[start:]
    ids, keep = ids[start:], keep[start:] if keep is not None else None
    logits = _read(model, reads)
    nats = token_nats(logits, ids)
    texts = [tokenizer.token_bytes(t).decode("utf-8", errors="replace") for t in ids]
    chars = _scored_chars(tokenizer, ids, keep)
    return GateScene(ids, reads, start, model.cfg.kind, traces, logits, nats, chars, texts, keep=keep)


def _read(model, ids: list[int]) -> torch.Tensor:
    """(n, vocab) logits of the model reading ids from a fresh state, in eval mode."""
    was_training = model.training
    model.eval()
    try:
        idx = torch.tensor([ids], dtype=torch.long, device=next(model.parameters()).device)
        return model(idx)[0][0].float().cpu()
    finally:
        model.train(was_training)


@torch.no_grad()
def zero_unit(model, scene: GateScene, layer: int, unit: int) -> Knockout:
    """The text re-read with one unit's hidden state held at 0 at every step, as lab ablate does it (the
    family's knock_out)."""
    if (layer, unit) in scene.knockouts:
        return scene.knockouts[(layer, unit)]
    with knocked(model, Part(layer, model.PART, (unit,))):
        logits = _read(model, scene.reads)
    return _knocked(scene, layer, unit, token_nats(logits, scene.ids))


# ---- the command -----------------------------------------------------------------------------------------

DEFAULT_CHARS = 600  # no text given: this much of the start of the corpus the run was trained on
MAX_CORPUS_CHARS = 1 << 20  # a lab run's corpus.txt read to find the text explored in it (its trained positions)


def load(ckpt: str, text: str | None, opts: ExploreOptions):
    """(the checkpoint, the tokens of the text to explore): TEXT, else --prompt / --prompt-file / stdin, else
    the start of the run's own corpus when it is still there."""
    from charlm.commands.generate import read_prompt
    from charlm.storage import checkpoint

    if text is not None and (opts.prompt is not None or opts.prompt_file is not None):
        raise ConfigError("give the text once: as the TEXT argument, --prompt or --prompt-file")
    if text == "" or opts.prompt == "":
        raise ConfigError("the text is empty: give the text to explore")
    body = text if text is not None else read_prompt(opts)
    ck = checkpoint.load(ckpt)
    if not body:
        body = corpus_start(ck)
    ids = ck.tokenizer.encode(body, unknown=opts.unknown)
    if not ids:
        raise ConfigError("the text has no characters the model knows")
    return ck, ids


def corpus_start(ck) -> str:
    """The first DEFAULT_CHARS characters of the corpus a run was trained on (a lab run's corpus.txt, else the
    file the checkpoint names), or a clear error asking for a text."""
    kept = ck.path.parent / "corpus.txt"
    where = kept if kept.is_file() else ck.saved.corpus.path if ck.saved.corpus else None
    try:
        if where:
            with open(where, encoding="utf-8", errors="replace") as f:
                if body := f.read(DEFAULT_CHARS):
                    return body
    except OSError:
        pass
    raise ConfigError(
        "no text to explore: give one, e.g. charlm explore RUN 'To be, or not to be' (or --prompt-file FILE)"
    )


@dataclass
class Trained:
    """How a lab run was trained on a text of its own corpus: which targets it predicts, and what its model reads."""

    keep: np.ndarray  # (n - 1,) the targets it was trained to predict
    reads: list[int]  # (n,) the text with the run's filler in place of each target where it has one, else the text


def trained(ck, ids: list[int]) -> Trained | None:
    """Which targets of ids a lab run was trained to predict and what its model reads of them, where the text is
    part of the run's own corpus.txt (its start, explored by default): the run's targets mask (and filler:
    data.model_input) at the text's first occurrence there. None otherwise (every position is scored, the text
    read as it is)."""
    kept = ck.path.parent / "corpus.txt"
    if not kept.is_file() or len(ids) < 2:
        return None
    text = ck.tokenizer.decode(ids)
    with open(kept, encoding="utf-8", errors="replace", newline="") as f:
        body = f.read(MAX_CORPUS_CHARS)
    at = body.find(text)
    if at < 0:
        return None
    before = ck.tokenizer.encode(body[:at], unknown="drop")
    mask = trained_positions(kept, before + ids, ck.tokenizer)
    if mask is None or len(before) != at or not mask[at + 1 :].any():
        return None
    return Trained(mask[at + 1 :], model_input(ids, mask[at:], filler(kept, ck.tokenizer)))


def scene(model, tokenizer, ids: list[int], lab: Trained | None = None):
    """Everything the explorer shows of a model on a text (AttentionScene or GateScene); lab: how a lab run was
    trained on it (trained(ck, ids): its targets scored, its filled input read), None: every target scored, the
    text read as it is."""
    if not ids:
        raise ConfigError("there is no text to explore: give one (charlm explore RUN 'some text')")
    keep, reads = (lab.keep, lab.reads) if lab is not None else (None, None)
    if "attention" in model.capabilities:
        return attention_scene(model, tokenizer, ids, keep, reads)
    if "gates" in model.capabilities:
        return gate_scene(model, tokenizer, ids, keep, reads)
    raise ConfigError(f"explore: {lacks(model, 'attention')} and no gates to trace")


def knock(model, s, layer: int, which: int) -> Knockout:
    """Take out a head (Transformer) or a unit (LSTM/GRU) and re-read the text."""
    if "knock_out" not in model.capabilities:
        raise ConfigError(f"explore: {lacks(model, 'knock_out')}")
    return knock_out(model, s, layer, which) if isinstance(s, AttentionScene) else zero_unit(model, s, layer, which)
