"""Typed configs for the model, the training run and sampling.

Each config validates itself and raises ConfigError with a message a user can act on; the CLI turns
that into a one-line error. Configs travel inside checkpoints as plain dicts (to_dict / from_dict).

Each field also describes its command-line flag (see `flag`): name, help, choices, and whether a resumed
run may change it. cli.py builds the options from these fields and runs.py reads the resume rule from
them, so a setting, its default and its help are written once, here.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field, fields

# The model families, by name: the class that implements each, imported only when a model is built (so that
# commands which only read files never load torch). A new family: its module in charlm/models/ and a line here.
FAMILIES = {
    "transformer": "charlm.models.transformer.Transformer",
    "lstm": "charlm.models.rnn.RNN",
    "gru": "charlm.models.rnn.RNN",
}
MODEL_KINDS = tuple(FAMILIES)
POSITIONS = ("rope", "learned", "sinusoidal")
TOKENIZERS = ("char", "bpe")
PRESETS = ("tiny", "small", "medium")
OPTIMIZERS = ("muon", "adamw")
PRECISIONS = ("auto", "fp32", "bf16")
DEVICES = ("auto", "cpu", "cuda")
UNKNOWN = ("error", "drop", "replace")  # what to do with characters a char tokenizer never saw
MAX_BATCH = 65536  # sequences per micro-batch: beyond this, memory and int32 indexing give out long before


class ConfigError(ValueError):
    """A setting that cannot work, with a message that says what to change."""


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def check_seed(seed: int | None) -> None:
    _check(seed is None or 0 <= seed < 2**63, f"--seed must be between 0 and 2^63 - 1, got {seed}")


def flag(
    default,
    help: str,
    *,
    name: str | None = None,
    short: str | None = None,
    choices: tuple | None = None,
    resumable: bool = False,
    from_preset: bool = False,
    derived: bool = False,
    applies_to: str | None = None,
    **kw,
):
    """A config field with its command-line flag. name: the flag without "--" (default: the field's name
    with dashes). resumable: `--resume` may change it. from_preset: the CLI default comes from --preset
    (the field's default applies to code that builds configs itself). derived: the command works the
    value out when the flag is absent (--steps and --max-time from each other). applies_to: the only
    model kind (ModelConfig) or tokenizer (TrainConfig) the setting means anything for."""
    meta = dict(
        flag=name,
        short=short,
        help=help,
        choices=choices,
        resumable=resumable,
        from_preset=from_preset,
        derived=derived,
        applies_to=applies_to,
    )
    if "default_factory" in kw:
        return field(metadata=meta, **kw)
    return field(default=default, metadata=meta, **kw)


def internal(default, applies_to: str | None = None, **kw):
    """A field with no command-line flag: set by code (vocab_size from the tokenizer) or fixed by design."""
    return field(default=default, metadata=dict(flag=False, applies_to=applies_to), **kw)


def flag_name(f) -> str | None:
    """The flag of a dataclass field ("d-model"), or None for an internal one."""
    if f.metadata.get("flag") is False:
        return None
    return f.metadata.get("flag") or f.name.replace("_", "-")


def _from_dict(cls, d: dict):
    known = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in d.items() if k in known})


@dataclass
class ModelConfig:
    kind: str = flag("transformer", "Model family.", name="model", choices=MODEL_KINDS)
    vocab_size: int = internal(0)  # set from the tokenizer
    n_layers: int = flag(4, "Number of layers.", name="layers", from_preset=True)
    d_model: int = flag(128, "Transformer width; LSTM/GRU hidden (and embedding) size.", from_preset=True)
    n_heads: int = flag(4, "Attention heads (transformer).", name="heads", from_preset=True, applies_to="transformer")
    context: int = flag(128, "Context length in tokens (the transformer's maximum).", from_preset=True)
    dropout: float = flag(0.0, "Dropout probability while training.", from_preset=True)
    positions: str = flag("rope", "Transformer positions.", choices=POSITIONS, applies_to="transformer")
    mlp_ratio: int = internal(4, applies_to="transformer")  # MLP hidden = mlp_ratio * d_model

    def applies(self, name: str) -> bool:
        """Whether the field `name` means anything for this model family (flag(applies_to=...))."""
        only = next(f.metadata.get("applies_to") for f in fields(self) if f.name == name)
        return only is None or only == self.kind

    def describe(self) -> str:
        """The model's shape in a few words: "transformer (4 layers × 128, 4 heads, context 256)"."""
        heads = f", {self.n_heads} heads" if self.applies("n_heads") else ""
        layers = f"{self.n_layers} layer{'s' * (self.n_layers != 1)}"
        return f"{self.kind} ({layers} × {self.d_model}{heads}, context {self.context})"

    def validate(self) -> ModelConfig:
        _check(self.kind in MODEL_KINDS, f"unknown model '{self.kind}': choose one of {', '.join(MODEL_KINDS)}")
        _check(self.vocab_size >= 2, f"vocabulary size must be at least 2, got {self.vocab_size}")
        _check(1 <= self.n_layers <= 64, f"--layers must be between 1 and 64, got {self.n_layers}")
        _check(1 <= self.d_model <= 16384, f"--d-model must be between 1 and 16384, got {self.d_model}")
        _check(2 <= self.context <= 65536, f"--context must be between 2 and 65536, got {self.context}")
        _check(0.0 <= self.dropout < 1.0, f"--dropout must be in [0, 1), got {self.dropout}")
        if self.applies("n_heads"):  # the transformer's own fields
            _check(self.n_heads >= 1, f"--heads must be at least 1, got {self.n_heads}")
            _check(
                self.d_model % self.n_heads == 0,
                f"--d-model {self.d_model} is not divisible by --heads {self.n_heads}: pick sizes where it is (e.g. 128 and 4)",
            )
            _check(
                self.positions in POSITIONS,
                f"unknown --positions '{self.positions}': choose one of {', '.join(POSITIONS)}",
            )
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
    def from_dict(cls, d: dict) -> ModelConfig:
        return _from_dict(cls, d)


@dataclass
class TrainConfig:
    tokenizer: str = flag("char", "Character-level, or byte-level BPE trained on the corpus.", choices=TOKENIZERS)
    vocab_size: int = flag(1024, "BPE vocabulary size.", applies_to="bpe")
    # the run's total; --resume continues up to it
    steps: int = flag(
        2000, "Total optimizer steps [default: as many as --max-time allows].", resumable=True, derived=True
    )
    # seconds; training stops (and the schedule ends) when it runs out. The CLI reads a duration (90s, 10m)
    max_time: float | None = flag(
        None, "Time budget, e.g. 90s, 10m, 1h [default: 2m unless --steps].", resumable=True, derived=True
    )
    batch_size: int = flag(32, "Sequences per micro-batch and process.", from_preset=True)
    precision: str = flag(
        "auto",
        "Autocast dtype: auto uses bf16 on GPUs and on CPUs with native bf16, else fp32.",
        choices=PRECISIONS,
        resumable=True,
    )
    grad_accum: int = flag(
        1, "Micro-batches per optimizer step: effective batch = batch size × grad accum × processes."
    )
    lr: float = flag(3e-3, "Peak learning rate.", from_preset=True)
    min_lr_ratio: float = internal(0.1)  # cosine decays to lr * min_lr_ratio
    warmup: int = flag(100, "Warmup steps.")
    weight_decay: float = flag(0.1, "AdamW weight decay of matrices and embeddings.")
    beta2: float = internal(0.99)
    optimizer: str = flag(
        "muon", "muon: Muon for hidden matrices + AdamW for the rest; adamw: AdamW for all.", choices=OPTIMIZERS
    )
    muon_lr: float = flag(0.02, "Muon's peak learning rate (it follows the same schedule).")
    grad_clip: float = internal(1.0)
    eval_interval: int | None = flag(
        None,
        "Steps between evaluations [default: the first after 5% of the budget, "
        "then as often as costs ~5% of the time].",
        resumable=True,
    )
    eval_iters: int = flag(20, "Batches per evaluation.", resumable=True)
    val_fraction: float = internal(0.1)
    seed: int = flag(1337, "Seed of the initial weights, the batches and dropout.")
    device: str = flag("auto", "auto: cuda when PyTorch sees a GPU, else cpu.", choices=DEVICES, resumable=True)
    compile: bool = flag(False, "torch.compile the model.", resumable=True)
    sample_tokens: int = flag(
        200, "Length of the samples shown at each evaluation and at the end (0: none).", resumable=True
    )

    def validate(self) -> TrainConfig:
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
        _check(
            self.batch_size <= MAX_BATCH,
            f"--batch-size must be at most {MAX_BATCH}, got {self.batch_size}: "
            "--grad-accum gives larger effective batches",
        )
        _check(self.precision in PRECISIONS, f"unknown --precision '{self.precision}': choose auto, fp32 or bf16")
        _check(1 <= self.grad_accum <= 65536, f"--grad-accum must be between 1 and 65536, got {self.grad_accum}")
        _check(0 < self.lr < 10, f"--lr must be a positive learning rate below 10, got {self.lr}")
        _check(0 <= self.min_lr_ratio <= 1, f"min lr ratio must be in [0, 1], got {self.min_lr_ratio}")
        _check(self.warmup >= 0, f"--warmup must be at least 0, got {self.warmup}")
        _check(self.weight_decay >= 0, f"--weight-decay must be at least 0, got {self.weight_decay}")
        _check(math.isfinite(self.weight_decay), f"--weight-decay must be a finite number, got {self.weight_decay}")
        _check(0 <= self.beta2 < 1, f"beta2 must be in [0, 1), got {self.beta2}")
        _check(self.grad_clip > 0, f"gradient clipping must be positive, got {self.grad_clip}")
        _check(
            self.eval_interval is None or self.eval_interval >= 1,
            f"--eval-interval must be at least 1, got {self.eval_interval}",
        )
        _check(self.eval_iters >= 1, f"--eval-iters must be at least 1, got {self.eval_iters}")
        _check(0 < self.val_fraction < 1, f"--val-fraction must be between 0 and 1, got {self.val_fraction}")
        _check(self.device in DEVICES, f"unknown --device '{self.device}': choose auto, cpu or cuda")
        _check(self.sample_tokens >= 0, "--sample-tokens must be at least 0")
        check_seed(self.seed)
        return self

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> TrainConfig:
        return _from_dict(cls, d)


@dataclass
class SampleConfig:
    """How to pick each next token (the flags shared by sample, chat and compare)."""

    temperature: float = flag(0.8, "0: greedy (always the most likely token).", short="t")
    top_k: int = flag(0, "Keep the k most likely tokens (0: off).")
    top_p: float = flag(1.0, "Nucleus: keep tokens up to this probability (1: off).")
    repetition_penalty: float = flag(1.0, ">1 discourages repeating tokens.")
    max_tokens: int = flag(500, "New tokens to generate.", short="n")
    stop: list[str] = flag(
        None, r"Stop at this text (cut off); repeatable; \n and \t are escapes.", default_factory=list
    )
    seed: int | None = flag(None, "Same seed, same text [default: random].")

    def validate(self) -> SampleConfig:
        _check(0 <= self.temperature <= 100, f"temperature must be between 0 and 100, got {self.temperature}")
        _check(self.top_k >= 0, f"top_k must be 0 (off) or more, got {self.top_k}")
        _check(0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}")
        _check(
            0 < self.repetition_penalty <= 10, f"repetition_penalty must be in (0, 10], got {self.repetition_penalty}"
        )
        _check(self.max_tokens >= 0, f"max_tokens must be 0 or more, got {self.max_tokens}")
        _check(all(isinstance(s, str) and s for s in self.stop), "stop strings must not be empty")
        _check(self.seed is None or 0 <= self.seed < 2**63, f"seed must be between 0 and 2^63 - 1, got {self.seed}")
        return self

    def to_dict(self) -> dict:
        return asdict(self)


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
