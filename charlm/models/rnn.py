"""LSTM and GRU language models: embedding -> torch.nn.LSTM / torch.nn.GRU -> linear head.

The recurrence runs in PyTorch's fused kernels (never a Python loop over time steps). For generation
the recurrent state is the cache: pass an RNNState and the layer carries (h, c) across calls.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import replace

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from charlm.config import ModelConfig
from charlm.errors import ConfigError
from charlm.models import Part
from charlm.models.probes import LayerTrace, clamp, trace_rnn, zero_units
from charlm.models.shapes import GATES


class RNNState:
    """The LSTM's (h, c) or the GRU's h, carried from one call to the next; `pos` counts tokens seen."""

    def __init__(self):
        self.state = None
        self.pos = 0

    def reset(self) -> None:
        self.state = None
        self.pos = 0


class RNN(nn.Module):
    capabilities = frozenset({"gates", "knock_out", "prune"})  # gate traces, units knocked out and pruned
    PART = "unit"
    ACTIVATION_BYTES = 64  # fp32, measured as peak RSS on CPU (55-64)
    window = None  # the state carries everything seen, with no length limit
    rolling_cache = False

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        layer = {"lstm": nn.LSTM, "gru": nn.GRU}[cfg.kind]
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.rnn = layer(
            cfg.d_model,
            cfg.hidden_size,
            num_layers=cfg.n_layers,
            batch_first=True,
            dropout=cfg.dropout if cfg.n_layers > 1 else 0.0,
        )
        self.head = nn.Linear(cfg.hidden_size, cfg.vocab_size)
        self._knocked: tuple[Part, str] | None = None  # knock_out's part and mode, while inside it
        if cfg.kind == "lstm":  # forget-gate bias 1: remember by default at the start of training
            for name, p in self.rnn.named_parameters():
                if name.startswith("bias_ih"):
                    with torch.no_grad():
                        p[cfg.hidden_size : 2 * cfg.hidden_size].fill_(1.0)

    def hidden_matrices(self) -> list[nn.Parameter]:
        return [p for p in self.rnn.parameters() if p.dim() == 2]

    def decode(self, ids: list[int], cache: RNNState) -> torch.Tensor:
        """Logits (vocab,) for the token after ids, carried on from cache's state."""
        idx = torch.tensor([ids], dtype=torch.long, device=self.tok_emb.weight.device)
        if len(ids) > 1:
            return self(idx, cache=cache)[0][0, -1]
        with native_rnn_kernels():
            return self(idx, cache=cache)[0][0, -1]

    def new_cache(self, batch_size: int = 1) -> RNNState:
        return RNNState()  # the layer sizes its (h, c) to the batch on the first call

    def forward(self, idx, targets=None, cache: RNNState | None = None):
        x = self.drop(self.tok_emb(idx))  # (B, T, C)
        if self._knocked is not None:
            if cache is not None:
                raise ValueError("a knocked-out RNN reads from a fresh state: no cache")
            x, state = self._knocked_out(x), None
        else:
            x, state = self.rnn(x, cache.state if cache is not None else None)  # (B, T, C)
        if cache is not None:
            cache.state = state
            cache.pos += idx.size(1)
        logits = self.head(self.drop(x))  # (B, T, vocab)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.reshape(-1), ignore_index=-1)
        return logits, loss

    # ---- what can be read off it and done to it (models/__init__.py's capabilities) ----

    @staticmethod
    def parts(cfg: ModelConfig) -> int:
        return cfg.hidden_size

    def trace(self, idx: torch.Tensor) -> list[LayerTrace]:
        """Every layer's gates and states reading idx (B, T) from a fresh state (probes.trace_rnn)."""
        return trace_rnn(self.rnn, self.tok_emb(idx))

    @contextmanager
    def knock_out(self, part: Part, mode: str = "zero"):
        """Inside: model(idx) reads with the part taken out at every step: units' hidden states held at 0
        (zero) or at their mean over the positions read (mean), or one gate held at part.value. The layer
        is stepped in Python (probes.trace_rnn), the layers below and above run on PyTorch's kernel."""
        if part.kind not in ("unit", "gate"):
            raise ValueError(f"an RNN's parts are units and gates, not {part.kind}s")
        self._knocked = (part, mode)
        try:
            yield
        finally:
            self._knocked = None

    def _knocked_out(self, x: torch.Tensor) -> torch.Tensor:
        part, mode = self._knocked
        layer, n = part.layer, self.cfg.n_layers
        below = self._layers(0, layer)(x)[0] if layer else x
        units = list(part.which) or list(range(self.cfg.hidden_size))
        held = self._layers(layer, layer + 1)(below)[0][..., units].mean(dim=(0, 1)) if mode == "mean" else 0.0
        intervene = clamp(0, part.gate, part.value) if part.kind == "gate" else zero_units(0, units, held)
        h = trace_rnn(self._layers(layer, layer + 1), below, intervene=intervene)[0].h
        return self._layers(layer + 1, n)(h)[0] if layer + 1 < n else h

    def _layers(self, first: int, last: int) -> nn.Module:
        """Layers first..last-1 of the nn.LSTM/GRU as a module of their own (the same weights)."""
        rnn = self.rnn
        part = type(rnn)(rnn.input_size if first == 0 else rnn.hidden_size, rnn.hidden_size, num_layers=last - first,
                         bias=rnn.bias, batch_first=True)  # fmt: skip
        part.load_state_dict(
            {
                name.replace(f"_l{k + first}", f"_l{k}"): p
                for k in range(last - first)
                for name, p in rnn.named_parameters()
                if name.endswith(f"_l{k + first}")
            }
        )
        return part.to(self.tok_emb.weight.device).eval()

    @torch.no_grad()
    def importance(self, idx: torch.Tensor) -> np.ndarray:
        """(layers, hidden): what each unit sends on, measured on idx (B, T + 1): the RMS of its output h over
        the text times the norm of its outgoing weights (its column of the layer's own recurrence, and of the
        next layer's input or the head). On the tiny LSTM this ranking drops units at half the cost of a random
        choice, where the gradient estimate (|dL/dm| for a factor m on the unit's gate rows) and single-unit
        knockouts did no better than random (docs/compress.md)."""
        cfg, rnn = self.cfg, self.rnn
        out = np.zeros((cfg.n_layers, cfg.hidden_size))
        for layer, trace in enumerate(self.trace(idx[:, :-1])):
            rms = trace.h.reshape(-1, cfg.hidden_size).pow(2).mean(0).sqrt()
            onward = rnn.get_parameter(f"weight_ih_l{layer + 1}") if layer + 1 < cfg.n_layers else self.head.weight
            norm = (rnn.get_parameter(f"weight_hh_l{layer}").pow(2).sum(0) + onward.pow(2).sum(0)).sqrt()
            out[layer] = (rms * norm).cpu().numpy()
        return out

    @staticmethod
    def prune(cfg: ModelConfig, state: dict, importance: np.ndarray, k: int) -> tuple[ModelConfig, dict, list]:
        """Without the k least important hidden units of each layer (nn.LSTM has one hidden size), sliced out
        of its matrices: (config, state dict, [(layer, unit), ...]). Slicing a unit out is zeroing its gate rows
        (its gates then sit at 0.5 and its candidate at 0, so its cell and output stay 0)."""
        H = cfg.hidden_size
        if not 0 <= k < H:
            raise ConfigError(f"a layer has {H} units: drop fewer than that, not {k}")
        state, dropped, before = dict(state), [], None
        for layer in range(cfg.n_layers):
            gone = set(int(u) for u in np.argsort(importance[layer], kind="stable")[:k])
            kept = [u for u in range(H) if u not in gone]
            dropped += [(layer, u) for u in sorted(gone)]
            rows = gate_rows(cfg, kept)
            ih, hh = state[f"rnn.weight_ih_l{layer}"][rows], state[f"rnn.weight_hh_l{layer}"][rows][:, kept]
            state[f"rnn.weight_ih_l{layer}"] = (ih if before is None else ih[:, before]).contiguous()
            state[f"rnn.weight_hh_l{layer}"] = hh.contiguous()
            for kind in ("bias_ih", "bias_hh"):
                state[f"rnn.{kind}_l{layer}"] = state[f"rnn.{kind}_l{layer}"][rows].contiguous()
            before = kept
        state["head.weight"] = state["head.weight"][:, before].contiguous()
        return replace(cfg, hidden=H - k), state, dropped


def gate_rows(cfg: ModelConfig, units) -> torch.Tensor:
    """The rows of a layer's stacked gate matrices (i, f, g, o or r, z, n) that belong to `units`."""
    H = cfg.hidden_size
    return torch.tensor([g * H + u for g in range(GATES[cfg.kind]) for u in units], dtype=torch.long)


@contextmanager
def native_rnn_kernels():
    """PyTorch's own LSTM/GRU kernels instead of oneDNN's inside the block. For one token at a time oneDNN
    carries a fixed cost that dwarfs the step: a 2 × 256 LSTM streams a token in ~1.5 ms with the native
    kernel against ~4.3 ms (benchmarks/HISTORY.md, "Generation"). Longer inputs (a prompt, training) keep oneDNN."""
    enabled = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = False
    try:
        yield
    finally:
        torch.backends.mkldnn.enabled = enabled
