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
  capabilities              a frozenset of CAPABILITIES' names (empty: nothing can be read off it); each
                            promises the methods below it names
  window                    tokens it can see at once (None: no limit, as an RNN's state)
  rolling_cache             whether its cache can roll on past the window (a ring buffer; RoPE and ALiBi)
  ACTIVATION_BYTES          saved activations per position × width × layer, for the memory estimate

What can be read off a model and done to it, by capability (models/inspect.py builds every intervention and
measurement on these, and nothing outside models/ names a family's layers):

  "attention"  trace(idx) -> [(B, heads, T, T) per layer]: each layer's attention weights (what `attn` draws)
  "gates"      trace(idx) -> [probes.LayerTrace per layer]: gates (by name; probes.CANDIDATES names the
               candidate values), hidden states, and cell states if it has them (what `gates` draws)
  "knock_out"  knock_out(part, mode="zero"|"mean"): a context manager inside which model(idx) runs with the
               Part taken out: a part's output held at 0, or at its mean over the positions read (B and T);
               "gate" parts (a gated family) hold one gate at part.value
  "prune"      importance(idx) -> (layers, parts) array, what each part is worth on the text idx (B, T + 1);
               prune(cfg, state, importance, k) -> (cfg, state, [(layer, part), ...]): the config and state
               dict without the k least important parts of every layer (a static method: no model needed)
  PART         what one layer is made of: "head" or "unit"; parts(cfg) -> the number of them in each layer

and, beside the class: shapes.SHAPES[kind](cfg) gives {name: shape} of its state dict by arithmetic and
without torch (a checkpoint is checked against it before anything is allocated; shapes.TIED where one tensor
has two names), and presets.PRESET_TABLE[kind] its sizes for each preset.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from charlm.config import FAMILIES, ModelConfig
from charlm.models.shapes import config_params, param_shapes

if TYPE_CHECKING:  # importing this package loads no torch: a family's module loads when a model is built
    import torch.nn as nn

__all__ = ["build_model", "count_params", "family", "config_params", "param_shapes", "Part", "CAPABILITIES", "lacks"]

CAPABILITIES = {  # what each capability gives, as a refusal names it: "a bigram model has no attention heads"
    "attention": "attention heads",
    "gates": "gates to trace",
    "knock_out": "parts to knock out",
    "prune": "parts that can be pruned",
}


def lacks(model, capability: str) -> str:
    """The words a command refuses with, naming the family and what it lacks: 'a bigram model has no attention
    heads'."""
    return f"a {model.cfg.kind} model has no {CAPABILITIES[capability]}"


@dataclass(frozen=True)
class Part:
    """A piece of a model that knock_out takes out: heads or units of one layer (which: () for all of the
    layer's), or one gate of a layer held at `value` at every step."""

    layer: int
    kind: str  # the family's PART ("head", "unit"), or "gate"
    which: tuple[int, ...] = ()
    gate: str = ""
    value: float = 0.0

    def __str__(self) -> str:
        if self.kind == "gate":
            return f"L{self.layer} {self.gate}={self.value:g}"
        if self.kind == "head" and len(self.which) == 1:
            return f"L{self.layer}H{self.which[0]}"
        return f"L{self.layer} {self.kind}s {','.join(map(str, self.which)) or 'all'}"


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
