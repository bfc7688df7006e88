"""LSTM and GRU language models: embedding -> torch.nn.LSTM / torch.nn.GRU -> linear head.

The recurrence runs in PyTorch's fused kernels (never a Python loop over time steps). For generation
the recurrent state is the cache: pass an RNNState and the layer carries (h, c) across calls.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn as nn
import torch.nn.functional as F

from charlm.config import ModelConfig


class RNNState:
    """The LSTM's (h, c) or the GRU's h, carried from one call to the next; `pos` counts tokens seen."""

    def __init__(self):
        self.state = None
        self.pos = 0

    def reset(self) -> None:
        self.state = None
        self.pos = 0


class RNN(nn.Module):
    capabilities = frozenset({"gates"})  # gate and cell-state traces (models/probes.py)
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
        x, state = self.rnn(x, cache.state if cache is not None else None)  # (B, T, C)
        if cache is not None:
            cache.state = state
            cache.pos += idx.size(1)
        logits = self.head(self.drop(x))  # (B, T, vocab)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.reshape(-1), ignore_index=-1)
        return logits, loss


@contextmanager
def native_rnn_kernels():
    """PyTorch's own LSTM/GRU kernels instead of oneDNN's inside the block. For one token at a time oneDNN
    carries a fixed cost that dwarfs the step: a 2 × 256 LSTM streams a token in ~1.5 ms with the native
    kernel against ~4.3 ms (benchmarks/RESULTS.md, "Generation"). Longer inputs (a prompt, training) keep oneDNN."""
    enabled = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = False
    try:
        yield
    finally:
        torch.backends.mkldnn.enabled = enabled
