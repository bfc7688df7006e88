"""Probes: numbers read off a model's forward pass, for the viewers (charlm attn / gates, chat's /attn and
/gates) and for experiments that score what a model learned. Nothing here draws or prints.

  capture_attention(model, ids) -> (offset, weights)   an attention family's weights (L, nh, T, T)
  head_stats(weights) -> [HeadStats]                   entropy, distance looked back, most common offset
  trace_gates(model, ids) -> (offset, [LayerTrace])    a gated family's gates and states, one trace per layer

Each reads the family's own trace(idx) (models/__init__.py); trace_rnn below is the LSTM/GRU's.

Gates: PyTorch's fused kernels return only the hidden states; to see the gates we re-run each layer's
equations in Python with the layer's own weights (torch.nn.LSTM / GRU docs):

  LSTM (weights stacked in the order i, f, g, o)
    i = σ(W_ii x + b_ii + W_hi h + b_hi)      input gate
    f = σ(W_if x + b_if + W_hf h + b_hf)      forget gate
    g = tanh(W_ig x + b_ig + W_hg h + b_hg)   candidate cell
    o = σ(W_io x + b_io + W_ho h + b_ho)      output gate
    c' = f * c + i * g,   h' = o * tanh(c')
  GRU (stacked r, z, n)
    r = σ(W_ir x + b_ir + W_hr h + b_hr)      reset gate
    z = σ(W_iz x + b_iz + W_hz h + b_hz)      update gate (1: keep the old state)
    n = tanh(W_in x + b_in + r * (W_hn h + b_hn))
    h' = (1 - z) * n + z * h

Layer l > 0 reads layer l-1's hidden states (the dropout between layers is off in eval).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn

from charlm.errors import ConfigError
from charlm.models.inspect import common_offset, entropy

MAX_GATE_TOKENS = 2048  # longer texts: the gates of the last ones (the Python loop is ~0.1 ms per step)

LSTM_GATES = ("input", "forget", "cell", "output")  # PyTorch's order: i, f, g, o
GRU_GATES = ("reset", "update", "new")  # r, z, n
CANDIDATES = ("cell", "new")  # the candidate values: no gates, left out when units are chosen by their gates
DEFAULT_UNITS = 8


@dataclass
class LayerTrace:
    """One layer over time. Every tensor is (B, T, hidden)."""

    gates: dict[str, torch.Tensor]  # LSTM: input, forget, cell (g), output; GRU: reset, update, new
    h: torch.Tensor  # hidden state after each step
    c: torch.Tensor | None  # LSTM cell state after each step (None for a GRU)


def trace_rnn(rnn: nn.LSTM | nn.GRU, x: torch.Tensor, state=None, intervene=None) -> list[LayerTrace]:
    """Re-run `rnn` (batch_first) on x (B, T, C) step by step; state as nn.LSTM/GRU takes it
    ((h0, c0) or h0, each (layers, B, hidden)), None for zeros. Returns one trace per layer.
    intervene(layer, name, value) -> value, when given, replaces each gate (by its name) and the new
    hidden state ("hidden") at every step before it is used: an ablation (e.g. the forget gate held at 1)."""
    if not rnn.batch_first or rnn.bidirectional or getattr(rnn, "proj_size", 0):
        raise ValueError("trace_rnn handles unidirectional, batch_first layers without projections")
    lstm = isinstance(rnn, nn.LSTM)
    B, T, _ = x.shape
    H = rnn.hidden_size
    if state is None:
        h0 = x.new_zeros(rnn.num_layers, B, H)
        c0 = x.new_zeros(rnn.num_layers, B, H)
    else:
        h0, c0 = state if lstm else (state, None)
    traces = []
    inp = x
    for layer in range(rnn.num_layers):
        w_ih, w_hh = getattr(rnn, f"weight_ih_l{layer}"), getattr(rnn, f"weight_hh_l{layer}")
        b_ih = getattr(rnn, f"bias_ih_l{layer}", None) if rnn.bias else None
        b_hh = getattr(rnn, f"bias_hh_l{layer}", None) if rnn.bias else None
        xw = inp @ w_ih.T + (b_ih if b_ih is not None else 0)  # (B, T, k*H): the input part, all steps at once
        h = h0[layer]
        c = c0[layer] if lstm else None
        hs, cs, gates = [], [], {name: [] for name in (LSTM_GATES if lstm else GRU_GATES)}
        for t in range(T):
            hw = h @ w_hh.T + (b_hh if b_hh is not None else 0)  # (B, k*H)
            if lstm:
                i, f, g, o = (xw[:, t] + hw).chunk(4, dim=-1)
                i, f, g, o = torch.sigmoid(i), torch.sigmoid(f), torch.tanh(g), torch.sigmoid(o)
                if intervene is not None:
                    i, f, g, o = (intervene(layer, name, v) for name, v in zip(LSTM_GATES, (i, f, g, o)))
                c = f * c + i * g
                h = o * torch.tanh(c)
                for name, v in zip(LSTM_GATES, (i, f, g, o)):
                    gates[name].append(v)
                cs.append(c)
            else:
                x_r, x_z, x_n = xw[:, t].chunk(3, dim=-1)
                h_r, h_z, h_n = hw.chunk(3, dim=-1)
                r = torch.sigmoid(x_r + h_r)
                z = torch.sigmoid(x_z + h_z)
                if intervene is not None:
                    r, z = intervene(layer, "reset", r), intervene(layer, "update", z)
                n = torch.tanh(x_n + r * h_n)
                if intervene is not None:
                    n = intervene(layer, "new", n)
                h = (1 - z) * n + z * h
                for name, v in zip(GRU_GATES, (r, z, n)):
                    gates[name].append(v)
            if intervene is not None:
                h = intervene(layer, "hidden", h)
            hs.append(h)
        stacked = {name: torch.stack(v, dim=1) for name, v in gates.items()}
        h_seq = torch.stack(hs, dim=1)
        traces.append(LayerTrace(stacked, h_seq, torch.stack(cs, dim=1) if lstm else None))
        inp = h_seq
    return traces


def clamp(layer: int, name: str, value: float):
    """trace_rnn's intervene: gate `name` of `layer` held at `value` at every step."""

    def intervene(l, n, v):
        return torch.full_like(v, value) if (l, n) == (layer, name) else v

    return intervene


def zero_units(layer: int, units: list[int], value=0.0):
    """trace_rnn's intervene: the hidden state of `units` of `layer` held at 0 (or at value: one a unit)."""

    def intervene(l, n, v):
        if (l, n) != (layer, "hidden"):
            return v
        v = v.clone()
        v[:, units] = value
        return v

    return intervene


@torch.no_grad()
def trace_gates(model, ids: list[int], max_tokens: int = MAX_GATE_TOKENS) -> tuple[int, list[LayerTrace]]:
    """The gates of a gated family's model reading the last `max_tokens` of ids from a fresh state, in eval mode;
    returns (offset, traces): traces[l] is layer l, position t of it is token offset+t."""
    if not ids:
        raise ConfigError("there is no text to look at yet: give a prompt first")
    offset = max(0, len(ids) - max_tokens)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        return offset, model.trace(torch.tensor([ids[offset:]], dtype=torch.long, device=device))
    finally:
        model.train(was_training)


def capture_attention(model, ids: list[int]) -> tuple[int, np.ndarray]:
    """Run the last `context` tokens of ids through the model once; return (offset, weights) where
    weights[l, h, i, j] is how much token offset+i attended to token offset+j in layer l, head h.
    The weights come from the model's own forward pass (its trace: the Transformer's explicit softmax path)."""
    if not ids:
        raise ConfigError("there is no text to look at yet: give a prompt first")
    offset = max(0, len(ids) - model.cfg.context)
    device = next(model.parameters()).device
    idx = torch.tensor([ids[offset:]], dtype=torch.long, device=device)
    was_training = model.training
    model.eval()  # no dropout on the weights we show
    try:
        with torch.no_grad():
            attn = model.trace(idx)
    finally:
        model.train(was_training)
    return offset, torch.stack([a[0] for a in attn]).float().cpu().numpy()  # (L, nh, T, T)


@dataclass
class HeadStats:
    layer: int
    head: int
    entropy: float  # bits, mean over query tokens
    distance: float  # tokens looked back, weighted by attention, mean over query tokens
    offset: int  # the most common distance to a row's strongest key (0: itself, 1: the token before)
    offset_share: float  # how often that is the strongest key


def head_stats(weights: np.ndarray) -> list[HeadStats]:
    """Statistics of every head from weights (L, nh, T, T), over all query tokens but the first (which
    can only look at itself)."""
    L, H, T, _ = weights.shape
    i = np.arange(T)
    back = np.clip(i[:, None] - i[None, :], 0, None)  # (T, T) how far back key j is from query i
    out = []
    for layer in range(L):
        for head in range(H):
            w = weights[layer, head, 1:].astype(np.float64)  # (T-1, T)
            dist = float(np.mean(np.sum(w * back[1:], axis=1))) if len(w) else 0.0
            common, share = common_offset(i[1:] - w.argmax(axis=1) if len(w) else np.zeros(0, dtype=int))
            ent = entropy(w)
            out.append(HeadStats(layer, head, ent, dist, common, share))
    return out


def choose_units(trace: LayerTrace, units: int | list[int] | None) -> list[int]:
    """Units to show: the given ones, or the `units` (default DEFAULT_UNITS) whose gates vary most over the
    text: the sum over the gates of each unit's standard deviation over time."""
    hidden = trace.h.shape[-1]
    if isinstance(units, list):
        if not units:
            raise ConfigError("give at least one unit")
        bad = [u for u in units if not 0 <= u < hidden]
        if bad:
            raise ConfigError(f"unit {bad[0]} is out of range: this layer has units 0..{hidden - 1}")
        return units
    units = min(DEFAULT_UNITS, hidden) if units is None else units
    if not 1 <= units <= hidden:
        raise ConfigError(f"units must be between 1 and {hidden} (this layer's size), got {units}")
    change = sum(v[0].float().std(dim=0) for name, v in trace.gates.items() if name not in CANDIDATES)  # (H,)
    return [int(u) for u in np.argsort(-change.cpu().numpy(), kind="stable")[:units]]


@dataclass
class Attention:
    """A transformer's attention on a text, and what the options chose of it."""

    ids: list[int]  # the text's tokens
    offset: int  # the model sees ids[offset:] (its last `context` tokens)
    weights: np.ndarray  # (layers, heads, T, T): weights[l, h, i, j] is how much token offset+i attended to offset+j
    stats: list[HeadStats]  # every head's entropy and distance
    layer: int  # the layer chosen (the last by default)
    head: int | None  # the head chosen (None: the mean over the layer's heads)
    focus: int | None  # the position the focus view is about (None: no focus view)

    @property
    def chosen(self) -> np.ndarray:
        """The (T, T) weights of the chosen head, or the mean over the chosen layer's heads."""
        w = self.weights[self.layer]
        return w[self.head] if self.head is not None else w.mean(axis=0)


@dataclass
class Gates:
    """One layer of an LSTM/GRU over a text: its gates and states, and the units chosen to show."""

    ids: list[int]
    offset: int  # the trace starts at token offset (a fresh state there)
    kind: str  # "lstm" or "gru"
    layer: int
    trace: LayerTrace
    units: list[int]
    chosen: bool  # the units were given, not picked by how much their gates change
