"""The presets: each model family's sizes, batch and learning rate for a laptop CPU (tiny), one GPU (small) and
a larger GPU run (medium); and train_configs, the configs of a run from the flags given over a preset's.
A new family adds its sizes to PRESET_TABLE (they reach `train --help` through describe_presets).
"""

from __future__ import annotations

from dataclasses import fields, replace

from charlm.config import MODEL_KINDS, ModelConfig, TrainConfig, shape_words
from charlm.settings import check, from_text

PRESETS = ("tiny", "small", "medium")

# Sizes for each model family. Explicit CLI flags override these. The tiny presets are tuned for a
# 2-core laptop CPU and a two-minute run (benchmarks/RESULTS.md has the measurements).
PRESET_TABLE: dict[str, dict[str, dict]] = {
    "transformer": {
        # tiny: 3 layers with an MLP of 3x the width see more text in a few CPU minutes than 4 with 4x, and QK-norm,
        # smear and an untied head learn faster per token, as do Muon's 4 Newton-Schulz iterations and momentum 0.9
        # (torch's: 5 and 0.95); batch 32 with attention in fp32 under autocast (RESULTS.md, "The tiny preset, round
        # six" and "round seven"). small and medium keep GPT-2's MLP, plain attention, no smear, a tied head and
        # torch's Muon (not measured on a GPU with the change).
        "tiny": dict(
            n_layers=3,
            d_model=128,
            n_heads=4,
            context=64,
            mlp_ratio=3,
            qk_norm=True,
            smear=True,
            tied=False,
            dropout=0.0,
            batch_size=32,
            lr=8e-3,
            muon_steps=4,
            muon_momentum=0.9,
        ),
        "small": dict(
            n_layers=6,
            d_model=256,
            n_heads=8,
            context=256,
            mlp_ratio=4,
            qk_norm=False,
            smear=False,
            tied=True,
            dropout=0.1,
            batch_size=32,
            lr=2e-3,
        ),
        "medium": dict(
            n_layers=8,
            d_model=512,
            n_heads=8,
            context=512,
            mlp_ratio=4,
            qk_norm=False,
            smear=False,
            tied=True,
            dropout=0.1,
            batch_size=32,
            lr=1e-3,
        ),
    },
    "lstm": {
        "tiny": dict(n_layers=2, d_model=256, context=64, dropout=0.0, batch_size=64, lr=4e-3),
        "small": dict(n_layers=2, d_model=512, context=128, dropout=0.1, batch_size=64, lr=2e-3),
        "medium": dict(n_layers=3, d_model=1024, context=256, dropout=0.2, batch_size=64, lr=1e-3),
    },
}
PRESET_TABLE["gru"] = PRESET_TABLE["lstm"]

MODEL_KEYS = {f.name for f in fields(ModelConfig)}
PRESET_USE = {  # what each preset is for: --preset's choices, in --help
    "tiny": "a laptop CPU and minutes (the default on CPU)",
    "small": "one GPU (the default on CUDA)",
    "medium": "a larger GPU run",
}


def describe_presets() -> list[tuple[str, str]]:
    """(name, what it sets for each model family) of every preset (train --help)."""

    def sizes(s: dict) -> str:
        shape = shape_words(
            s["n_layers"],
            s["d_model"],
            s["context"],
            s.get("n_heads"),
            s.get("mlp_ratio"),
            s.get("qk_norm"),
            smear=s.get("smear"),
            tied=s.get("tied", True),
        )
        return f"{shape}, dropout {s['dropout']:g}, batch {s['batch_size']}, lr {s['lr']:g}" + (
            f", Muon {s['muon_steps']} steps, momentum {s['muon_momentum']:g}" if "muon_steps" in s else ""
        )

    tables: dict[int, list[str]] = {}  # families that share one table (lstm and gru) are named together
    for kind, table in PRESET_TABLE.items():
        tables.setdefault(id(table), []).append(kind)
    return [
        (
            n,
            f"for {PRESET_USE[n]}: "
            + "; ".join(f"{'/'.join(k)} {sizes(PRESET_TABLE[k[0]][n])}" for k in tables.values()),
        )
        for n in PRESETS
    ]


def train_configs(preset_name: str, given: dict) -> tuple[ModelConfig, TrainConfig]:
    """The configs of a training run: the settings given (a field's name -> its value, or the text typed for a
    field that parses text, such as --max-time 10m; absent or None: not given; other names: ignored) over the
    preset's, over the fields' defaults; the step and time budget worked out from each other
    (TrainConfig.budget); both validated (the vocabulary size is the tokenizer's, set later)."""
    known = {f.name: f for cls in (ModelConfig, TrainConfig) for f in fields(cls)}
    given = {  # never `or`: --steps 0 must be refused, not replaced
        k: from_text(known[k], v) if isinstance(v, str) and known[k].metadata.get("parse") else v
        for k, v in given.items()
        if k in known and v is not None
    }
    model_preset, train_preset = preset(given.get("kind", "transformer"), preset_name)
    given |= TrainConfig.budget(given.pop("steps", None), given.pop("max_time", None))
    model_keys = {f.name for f in fields(ModelConfig)} - {"vocab_size"}
    model = ModelConfig(**{**model_preset, **{k: v for k, v in given.items() if k in model_keys}})
    replace(model, vocab_size=2).validate()
    train = TrainConfig(**{**train_preset, **{k: v for k, v in given.items() if k not in model_keys}})
    return model, train


def preset(kind: str, name: str) -> tuple[dict, dict]:
    """(model settings, train settings) of a preset."""
    check(kind in MODEL_KINDS, f"unknown model '{kind}': choose one of {', '.join(MODEL_KINDS)}")
    check(name in PRESETS, f"unknown preset '{name}': choose one of {', '.join(PRESETS)}")
    table = PRESET_TABLE[kind][name]
    model = {k: v for k, v in table.items() if k in MODEL_KEYS}
    train = {k: v for k, v in table.items() if k not in MODEL_KEYS}
    return model, train
