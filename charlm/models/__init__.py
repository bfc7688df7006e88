"""The model families behind one interface. config.FAMILIES names each family's class; build_model makes one.

The contract every family's class honours -- all of it is used outside models/, and
tests/test_extensions.py checks it for every registered family:

  Model(cfg)                the model a ModelConfig describes; it keeps it as model.cfg
  forward(idx, targets=None, cache=None) -> (logits, loss)
                            idx (B, T) token ids; logits (B, T, vocab); loss the mean cross-entropy against
                            targets (B, T), where -1 marks a position not to score; cache: carried on in place
  new_cache(batch_size, rolling=False)
                            the object that carries the model's memory between calls; it has `pos` (tokens
                            fed so far) and `reset()` (forget them); rolling=True only where rolling_cache
  decode(ids, cache)        logits (vocab,) after feeding the list ids into cache: the fastest path it has
  hidden_matrices()         the 2-D weights inside the network, which Muon steps (may be empty)
  capabilities              a frozenset: "attention" (maps, heads: models/probes.py) and/or "gates" (an
                            LSTM/GRU's gate traces); empty when nothing can be read off it
  window                    tokens it can see at once (None: no limit, as an RNN's state)
  rolling_cache             whether its cache can roll on past the window (a ring buffer; RoPE and ALiBi)
  ACTIVATION_BYTES          saved activations per position × width × layer, for the memory estimate

and, beside the class: shapes.SHAPES[kind](cfg) gives {name: shape} of its state dict by arithmetic and
without torch (a checkpoint is checked against it before anything is allocated; shapes.TIED where one tensor
has two names), and presets.PRESET_TABLE[kind] its sizes for each preset.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from charlm.config import FAMILIES, ModelConfig
from charlm.models.shapes import config_params, param_shapes

if TYPE_CHECKING:  # importing this package loads no torch: a family's module loads when a model is built
    import torch.nn as nn

__all__ = ["build_model", "count_params", "family", "config_params", "param_shapes"]


def family(kind: str) -> type[nn.Module]:
    """The class of a model family (config.FAMILIES), imported on first use."""
    module, _, name = FAMILIES[kind].rpartition(".")
    return getattr(importlib.import_module(module), name)


def build_model(cfg: ModelConfig) -> nn.Module:
    cfg.validate()
    return family(cfg.kind)(cfg)


def count_params(model: nn.Module) -> int:
    """The distinct parameters of a built model (a tied embedding counts once); config_params(cfg) gives the
    same number from a config, without torch."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
