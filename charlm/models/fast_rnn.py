"""The LSTM's and GRU's one-token step in numpy: what generation runs for each new token when it can (batch 1,
CPU, float32, eval mode), as models/fast_decode.py does for the Transformer.

Why: one token through torch's nn.LSTM costs ~650 µs at 2 × 256 (dispatch, and the RNN kernel's set-up for a
sequence of one), where the arithmetic is a few matrix-vector products: numpy does the step in a fraction of
that (benchmarks/bench_rnn_step.py; RESULTS.md, "Speed, round five").

FastRNN(model, cache).step_np(token) -> logits (vocab,) is model(token, cache=cache) for one token. It reads the
weights through zero-copy views and carries the state in the cache's own (h, c) tensors, updated in place, so
torch and numpy steps can follow each other on one RNNState (a prompt fed by torch, the tokens after it by
numpy). The step's scratch arrays are its own, made once.

The first layer's input part depends on the token alone: W_ih e + b_ih for every token of the vocabulary is one
table (vocab × gates, made with the step, while it is at most TABLE_BYTES), and a step reads its row instead of
W_ih (a quarter of the weights a two-layer step reads; the weights do not fit a 2 MB L2 at 2 × 256). The table is
the one copy: `current()` is fast_decode's `unchanged` (no in-place update of any parameter since the step was
made), so an optimizer step or a load_state_dict makes the Streamer build a new step.

PyTorch's equations (gate order as nn.LSTM / nn.GRU store them):
  LSTM: i, f, g, o = W_ih x + b_ih + W_hh h + b_hh;  c = σ(f) c + σ(i) tanh(g);  h = σ(o) tanh(c)
  GRU:  r, z = σ(W_i[rz] x + b_i[rz] + W_h[rz] h + b_h[rz]);  n = tanh(W_in x + b_in + r (W_hn h + b_hn));
        h = (1 - z) n + z h
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn

from charlm.models.fast_decode import unchanged, weights_version
from charlm.models.rnn import RNN, RNNState

TABLE_BYTES = 4 << 20  # the first layer's input table, at most: a char or 1,024-token BPE vocabulary at 2 × 256


class FastRNN:
    def __init__(self, model: RNN, cache: RNNState):
        self.model, self.cache, self.lstm = model, cache, model.cfg.kind == "lstm"
        self.weight_at = model.tok_emb.weight.data_ptr()
        self.params = list(model.parameters())  # listed once (fast_decode.unchanged)
        self.version = weights_version(self.params)
        rnn, L, H = model.rnn, model.rnn.num_layers, model.rnn.hidden_size
        self.tok_emb, self.head_w, self.head_b = _np(model.tok_emb.weight), _np(model.head.weight), _np(model.head.bias)
        self.layers = [
            tuple(_np(getattr(rnn, f"{name}_l{l}")) for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"))
            for l in range(L)
        ]
        gates = (4 if self.lstm else 3) * H
        self.table = None  # (vocab, gates): tok_emb W_ih^T + b_ih of layer 0, when it is small enough
        if model.tok_emb.weight.shape[0] * gates * 4 <= TABLE_BYTES:
            with torch.no_grad():
                self.table = torch.addmm(rnn.bias_ih_l0, model.tok_emb.weight, rnn.weight_ih_l0.t()).numpy()
        self.gi, self.gh = np.empty(gates, np.float32), np.empty(gates, np.float32)  # input's and state's parts
        self.t = np.empty(H, np.float32)
        self.state: tuple[torch.Tensor, ...] | None = None  # the cache's state tensors that h, c below view
        self.L, self.H = L, H

    @staticmethod
    def supports(model: nn.Module) -> bool:
        """The conditions under which step_np computes the logits forward() would."""
        if not isinstance(model, RNN) or model.training:
            return False
        w = model.tok_emb.weight
        return w.dtype == torch.float32 and w.is_cpu

    def current(self) -> bool:
        """Whether the views and the table still stand for the model's weights (and it is still in eval mode)."""
        return unchanged(self)

    def _state(self) -> tuple[np.ndarray, np.ndarray | None]:
        """Views (L, H) of the cache's h (and c): zeros for a fresh cache; new views after a torch call."""
        st = self.cache.state
        if st is None:
            zeros = [torch.zeros(self.L, 1, self.H) for _ in range(2 if self.lstm else 1)]
            st = self.cache.state = tuple(zeros) if self.lstm else zeros[0]
        if st is not self.state:
            self.state = st
            h, c = st if self.lstm else (st, None)
            self.h, self.c = _np(h)[:, 0], None if c is None else _np(c)[:, 0]
        return self.h, self.c

    def step_np(self, token: int, trace: list | None = None) -> np.ndarray:
        """Logits (vocab,) after feeding `token`. trace: when given, gets each layer's new h (and the LSTM's c)."""
        hs, cs = self._state()
        gi, gh, t, H = self.gi, self.gh, self.t, self.H
        x = self.tok_emb[token]
        for l, (w_ih, w_hh, b_ih, b_hh) in enumerate(self.layers):
            h = hs[l]
            if l == 0 and self.table is not None:
                gi[:] = self.table[token]
            else:
                w_ih.dot(x, out=gi)
                gi += b_ih
            w_hh.dot(h, out=gh)
            gh += b_hh
            if self.lstm:
                gi += gh  # i, f, g, o before their nonlinearities
                np.tanh(gi[2 * H : 3 * H], out=t)  # tanh(g)
                _sigmoid(gi)  # σ of all four (g's is not used)
                c = cs[l]
                c *= gi[H : 2 * H]  # σ(f) c
                t *= gi[:H]  # σ(i) tanh(g)
                c += t
                np.tanh(c, out=t)
                np.multiply(gi[3 * H :], t, out=h)  # σ(o) tanh(c)
            else:
                rz = gi[: 2 * H]
                rz += gh[: 2 * H]
                _sigmoid(rz)
                np.multiply(gh[2 * H :], rz[:H], out=t)  # r (W_hn h + b_hn)
                t += gi[2 * H :]
                np.tanh(t, out=t)  # n
                h -= t  # h = n + z (h - n)
                h *= rz[H:]
                h += t
            if trace is not None:
                trace.append(h.copy())
                if self.lstm:
                    trace.append(cs[l].copy())
            x = h
        self.cache.pos += 1
        logits = self.head_w.dot(x)
        logits += self.head_b
        return logits


def _sigmoid(x: np.ndarray) -> None:
    """x = σ(x) = (1 + tanh(x / 2)) / 2, in place (no overflow, unlike 1 / (1 + exp(-x)))."""
    x *= 0.5
    np.tanh(x, out=x)
    x *= 0.5
    x += 0.5


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().numpy()  # shares memory with the tensor
