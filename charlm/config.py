"""Typed configs for the model, the training run and sampling.

Each config validates itself and raises ConfigError with a message a user can act on; the CLI turns
that into a one-line error. Configs travel inside checkpoints as plain dicts (to_dict / from_dict).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, fields

MODEL_KINDS = ("transformer", "lstm", "gru")
POSITIONS = ("rope", "learned", "sinusoidal")
TOKENIZERS = ("char", "bpe")
PRESETS = ("tiny", "small", "medium")
OPTIMIZERS = ("muon", "adamw")
PRECISIONS = ("auto", "fp32", "bf16")


class ConfigError(ValueError):
    """A setting that cannot work, with a message that says what to change."""


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _from_dict(cls, d: dict):
    known = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in d.items() if k in known})


@dataclass
class ModelConfig:
    kind: str = "transformer"  # transformer | lstm | gru
    vocab_size: int = 0  # set from the tokenizer
    n_layers: int = 4
    d_model: int = 128  # transformer width; LSTM/GRU hidden (and embedding) size
    n_heads: int = 4  # transformer only
    context: int = 128  # tokens seen per training window (and the transformer's maximum)
    dropout: float = 0.0
    positions: str = "rope"  # transformer only: rope | learned | sinusoidal
    mlp_ratio: int = 4  # transformer only: MLP hidden = mlp_ratio * d_model

    def validate(self) -> "ModelConfig":
        _check(self.kind in MODEL_KINDS, f"unknown model '{self.kind}': choose one of {', '.join(MODEL_KINDS)}")
        _check(self.vocab_size >= 2, f"vocabulary size must be at least 2, got {self.vocab_size}")
        _check(1 <= self.n_layers <= 64, f"--layers must be between 1 and 64, got {self.n_layers}")
        _check(1 <= self.d_model <= 16384, f"--d-model must be between 1 and 16384, got {self.d_model}")
        _check(2 <= self.context <= 65536, f"--context must be between 2 and 65536, got {self.context}")
        _check(0.0 <= self.dropout < 1.0, f"--dropout must be in [0, 1), got {self.dropout}")
        if self.kind == "transformer":
            _check(self.n_heads >= 1, f"--heads must be at least 1, got {self.n_heads}")
            _check(
                self.d_model % self.n_heads == 0,
                f"--d-model {self.d_model} is not divisible by --heads {self.n_heads}: pick sizes where it is (e.g. 128 and 4)",
            )
            _check(self.positions in POSITIONS, f"unknown --positions '{self.positions}': choose one of {', '.join(POSITIONS)}")
            head_dim = self.d_model // self.n_heads
            _check(
                self.positions != "rope" or head_dim % 2 == 0,
                f"rope needs an even head size, but --d-model {self.d_model} / --heads {self.n_heads} = {head_dim}",
            )
            _check(1 <= self.mlp_ratio <= 16, f"mlp ratio must be between 1 and 16, got {self.mlp_ratio}")
        return self

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        return _from_dict(cls, d)


@dataclass
class TrainConfig:
    tokenizer: str = "char"  # char | bpe
    vocab_size: int = 1024  # bpe only
    steps: int = 2000  # the run's total; --resume continues up to it
    max_time: float | None = None  # seconds; training stops (and the schedule ends) when it runs out
    batch_size: int = 32
    precision: str = "auto"  # auto | fp32 | bf16: autocast dtype for matrix products (see train.autocast_dtype)
    grad_accum: int = 1  # micro-batches per optimizer step: effective batch = batch_size * grad_accum * processes
    lr: float = 3e-3
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio
    warmup: int = 100
    weight_decay: float = 0.1
    beta2: float = 0.99
    optimizer: str = "muon"  # muon (Muon for hidden matrices + AdamW for the rest) | adamw
    muon_lr: float = 0.02  # Muon's own learning rate (it follows the same schedule)
    grad_clip: float = 1.0
    eval_interval: int = 250
    eval_iters: int = 20
    val_fraction: float = 0.1
    seed: int = 1337
    device: str = "auto"  # auto | cpu | cuda
    compile: bool = False
    sample_tokens: int = 200  # length of the sample shown at each eval and at the end (0: none)

    def validate(self) -> "TrainConfig":
        _check(self.tokenizer in TOKENIZERS, f"unknown --tokenizer '{self.tokenizer}': choose char or bpe")
        _check(
            self.tokenizer != "bpe" or 257 <= self.vocab_size <= 1_000_000,
            f"--vocab-size must be between 257 and 1000000 for BPE (it starts from 256 bytes), got {self.vocab_size}",
        )
        _check(self.optimizer in OPTIMIZERS, f"unknown --optimizer '{self.optimizer}': choose muon or adamw")
        _check(0 < self.muon_lr < 10, f"--muon-lr must be positive and below 10, got {self.muon_lr}")
        _check(self.steps >= 1, f"--steps must be at least 1, got {self.steps}")
        _check(self.max_time is None or self.max_time > 0, "--max-time must be positive")
        _check(self.batch_size >= 1, f"--batch-size must be at least 1, got {self.batch_size}")
        _check(self.precision in PRECISIONS, f"unknown --precision '{self.precision}': choose auto, fp32 or bf16")
        _check(1 <= self.grad_accum <= 65536, f"--grad-accum must be between 1 and 65536, got {self.grad_accum}")
        _check(0 < self.lr < 10, f"--lr must be a positive learning rate below 10, got {self.lr}")
        _check(0 <= self.min_lr_ratio <= 1, f"min lr ratio must be in [0, 1], got {self.min_lr_ratio}")
        _check(self.warmup >= 0, f"--warmup must be at least 0, got {self.warmup}")
        _check(self.weight_decay >= 0, f"--weight-decay must be at least 0, got {self.weight_decay}")
        _check(0 <= self.beta2 < 1, f"beta2 must be in [0, 1), got {self.beta2}")
        _check(self.grad_clip > 0, f"gradient clipping must be positive, got {self.grad_clip}")
        _check(self.eval_interval >= 1, f"--eval-interval must be at least 1, got {self.eval_interval}")
        _check(self.eval_iters >= 1, f"--eval-iters must be at least 1, got {self.eval_iters}")
        _check(0 < self.val_fraction < 1, f"--val-fraction must be between 0 and 1, got {self.val_fraction}")
        _check(self.device in ("auto", "cpu", "cuda"), f"unknown --device '{self.device}': choose auto, cpu or cuda")
        _check(self.sample_tokens >= 0, "--sample-tokens must be at least 0")
        return self

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        return _from_dict(cls, d)


# Sizes for each model family. Explicit CLI flags override these. The tiny presets are tuned for a
# 2-core laptop CPU and a two-minute run (benchmarks/RESULTS.md has the measurements).
PRESET_TABLE: dict[str, dict[str, dict]] = {
    "transformer": {
        "tiny": dict(n_layers=4, d_model=128, n_heads=4, context=256, dropout=0.0, batch_size=16, lr=8e-3),
        "small": dict(n_layers=6, d_model=256, n_heads=8, context=256, dropout=0.1, batch_size=32, lr=2e-3),
        "medium": dict(n_layers=8, d_model=512, n_heads=8, context=512, dropout=0.1, batch_size=32, lr=1e-3),
    },
    "lstm": {
        "tiny": dict(n_layers=2, d_model=256, context=64, dropout=0.0, batch_size=64, lr=4e-3),
        "small": dict(n_layers=2, d_model=512, context=128, dropout=0.1, batch_size=64, lr=2e-3),
        "medium": dict(n_layers=3, d_model=1024, context=256, dropout=0.2, batch_size=64, lr=1e-3),
    },
}
PRESET_TABLE["gru"] = PRESET_TABLE["lstm"]

MODEL_KEYS = {f.name for f in fields(ModelConfig)}


def preset(kind: str, name: str) -> tuple[dict, dict]:
    """(model settings, train settings) of a preset."""
    _check(kind in MODEL_KINDS, f"unknown model '{kind}': choose one of {', '.join(MODEL_KINDS)}")
    _check(name in PRESETS, f"unknown preset '{name}': choose one of {', '.join(PRESETS)}")
    table = PRESET_TABLE[kind][name]
    model = {k: v for k, v in table.items() if k in MODEL_KEYS}
    train = {k: v for k, v in table.items() if k not in MODEL_KEYS}
    return model, train


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h)?\s*$")


def parse_duration(text: str) -> float:
    """'90s', '10m', '1.5h', '120' -> seconds."""
    m = _DURATION.match(text)
    _check(m is not None, f"cannot read duration '{text}': use e.g. 90s, 10m or 1h")
    value, unit = float(m.group(1)), m.group(2) or "s"
    seconds = value * {"ms": 0.001, "s": 1, "m": 60, "min": 60, "h": 3600}[unit]
    _check(seconds > 0, f"duration must be positive, got '{text}'")
    return seconds
