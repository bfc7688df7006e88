"""Typed configs for the model, the training run and sampling.

Each config validates itself and raises ConfigError with a message a user can act on; the CLI turns
that into a one-line error. Configs travel inside checkpoints as plain dicts (to_dict / from_dict).

Each field also describes its command-line flag (see `flag`): name, help, choices, its section in --help,
how typed text becomes its value, and whether a resumed run may change it. cli.py builds the options from
these fields, chat's /set and /attn read the same fields, and runs.py reads the resume rule from them, so a
setting, its default and its help are written once, here.

  ModelConfig, TrainConfig   charlm train (and what a checkpoint records)
  SampleConfig               sample, chat, compare (and chat's /set)
  AttnConfig, GatesConfig    attn and gates (and chat's /attn, /gates)
  PlotConfig, LabConfig      plot and lab
  TrainOptions, PromptOptions, SampleOptions, ChatOptions, LookOptions, EvalOptions, CompareOptions
                             the rest of each command's flags (the prompt, the device, --out, ...)
"""

from __future__ import annotations

import math
import numbers
import re
import reprlib
from dataclasses import asdict, dataclass, field, fields, replace

from charlm.errors import UserError

# The model families, by name: the class that implements each, imported only when a model is built (so that
# commands which only read files never load torch). A new family: its module in charlm/models/ and a line here.
FAMILIES = {
    "transformer": "charlm.models.transformer.Transformer",
    "lstm": "charlm.models.rnn.RNN",
    "gru": "charlm.models.rnn.RNN",
}
MODEL_KINDS = tuple(FAMILIES)
POSITIONS = ("rope", "alibi", "nope", "learned", "sinusoidal")
TOKENIZERS = ("char", "bpe")
PRESETS = ("tiny", "small", "medium")
OPTIMIZERS = ("muon", "adamw")
PRECISIONS = ("auto", "fp32", "bf16")
DEVICES = ("auto", "cpu", "cuda")
UNKNOWN = ("error", "drop", "replace")  # what to do with characters a char tokenizer never saw
MAX_BATCH = 65536  # sequences per micro-batch: beyond this, memory and int32 indexing give out long before
DEFAULT_MAX_TIME = 120.0  # seconds: what `charlm train` trains for when given neither --steps nor --max-time
NO_STEP_LIMIT = 1_000_000_000  # the steps of a run with only a time budget
# the largest counts a run's flags take: far beyond any run, and numbers every checkpoint can hold (64 bits)
MAX_STEPS = 10**12
MAX_ITERS = 10**6  # --eval-iters and --sample-tokens: each is work done at every evaluation
MAX_TIME = 10**9  # seconds (about 31 years)


class ConfigError(UserError, ValueError):
    """A setting that cannot work, with a message that says what to change."""


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _check_paths(config, *names: str) -> None:
    """A path flag given as empty text ('') is refused: it would mean the current directory, or nothing."""
    for f in fields(config):
        _check(
            f.name not in names or getattr(config, f.name) != "",
            f"--{flag_name(f)} is empty: give a path, or leave it out",
        )


MAX_BITS = 10_000  # str() of a whole number of more than 4300 digits (14,000 bits) raises ValueError


class _Shown(reprlib.Repr):
    maxlevel = 3

    def repr_int(self, x, level):
        return f"a number of {x.bit_length()} bits" if x.bit_length() > MAX_BITS else super().repr_int(x, level)


def shown(value) -> str:
    """A value in a message: short, on one line, whatever it holds (a checkpoint's config is outside data)."""
    return _Shown().repr(value)


def _whole(x) -> bool:  # one that messages can print
    return isinstance(x, numbers.Integral) and not isinstance(x, bool) and int(x).bit_length() <= MAX_BITS


def _real(x) -> bool:
    return _whole(x) or isinstance(x, numbers.Real) and not isinstance(x, (bool, numbers.Integral))


# what each declared field type accepts, and its name in a message
_KINDS = {
    "int": (_whole, "a whole number"),
    "float": (_real, "a number"),
    "str": (lambda x: isinstance(x, str), "text"),
    "bool": (lambda x: isinstance(x, bool), "true or false"),
    "list[str]": (lambda x: isinstance(x, list) and all(isinstance(s, str) for s in x), "a list of text"),
}


def _check_types(config) -> None:
    """Every field holds a value of its declared type, before any range check compares or prints it: a string
    where a number belongs would raise TypeError there, a float where an int belongs would pass and break
    the model later."""
    for f in fields(config):
        value = getattr(config, f.name)
        kind, optional = str(f.type).removesuffix(" | None"), str(f.type).endswith(" | None")
        ok, what = _KINDS.get(kind, (lambda x: True, ""))
        if not (ok(value) or optional and value is None):
            name = f"--{flag_name(f)}" if flag_name(f) else f.name.replace("_", " ")
            _check(False, f"{name} must be {what}{' or nothing' if optional else ''}, got {shown(value)}")


def check_seed(seed: int | None) -> None:
    _check(seed is None or 0 <= seed < 2**63, f"--seed must be between 0 and 2^63 - 1, got {seed}")


_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|sec|m|min|h)?")
_UNIT = {"ms": 0.001, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600}


def parse_duration(text: str, what: str = "duration") -> float:
    """Seconds, from a duration as charlm prints them ('45s', '2m04s', '1h05m', '1.2s') or as people type them
    ('90', '90 s', '10m', '1m30s', '1.5h', '0:05:30', '5:30')."""
    t, seconds = text.strip().lower(), None
    if re.fullmatch(r"\d+(:\d{1,2}){1,2}(\.\d+)?", t):  # [h:]m:s
        seconds = sum(float(p) * 60**i for i, p in enumerate(reversed(t.split(":"))))
    elif t and re.fullmatch(rf"(?:{_DURATION.pattern}\s*)+", t):
        parts = _DURATION.findall(t)
        if len(parts) == 1 or all(u for _, u in parts):  # '1m30' is not a duration; '1m30s' is
            seconds = sum(float(v) * _UNIT[u or "s"] for v, u in parts)
    _check(seconds is not None, f"{what}: cannot read duration '{text}': use e.g. 90s, 10m, 1m30s or 1h")
    _check(seconds > 0, f"{what}: duration must be positive, got '{text}'")
    return seconds


def unescape(text: str) -> str:
    r"""'\n', '\t', '\r' and '\\' typed as two characters -> the character itself (for stop strings)."""
    return re.sub(r"\\([ntr\\])", lambda m: {"n": "\n", "t": "\t", "r": "\r", "\\": "\\"}[m.group(1)], text)


def flag(
    default,
    help: str,
    *,
    name: str | None = None,
    short: str | None = None,
    choices: tuple | None = None,
    section: str | None = None,
    parse=None,
    example: str | None = None,
    positional: bool = False,
    resumable: bool = False,
    from_preset: bool = False,
    derived: bool = False,
    applies_to: str | None = None,
    **kw,
):
    """A config field with its command-line flag. name: the flag without "--" (default: the field's name
    with dashes). section: its group in --help. parse: turns the text a user typed into the value (a
    duration, an escaped stop string); None: the field's own type. example: a value to show in hints.
    positional: chat's /attn and /gates take it as a bare number (/attn 1 2: layer 1, head 2).
    resumable: `--resume` may change it. from_preset: the CLI default comes from --preset (the field's
    default applies to code that builds configs itself). derived: the command works the value out when the
    flag is absent (--steps and --max-time from each other). applies_to: the only model kind (ModelConfig)
    or tokenizer (TrainConfig) the setting means anything for."""
    meta = dict(
        flag=name,
        short=short,
        help=help,
        choices=choices,
        section=section,
        parse=parse,
        example=example,
        positional=positional,
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


def device_flag(**kw):
    """--device, as train, sample, chat, eval, compare and lab take it."""
    return flag("auto", "auto: cuda when PyTorch sees a GPU, else cpu.", choices=DEVICES, **kw)


def unknown_flag(**kw):
    """--unknown: what a char model does with characters it never saw (sample, chat, compare, attn, gates, eval)."""
    return flag(
        "error",
        "Characters a char model never saw: stop with an error, drop them, or replace them.",
        choices=UNKNOWN,
        **kw,
    )


def no_cache_flag():
    return flag(False, "Recompute the whole text for every token (slow: to compare).")


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
    kind: str = flag("transformer", "Model family.", name="model", choices=MODEL_KINDS, section="Model")
    vocab_size: int = internal(0)  # set from the tokenizer
    n_layers: int = flag(4, "Number of layers.", name="layers", from_preset=True, section="Model")
    d_model: int = flag(
        128, "Transformer width; LSTM/GRU hidden (and embedding) size.", from_preset=True, section="Model"
    )
    n_heads: int = flag(
        4, "Attention heads (transformer).", name="heads", from_preset=True, applies_to="transformer", section="Model"
    )
    context: int = flag(128, "Context length in tokens (the transformer's maximum).", from_preset=True, section="Model")
    dropout: float = flag(0.0, "Dropout probability while training.", from_preset=True, section="Model")
    positions: str = flag(
        "rope",
        "Transformer positions: rope (rotated queries and keys: relative), alibi (a per-head penalty linear in "
        "distance: relative), nope (none: the causal mask alone), learned or sinusoidal (vectors added: absolute).",
        choices=POSITIONS,
        applies_to="transformer",
        section="Model",
    )
    mlp_ratio: int = internal(4, applies_to="transformer")  # MLP hidden = mlp_ratio * d_model
    # the output head reads the embedding table (GPT-2's tying); False: a head of its own (the lab's recall and
    # copy models: with a tied head the current key's own embedding pulls the answer toward the key itself)
    tied: bool = internal(True, applies_to="transformer")
    # a pruned model's sizes (charlm compress drops heads or units): None means the usual d_model // n_heads and
    # d_model. A transformer that lost heads keeps their size: its attention is n_heads × head_dim wide
    head_dim: int | None = internal(None, applies_to="transformer")
    hidden: int | None = internal(None)  # an LSTM/GRU's hidden size (its embedding stays d_model)

    @property
    def head_size(self) -> int:
        return self.head_dim or self.d_model // self.n_heads

    @property
    def attn_width(self) -> int:
        """What attention's q, k and v are wide: every head side by side (d_model, unless heads were dropped)."""
        return self.n_heads * self.head_size

    @property
    def hidden_size(self) -> int:
        return self.hidden or self.d_model

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
        _check_types(self)
        _check(self.kind in MODEL_KINDS, f"unknown model {shown(self.kind)}: choose one of {', '.join(MODEL_KINDS)}")
        _check(
            2 <= self.vocab_size <= 10**7, f"vocabulary size must be between 2 and 10^7, got {shown(self.vocab_size)}"
        )
        # bounded for every kind, used or not: a checkpoint records them all (and holds numbers of 64 bits)
        _check(1 <= self.n_heads <= 16384, f"--heads must be between 1 and 16384, got {shown(self.n_heads)}")
        _check(1 <= self.mlp_ratio <= 16, f"mlp ratio must be between 1 and 16, got {shown(self.mlp_ratio)}")
        _check(1 <= self.n_layers <= 64, f"--layers must be between 1 and 64, got {self.n_layers}")
        _check(1 <= self.d_model <= 16384, f"--d-model must be between 1 and 16384, got {self.d_model}")
        _check(2 <= self.context <= 65536, f"--context must be between 2 and 65536, got {self.context}")
        _check(0.0 <= self.dropout < 1.0, f"--dropout must be in [0, 1), got {self.dropout}")
        _check(
            self.head_dim is None or 1 <= self.head_dim <= 16384 and self.n_heads * self.head_dim <= 16384,
            f"head size must be between 1 and 16384, got {shown(self.head_dim)}",
        )
        if self.applies("n_heads"):  # the transformer's own fields
            _check(
                self.head_dim is not None or self.d_model % self.n_heads == 0,
                f"--d-model {self.d_model} is not divisible by --heads {self.n_heads}: pick sizes where it is (e.g. 128 and 4)",
            )
            _check(
                self.positions in POSITIONS,
                f"unknown --positions {shown(self.positions)}: choose one of {', '.join(POSITIONS)}",
            )
            _check(
                self.positions != "rope" or self.head_size % 2 == 0,
                f"rope needs an even head size, but --d-model {self.d_model} / --heads {self.n_heads} = {self.head_size}",
            )
            _check(1 <= self.mlp_ratio <= 16, f"mlp ratio must be between 1 and 16, got {self.mlp_ratio}")
        _check(
            self.hidden is None or 1 <= self.hidden <= 16384,
            f"hidden size must be between 1 and 16384, got {self.hidden}",
        )
        return self

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> ModelConfig:
        return _from_dict(cls, d)


@dataclass
class TrainConfig:
    tokenizer: str = flag(
        "char", "Character-level, or byte-level BPE trained on the corpus.", choices=TOKENIZERS, section="Data"
    )
    vocab_size: int = flag(1024, "BPE vocabulary size.", applies_to="bpe", section="Data")
    batch_size: int = flag(32, "Sequences per micro-batch and process.", from_preset=True, section="Optimisation")
    grad_accum: int = flag(
        1,
        "Micro-batches per optimizer step: effective batch = batch size × grad accum × processes.",
        section="Optimisation",
    )
    lr: float = flag(3e-3, "Peak learning rate.", from_preset=True, section="Optimisation")
    min_lr_ratio: float = internal(0.1)  # cosine decays to lr * min_lr_ratio
    warmup: int = flag(100, "Warmup steps.", section="Optimisation")
    optimizer: str = flag(
        "muon",
        "muon: Muon for hidden matrices + AdamW for the rest; adamw: AdamW for all.",
        choices=OPTIMIZERS,
        section="Optimisation",
    )
    muon_lr: float = flag(0.02, "Muon's peak learning rate (it follows the same schedule).", section="Optimisation")
    weight_decay: float = flag(0.1, "AdamW weight decay of matrices and embeddings.", section="Optimisation")
    beta2: float = internal(0.99)
    grad_clip: float = internal(1.0)
    precision: str = flag(
        "auto",
        "Autocast dtype: auto uses bf16 on GPUs and on CPUs with native bf16, else fp32.",
        choices=PRECISIONS,
        resumable=True,
        section="Optimisation",
    )
    # the run's total; --resume continues up to it. NO_STEP_LIMIT: a time budget alone ends the run
    steps: int = flag(
        2000,
        "Total optimizer steps [default: as many as --max-time allows].",
        resumable=True,
        derived=True,
        section="Run",
    )
    # seconds; training stops (and the schedule ends) when it runs out
    max_time: float | None = flag(
        None,
        f"Time budget, e.g. 90s, 10m, 1m30s, 1h [default: {DEFAULT_MAX_TIME / 60:g}m unless --steps].",
        parse=lambda text: parse_duration(text, "--max-time"),
        resumable=True,
        derived=True,
        section="Run",
    )
    eval_interval: int | None = flag(
        None,
        "Steps between evaluations [default: the first after 5% of the budget, "
        "then as often as costs ~5% of the time].",
        resumable=True,
        section="Run",
    )
    eval_iters: int = flag(20, "Batches per evaluation.", resumable=True, section="Run")
    val_fraction: float = internal(0.1)
    sample_tokens: int = flag(
        200, "Length of the samples shown at each evaluation and at the end (0: none).", resumable=True, section="Run"
    )
    seed: int = flag(1337, "Seed of the initial weights, the batches and dropout.", section="Run")
    device: str = device_flag(resumable=True, section="Run")
    compile: bool = flag(False, "torch.compile the model.", resumable=True, section="Run")
    # distillation (charlm.distill): the loss is (1 - w) CE + w T² KL(teacher_T || student_T); w = 0 trains as usual
    teacher: str | None = flag(
        None, "Distil from this checkpoint (a file or run directory; same tokenizer).", section="Distillation"
    )
    distill_temperature: float = flag(
        2.0, "Temperature of the teacher's and student's distributions.", section="Distillation"
    )
    distill_weight: float = flag(
        0.5, "Share of the loss from the teacher's soft targets (0: ordinary training).", section="Distillation"
    )

    @staticmethod
    def budget(steps: int | None, max_time: float | None) -> dict:
        """steps and max_time as a run takes them: a time budget alone has no step limit, and neither
        given means the default time budget."""
        if steps is None and max_time is None:
            max_time = DEFAULT_MAX_TIME
        return {"steps": NO_STEP_LIMIT if steps is None else steps, "max_time": max_time}

    @property
    def step_limited(self) -> bool:
        return self.steps < NO_STEP_LIMIT

    def validate(self) -> TrainConfig:
        _check_types(self)
        _check(self.tokenizer in TOKENIZERS, f"unknown --tokenizer {shown(self.tokenizer)}: choose char or bpe")
        _check(
            (self.tokenizer != "bpe" or 257 <= self.vocab_size) and self.vocab_size <= 1_000_000,
            f"--vocab-size must be between 257 and 1000000 for BPE (it starts from 256 bytes), got {self.vocab_size}",
        )
        _check(self.optimizer in OPTIMIZERS, f"unknown --optimizer {shown(self.optimizer)}: choose muon or adamw")
        _check(0 < self.muon_lr < 10, f"--muon-lr must be positive and below 10, got {self.muon_lr}")
        _check(1 <= self.steps <= MAX_STEPS, f"--steps must be between 1 and 10^12, got {shown(self.steps)}")
        _check(self.max_time is None or self.max_time > 0, "--max-time must be positive")
        _check(
            self.max_time is None or self.max_time <= MAX_TIME,
            f"--max-time must be at most {MAX_TIME:g}s (about 31 years), got {shown(self.max_time)}",
        )
        _check(self.batch_size >= 1, f"--batch-size must be at least 1, got {self.batch_size}")
        _check(
            self.batch_size <= MAX_BATCH,
            f"--batch-size must be at most {MAX_BATCH}, got {self.batch_size}: "
            "--grad-accum gives larger effective batches",
        )
        _check(self.precision in PRECISIONS, f"unknown --precision {shown(self.precision)}: choose auto, fp32 or bf16")
        _check(1 <= self.grad_accum <= 65536, f"--grad-accum must be between 1 and 65536, got {self.grad_accum}")
        _check(0 < self.lr < 10, f"--lr must be a positive learning rate below 10, got {self.lr}")
        _check(0 <= self.min_lr_ratio <= 1, f"min lr ratio must be in [0, 1], got {self.min_lr_ratio}")
        _check(0 <= self.warmup <= MAX_STEPS, f"--warmup must be between 0 and 10^12, got {shown(self.warmup)}")
        _check(self.weight_decay >= 0, f"--weight-decay must be at least 0, got {self.weight_decay}")
        _check(math.isfinite(self.weight_decay), f"--weight-decay must be a finite number, got {self.weight_decay}")
        _check(0 <= self.beta2 < 1, f"beta2 must be in [0, 1), got {self.beta2}")
        _check(self.grad_clip > 0, f"gradient clipping must be positive, got {self.grad_clip}")
        _check(
            self.eval_interval is None or 1 <= self.eval_interval <= MAX_STEPS,
            f"--eval-interval must be between 1 and 10^12, got {shown(self.eval_interval)}",
        )
        _check(
            1 <= self.eval_iters <= MAX_ITERS,
            f"--eval-iters must be between 1 and 1000000, got {shown(self.eval_iters)}",
        )
        _check(0 < self.val_fraction < 1, f"--val-fraction must be between 0 and 1, got {self.val_fraction}")
        _check(self.device in DEVICES, f"unknown --device {shown(self.device)}: choose auto, cpu or cuda")
        _check(
            0 <= self.sample_tokens <= MAX_ITERS,
            f"--sample-tokens must be between 0 and 1000000, got {shown(self.sample_tokens)}",
        )
        _check(
            0 < self.distill_temperature <= 100,
            f"--distill-temperature must be above 0 and at most 100, got {self.distill_temperature}",
        )
        _check(0 <= self.distill_weight <= 1, f"--distill-weight must be between 0 and 1, got {self.distill_weight}")
        _check_paths(self, "teacher")
        check_seed(self.seed)
        return self

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> TrainConfig:
        return _from_dict(cls, d)


NONE_WORDS = ("none", "off", "random")  # typed for a setting that may be empty (a seed, the stop strings)


@dataclass
class SampleConfig:
    """How a prompt is read and each next token picked: the flags of sample, chat and compare, and chat's /set."""

    temperature: float = flag(0.8, "0: greedy (always the most likely token).", short="t", example="0.8")
    top_k: int = flag(0, "Keep the k most likely tokens (0: off).", example="40")
    top_p: float = flag(1.0, "Nucleus: keep tokens up to this probability (1: off).", example="0.9")
    repetition_penalty: float = flag(1.0, ">1 discourages repeating tokens.", example="1.2")
    max_tokens: int = flag(500, "New tokens to generate.", short="n", example="300")
    stop: list[str] = flag(
        None,
        r"Stop at this text (cut off); repeatable; \n and \t are escapes.",
        parse=unescape,
        example=r"\n\n (or none)",
        default_factory=list,
    )
    seed: int | None = flag(None, "Same seed, same text [default: random].", example="42 (or none)")
    unknown: str = unknown_flag(example="drop")

    def validate(self) -> SampleConfig:
        _check_types(self)
        _check(
            isinstance(self.temperature, (int, float)) and 0 <= self.temperature <= 100,
            f"temperature must be between 0 and 100, got {self.temperature}",
        )
        _check(self.top_k >= 0, f"top_k must be 0 (off) or more, got {self.top_k}")
        _check(0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}")
        _check(
            0 < self.repetition_penalty <= 10, f"repetition_penalty must be in (0, 10], got {self.repetition_penalty}"
        )
        _check(self.max_tokens >= 0, f"max_tokens must be 0 or more, got {self.max_tokens}")
        _check(all(isinstance(s, str) and s for s in self.stop), "stop strings must not be empty")
        _check(self.seed is None or 0 <= self.seed < 2**63, f"seed must be between 0 and 2^63 - 1, got {self.seed}")
        _check(self.unknown in UNKNOWN, f"unknown must be one of {', '.join(UNKNOWN)}, got {self.unknown!r}")
        return self

    def plain(self, vocab_size: int) -> bool:
        """Only the temperature shapes the next token's distribution: every other setting that could is off
        (top-k keeping the whole vocabulary counts as off). The sampler's fast path; a new field is taken to
        shape the distribution unless it is listed in NOT_SHAPING."""
        return (self.top_k == 0 or self.top_k >= vocab_size) and all(
            getattr(self, name) == default for name, default in _SHAPING
        )

    def to_dict(self) -> dict:
        return asdict(self)


NOT_SHAPING = ("temperature", "top_k", "max_tokens", "stop", "seed", "unknown")  # (top_k: see plain())
_SHAPING = [(f.name, f.default) for f in fields(SampleConfig) if f.name not in NOT_SHAPING]


@dataclass
class ViewConfig:
    """What part of a text the viewers show: the flags attn and gates share, and the words of /attn and /gates."""

    layer: int | None = flag(None, "Layer (from 0) [default: the last].", positional=True)
    tokens: int | None = flag(None, "How many tokens to show [default: as many as fit].")
    end: int | None = flag(None, "Show the tokens before this position [default: the end].")
    ascii: bool = flag(False, "Plain ASCII shades and labels.")

    def validate(self):
        _check(self.tokens is None or self.tokens >= 1, f"tokens must be at least 1, got {self.tokens}")
        return self


@dataclass
class AttnConfig(ViewConfig):
    head: int | None = flag(None, "Head (from 0) [default: the mean over heads].", positional=True)
    mean: bool = flag(False, "The mean over the layer's heads.")
    overview: bool = flag(False, "Every layer × head as small maps.")
    stats: bool = flag(False, "Entropy and mean distance of every head.")
    focus: str | None = flag(
        None,
        "What one token looked at: a position (negative: from the end), or text (its last occurrence's last "
        "token) [default in chat: the last token].",
    )
    top: int = flag(10, "Keys listed by --focus.")
    scale: str = flag("row", "Shade by each row's largest weight, or absolute (1 = darkest).", choices=("row", "abs"))

    @property
    def show_map(self) -> bool:
        # the map unless another view is asked for (the layer/head choice then applies to the focus view)
        return not (self.overview or self.stats or self.focus is not None)

    def validate(self) -> AttnConfig:
        super().validate()
        _check(
            not (self.overview and (self.layer is not None or self.head is not None or self.mean)),
            "overview shows every head: drop the layer/head/mean choice, or drop overview",
        )
        _check(not (self.head is not None and self.mean), "choose one head or the mean over heads, not both")
        _check(self.top >= 1, f"top must be at least 1, got {self.top}")
        return self


def parse_units(text: str) -> int | list[int]:
    """'8' -> the 8 units that change most; '3,17,42' (or '5,') -> exactly those."""
    try:
        if "," in text:
            return [int(u) for u in text.split(",") if u.strip()]
        return int(text)
    except ValueError:
        raise ConfigError(f"units must be a count like 8 or a list like 3,17,42, got '{text}'") from None


@dataclass
class GatesConfig(ViewConfig):
    units: int | list[int] | None = flag(
        None, "How many units (those whose gates change most; default 8), or which: 3,17,42.", parse=parse_units
    )

    def validate(self) -> GatesConfig:
        super().validate()
        _check(self.units != [], "give at least one unit")
        return self


@dataclass
class PlotConfig:
    """What `charlm plot` draws."""

    y: str = flag(
        "bpc", "Bits per character (comparable across tokenizers), or loss in nats per token.", choices=("bpc", "loss")
    )
    x: str = flag("step", "Optimizer steps, or training time.", choices=("step", "time"))
    width: int | None = flag(None, "Width in characters [default: the terminal's, at most 120].")
    height: int = flag(20, "Height in lines.")

    def validate(self) -> PlotConfig:
        _check_types(self)
        _check(self.width is None or self.width >= 30, f"--width must be at least 30, got {self.width}")
        _check(self.height >= 8, f"--height must be at least 8, got {self.height}")
        return self


@dataclass
class LabConfig:
    """How `charlm lab NAME` runs an experiment (charlm.lab.run_experiment) and draws it."""

    quick: bool = flag(False, "Test size: seconds instead of minutes.")
    seed: int = flag(0, "Same seed, same table.")
    seeds: int = flag(1, "Train each model with this many seeds (--seed, --seed + 1, ...); the table shows every one.")
    out: str | None = flag(None, "Where the lab's models are saved, as normal runs [default: checkpoints/lab].")
    text: str | None = flag(None, "ablate: the text scored [default: the run's corpus.txt].")
    plain: bool = flag(False, "A chart without colours (series told apart by their markers).")
    device: str = device_flag()

    def validate(self) -> LabConfig:
        _check_types(self)
        check_seed(self.seed)
        _check(1 <= self.seeds <= 100, f"--seeds must be between 1 and 100, got {self.seeds}")
        _check_paths(self, "out", "text")
        return self


# ---- the rest of each command's flags: what it reads, where it runs, what it prints ----------------------


@dataclass
class TrainOptions:
    """`charlm train`'s flags that are not the run's settings (a checkpoint records those: ModelConfig,
    TrainConfig)."""

    preset: str | None = flag(
        None,
        "Model size and batch/lr defaults [default: tiny on CPU, small on CUDA].",
        choices=PRESETS,
        section="Model",
    )
    out: str | None = flag(None, "Run directory [default: checkpoints/<corpus>-<model>-<tokenizer>].", section="Run")
    resume: bool = flag(False, "Continue the run in --out from its last checkpoint.", section="Run")
    nproc: int | None = flag(
        None, "Train with N processes (DistributedDataParallel): starts torchrun for you.", section="Run"
    )

    def validate(self) -> TrainOptions:
        _check_types(self)
        _check_paths(self, "out")
        return self


@dataclass
class PromptOptions:
    """Where a command's text comes from (commands.generate.read_prompt)."""

    prompt: str | None = flag(None, "The text [default: --prompt-file, else stdin when piped, else none].", short="p")
    prompt_file: str | None = flag(None, "Read the text from this file ('-': stdin).")

    def validate(self):
        _check_types(self)
        _check(self.prompt is None or self.prompt_file is None, "give --prompt or --prompt-file, not both")
        _check_paths(self, "prompt_file")
        return self


@dataclass
class SampleOptions:
    """`charlm sample`'s flags beside its prompt and its SampleConfig."""

    num_samples: int = flag(1, "Samples, separated by a line '---'.")
    echo: bool = flag(True, "Print the prompt before its continuation.")
    stats: bool = flag(False, "One JSON line on stderr: tokens, seconds, tokens_per_s, ttft_ms.")
    no_cache: bool = no_cache_flag()
    device: str = device_flag()

    def validate(self) -> SampleOptions:
        _check_types(self)
        _check(self.num_samples >= 1, f"--num-samples must be at least 1, got {self.num_samples}")
        return self


@dataclass
class ChatOptions:
    """`charlm chat`'s flags beside its SampleConfig."""

    mode: str = flag("fresh", "Each prompt starts anew, or continues the running text.", choices=("fresh", "continue"))
    no_cache: bool = no_cache_flag()
    device: str = device_flag()

    def validate(self) -> ChatOptions:
        _check_types(self)
        return self


@dataclass
class LookOptions(PromptOptions):
    """The text attn and gates read, and how wide they draw (their views: AttnConfig, GatesConfig)."""

    width: int | None = flag(None, "Width in characters [default: the terminal's].")
    unknown: str = unknown_flag()

    def validate(self) -> LookOptions:
        super().validate()
        _check(self.width is None or self.width >= 20, f"--width must be at least 20, got {self.width}")
        return self


@dataclass
class ExploreOptions(PromptOptions):
    """`charlm explore`'s flags beside its text (a TEXT argument, --prompt or --prompt-file)."""

    screenshot: str | None = flag(None, "Render the first screen to this SVG file and exit (no terminal needed).")
    size: str = flag("100x30", "--screenshot's size in columns x rows.")
    unknown: str = unknown_flag()

    def validate(self) -> ExploreOptions:
        super().validate()
        _check_paths(self, "screenshot")
        _check(bool(re.fullmatch(r"\d+x\d+", self.size)), f"--size must be COLUMNSxROWS like 100x30, got '{self.size}'")
        w, h = self.columns_rows
        _check(40 <= w <= 400 and 12 <= h <= 200, f"--size must be 40x12 to 400x200, got {self.size}")
        return self

    @property
    def columns_rows(self) -> tuple[int, int]:
        w, h = self.size.split("x")
        return int(w), int(h)


@dataclass
class EvalOptions:
    """How `charlm eval` reads its text."""

    stride: int | None = flag(None, "Transformer: tokens each window advances [default: context/2].")
    unknown: str = unknown_flag()
    device: str = device_flag()

    def validate(self) -> EvalOptions:
        _check_types(self)
        return self


BITS = (32, 16, 8, 4)  # what charlm compress stores a weight in: float32, bf16, int8, int4


@dataclass
class CompressOptions:
    """How `charlm compress` makes a smaller run, and how it measures it."""

    to: str | None = flag(None, "Directory of the compressed run (every command opens it).")
    bits: int = flag(
        32, "Bits per stored weight: 32 (float32), 16 (bf16), 8 (int8 per output channel), 4 (int4 per group of 32)."
    )
    drop_heads: int = flag(0, "Transformer: drop this many heads of each layer, the least important (measured).")
    drop_units: int = flag(0, "LSTM/GRU: drop this many hidden units of each layer, the least important (measured).")
    report: bool = flag(False, "Measure every method at a few settings, one table (writes nothing).")
    text: str | None = flag(None, "The text scored [default: the validation part of the run's corpus].")
    tokens: int = flag(32768, "Tokens of the text scored (and 1/8 of them to measure importance).")

    def validate(self) -> CompressOptions:
        _check_types(self)
        _check_paths(self, "to", "text")
        _check(self.bits in BITS, f"--bits must be one of {', '.join(map(str, BITS))}, got {self.bits}")
        _check(self.drop_heads >= 0, f"--drop-heads must be 0 or more, got {self.drop_heads}")
        _check(self.drop_units >= 0, f"--drop-units must be 0 or more, got {self.drop_units}")
        _check(self.tokens >= 64, f"--tokens must be at least 64, got {self.tokens}")
        _check(self.report or self.to is not None, "give --to DIR (where the compressed run goes), or --report")
        _check(
            not (self.report and (self.to or self.bits != 32 or self.drop_heads or self.drop_units)),
            "--report measures every setting itself and writes nothing: drop --to, --bits and --drop-*",
        )
        return self


@dataclass
class CompareOptions:
    """`charlm compare`'s flags beside its SampleConfig."""

    prompt: str = flag("", "Text every model continues [default: none].", short="p")
    eval_file: str | None = flag(None, "Also show each model's bits/char on this text.", name="eval")
    interactive: bool = flag(False, "A prompt loop: each prompt goes to every model.", short="i")
    device: str = device_flag()

    def validate(self) -> CompareOptions:
        _check_types(self)
        _check_paths(self, "eval_file")
        return self


def from_text(f, text: str):
    """The value a user typed for the field f (a flag, or a word after /set, /attn, /gates)."""
    if f.metadata.get("parse"):
        try:
            return f.metadata["parse"](text)
        except ValueError as e:
            raise ConfigError(str(e) if isinstance(e, ConfigError) else f"{text!r} is not a valid {f.name}") from None
    kind = str(f.type)
    if "None" in kind and text.lower() in NONE_WORDS:
        return None
    if f.metadata.get("choices"):
        _check(text in f.metadata["choices"], f"{f.name} takes {', '.join(f.metadata['choices'])}, not {text!r}")
        return text
    for name, convert, what in (("float", float, "a number"), ("int", int, "a whole number")):
        if kind.startswith(name):
            try:
                return convert(text)
            except ValueError:
                raise ConfigError(f"{f.name} must be {what}, got {text!r}") from None
    return text


def flag_fields(cls) -> list:
    """The fields of a config class that have a flag, in order."""
    return [f for f in fields(cls) if flag_name(f)]


# Sizes for each model family. Explicit CLI flags override these. The tiny presets are tuned for a
# 2-core laptop CPU and a two-minute run (benchmarks/RESULTS.md has the measurements).
PRESET_TABLE: dict[str, dict[str, dict]] = {
    "transformer": {
        "tiny": dict(n_layers=4, d_model=128, n_heads=4, context=64, dropout=0.0, batch_size=16, lr=8e-3),
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
PRESET_USE = {  # what each preset is for: --preset's choices, in --help
    "tiny": "a laptop CPU and minutes (the default on CPU)",
    "small": "one GPU (the default on CUDA)",
    "medium": "a larger GPU run",
}


def describe_presets() -> list[tuple[str, str]]:
    """(name, what it sets for each model family) of every preset (train --help)."""

    def sizes(s: dict) -> str:
        heads = f", {s['n_heads']} heads" if "n_heads" in s else ""
        return (
            f"{s['n_layers']} layers × {s['d_model']}{heads}, context {s['context']}, dropout {s['dropout']:g}, "
            f"batch {s['batch_size']}, lr {s['lr']:g}"
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
    train = TrainConfig(**{**train_preset, **{k: v for k, v in given.items() if k not in model_keys}}).validate()
    return model, train


def preset(kind: str, name: str) -> tuple[dict, dict]:
    """(model settings, train settings) of a preset."""
    _check(kind in MODEL_KINDS, f"unknown model '{kind}': choose one of {', '.join(MODEL_KINDS)}")
    _check(name in PRESETS, f"unknown preset '{name}': choose one of {', '.join(PRESETS)}")
    table = PRESET_TABLE[kind][name]
    model = {k: v for k, v in table.items() if k in MODEL_KEYS}
    train = {k: v for k, v in table.items() if k not in MODEL_KEYS}
    return model, train
