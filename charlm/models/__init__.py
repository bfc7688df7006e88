"""Every model honours one contract: forward(idx, targets=None, cache=None) -> (logits, loss),
and new_cache(batch_size) gives the object that carries its memory between generation steps.
FastDecoder is the Transformer's one-token step in numpy, which generation uses where it can."""

from __future__ import annotations

import torch.nn as nn

from charlm.config import ModelConfig
from charlm.models.fast_decode import FastDecoder
from charlm.models.rnn import RNN, RNNState
from charlm.models.transformer import KVCache, Transformer

__all__ = ["build_model", "count_params", "FastDecoder", "KVCache", "RNNState", "RNN", "Transformer"]


def build_model(cfg: ModelConfig) -> nn.Module:
    cfg.validate()
    return Transformer(cfg) if cfg.kind == "transformer" else RNN(cfg)


def count_params(model: nn.Module) -> int:
    """Distinct parameters (a tied embedding counts once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
