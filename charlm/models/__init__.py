"""The model families behind one interface. config.FAMILIES names each family's class; build_model makes one.

Every model honours one contract: forward(idx, targets=None, cache=None) -> (logits, loss), and
new_cache(batch_size) gives the object that carries its memory between generation steps. Beyond it,
what the rest of charlm asks of a model, each family's class answers itself, so that no code outside
models/ tests which family it holds:

  shapes.py                 {name: shape} of its state dict, by arithmetic and without torch (a
                            checkpoint is checked against it before anything is allocated)
  Model.ACTIVATION_BYTES    saved activations per position × width × layer, for the memory estimate
  model.capabilities        what can be read off it: "attention" (maps, heads) or "gates" (an LSTM/GRU's)
  model.window              tokens it can see at once (None: no limit, an RNN's state)
  model.rolling_cache       whether its cache can roll on past the window (a ring buffer; RoPE and ALiBi)
  model.decode(ids, cache)  logits after feeding ids into cache: the fastest path the family has
  model.hidden_matrices()   the 2-D weights inside the network (what Muon steps)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from charlm.config import FAMILIES, ModelConfig
from charlm.models.shapes import param_count, param_shapes

if TYPE_CHECKING:  # importing this package loads no torch: a family's module loads when a model is built
    import torch.nn as nn

__all__ = ["build_model", "count_params", "family", "param_count", "param_shapes"]


def family(kind: str) -> type[nn.Module]:
    """The class of a model family (config.FAMILIES), imported on first use."""
    module, _, name = FAMILIES[kind].rpartition(".")
    return getattr(importlib.import_module(module), name)


def build_model(cfg: ModelConfig) -> nn.Module:
    cfg.validate()
    return family(cfg.kind)(cfg)


def count_params(model: nn.Module) -> int:
    """Distinct parameters (a tied embedding counts once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
