"""Each family's state dict, by arithmetic and without torch: the name and shape of every tensor the model a
config describes holds. A checkpoint's tensors are checked against these before anything is allocated (a
crafted config cannot make charlm build a huge model), and `charlm info` checks them without loading torch.
tests/test_models.py holds every family's shapes against its built module."""

from __future__ import annotations

import math

from charlm.config import ModelConfig

Shapes = dict[str, tuple[int, ...]]


def transformer(cfg: ModelConfig) -> Shapes:
    C, A, hidden = cfg.d_model, cfg.attn_width, cfg.mlp_ratio * cfg.d_model
    shapes = {"tok_emb.weight": (cfg.vocab_size, C)}
    if cfg.positions == "learned":
        shapes["pos_emb.weight"] = (cfg.context, C)
    if cfg.smear:
        shapes["smear"] = (C,)
    for i in range(cfg.n_layers):
        shapes |= {
            f"blocks.{i}.norm1.weight": (C,),
            f"blocks.{i}.attn.qkv.weight": (3 * A, C),
            f"blocks.{i}.attn.proj.weight": (C, A),
            f"blocks.{i}.norm2.weight": (C,),
            f"blocks.{i}.mlp.fc.weight": (hidden, C),
            f"blocks.{i}.mlp.proj.weight": (C, hidden),
        }
    return shapes | {"norm.weight": (C,), "head.weight": (cfg.vocab_size, C)}  # tied: tok_emb's


GATES = {"lstm": 4, "gru": 3}  # weight blocks stacked in each of an RNN's matrices: i, f, g, o; r, z, n


def rnn(cfg: ModelConfig) -> Shapes:
    gates = GATES[cfg.kind]
    C, H = cfg.d_model, cfg.hidden_size
    G = gates * H
    shapes = {"tok_emb.weight": (cfg.vocab_size, C)}
    for i in range(cfg.n_layers):
        shapes |= {f"rnn.weight_ih_l{i}": (G, C if i == 0 else H), f"rnn.weight_hh_l{i}": (G, H)}
        shapes |= {f"rnn.bias_ih_l{i}": (G,), f"rnn.bias_hh_l{i}": (G,)}
    return shapes | {"head.weight": (cfg.vocab_size, H), "head.bias": (cfg.vocab_size,)}


def transformer_tied(cfg: ModelConfig) -> tuple[str, ...]:
    return ("head.weight",) if cfg.tied else ()  # the head is the embedding table


SHAPES = {"transformer": transformer, "lstm": rnn, "gru": rnn}  # by config.FAMILIES' names
TIED = {"transformer": transformer_tied}  # a family whose state dict holds one tensor under two names


def tied(cfg: ModelConfig) -> tuple[str, ...]:
    """Names stored twice: the same tensor as another (none, for a family not in TIED)."""
    return TIED[cfg.kind](cfg) if cfg.kind in TIED else ()


def param_shapes(cfg: ModelConfig) -> Shapes:
    return SHAPES[cfg.kind](cfg)


def config_params(cfg: ModelConfig) -> int:
    """The distinct parameters of the model cfg describes, by arithmetic (a tied embedding counts once):
    count_params(build_model(cfg)) without building it."""
    twice = tied(cfg)
    return sum(math.prod(shape) for name, shape in param_shapes(cfg).items() if name not in twice)
