"""The settings of a run: the model (ModelConfig), its training (TrainConfig), and how a model samples
(SampleConfig) -- what charlm train, sample, chat and compare take, and what a checkpoint records. Each field
is also its flag (charlm.settings.flag). Each config validates itself and raises ConfigError with a message a
user can act on; configs travel inside checkpoints as plain dicts (to_dict / from_dict).

What each command takes beside these is in options.py; the presets' sizes in presets.py.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field, fields

from charlm.settings import (
    SEEDS,
    Range,
    Validated,
    check,
    check_fields,
    check_paths,
    flag,
    from_dict,
    internal,
    parse_duration,
    shown,
    unescape,
)

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
OPTIMIZERS = ("muon", "adamw")
PRECISIONS = ("auto", "fp32", "bf16")
DEVICES = ("auto", "cpu", "cuda")
UNKNOWN = ("error", "drop", "replace")  # what to do with characters a char tokenizer never saw
MAX_BATCH = 65536  # sequences per micro-batch: beyond this, memory and int32 indexing give out long before
DEFAULT_MAX_TIME = 120.0  # seconds: what `charlm train` trains for when given neither --steps nor --max-time
MIN_DISTILL_T = 0.1  # --distill-temperature: below it the soft targets are the argmax (its Range)
NO_STEP_LIMIT = 1_000_000_000  # the steps of a run with only a time budget
# the largest counts a run's flags take: far beyond any run, and numbers every checkpoint can hold (64 bits)
MAX_STEPS = 10**12
MAX_ITERS = 10**6  # --eval-iters and --sample-tokens: each is work done at every evaluation
MAX_TIME = 10**9  # seconds (about 31 years)


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


def shape_words(
    layers: int,
    width: int,
    context: int,
    heads: int | None = None,
    mlp_ratio: int | None = None,
    qk_norm: bool = False,
    positions: str | None = None,
    smear: bool = False,
    tied: bool = True,
) -> str:
    """A model's shape in the one wording of train's header, `info` and --help's presets: "3 layers × 128, 4 heads,
    MLP ×3, QK-norm, smear, untied head, rope positions, context 64" (heads and what follows them: a
    Transformer's)."""
    words = [f"{layers} layer{'s' * (layers != 1)} × {width}"]
    if heads:
        words += [f"{heads} heads", f"MLP ×{mlp_ratio}"] + ["QK-norm"] * bool(qk_norm) + ["smear"] * bool(smear)
        words += ["untied head"] * (not tied)
        words += [f"{positions} positions"] if positions else []
    return ", ".join([*words, f"context {context}"])


@dataclass
class ModelConfig:  # not Validated: vocab_size is known only once the tokenizer is (validate() then)
    kind: str = flag("transformer", "Model family.", name="model", choices=MODEL_KINDS, section="Model")
    vocab_size: int = internal(0, range=Range(2, 10**7), what="vocabulary size")  # set from the tokenizer
    # sizes are bounded for every kind, used or not: a checkpoint records them all (and holds numbers of 64 bits)
    n_layers: int = flag(4, "Number of layers.", name="layers", from_preset=True, section="Model", range=Range(1, 64))
    d_model: int = flag(
        128,
        "Transformer width; LSTM/GRU hidden (and embedding) size.",
        from_preset=True,
        section="Model",
        range=Range(1, 16384),
    )
    n_heads: int = flag(
        4,
        "Attention heads (transformer).",
        name="heads",
        from_preset=True,
        applies_to="transformer",
        section="Model",
        range=Range(1, 16384),
    )
    context: int = flag(
        128,
        "Context length in tokens (the transformer's maximum).",
        from_preset=True,
        section="Model",
        range=Range(2, 65536),
    )
    dropout: float = flag(
        0.0, "Dropout probability while training.", from_preset=True, section="Model", range=Range(0, 1, high_open=True)
    )
    positions: str = flag(
        "rope",
        "Transformer positions: rope (rotated queries and keys: relative), alibi (a per-head penalty linear in "
        "distance: relative), nope (none: the causal mask alone), learned or sinusoidal (vectors added: absolute).",
        choices=POSITIONS,
        applies_to="transformer",
        section="Model",
    )
    mlp_ratio: int = flag(
        4,
        "The MLP's hidden width, in multiples of the model's width (transformer).",
        from_preset=True,
        applies_to="transformer",
        section="Model",
        range=Range(1, 16),
    )
    qk_norm: bool = flag(  # as in OLMo 2 and the modded-nanoGPT speedrun; the tiny preset learns faster with it
        False,
        "Scale each head's queries and keys to unit RMS before attention (QK-norm; transformer).",
        from_preset=True,
        applies_to="transformer",
        section="Model",
    )
    smear: bool = flag(  # as in the modded-nanoGPT speedrun (a vector, not its gate); the tiny preset learns faster
        False,
        "Add to each token's embedding a learned share of the previous token's, per channel (smear; transformer).",
        from_preset=True,
        applies_to="transformer",
        section="Model",
    )
    # the output head reads the embedding table (GPT-2's tying); False: a head of its own (the tiny preset, which
    # learns faster with it beside smear; the lab's recall and copy models: with a tied head the current key's own
    # embedding pulls the answer toward the key itself)
    tied: bool = flag(
        True,
        "Let the output head read the embedding table (GPT-2's weight tying) instead of a matrix of its own "
        "(transformer).",
        from_preset=True,
        applies_to="transformer",
        section="Model",
    )
    # a pruned model's sizes (charlm compress drops heads or units): None means the usual d_model // n_heads and
    # d_model. A transformer that lost heads keeps their size: its attention is n_heads × head_dim wide
    head_dim: int | None = internal(None, applies_to="transformer", range=Range(1, 16384), what="head size")
    # an LSTM/GRU's hidden size (its embedding stays d_model)
    hidden: int | None = internal(None, range=Range(1, 16384), what="hidden size")

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
        """The model's shape in a few words: "transformer (3 layers × 128, 4 heads, MLP ×3, QK-norm, smear, untied
        head, context 64)"."""
        tf = self.applies("n_heads")
        shape = shape_words(
            self.n_layers,
            self.d_model,
            self.context,
            self.n_heads if tf else None,
            self.mlp_ratio,
            self.qk_norm,
            smear=self.smear,
            tied=self.tied,
        )
        return f"{self.kind} ({shape})"

    def validate(self) -> ModelConfig:
        check_fields(self)
        check(
            self.head_dim is None or self.n_heads * self.head_dim <= 16384,
            f"--heads × head size must be at most 16384, got {self.n_heads} × {self.head_dim}",
        )
        if self.applies("n_heads"):  # the transformer's own fields
            check(
                self.head_dim is not None or self.d_model % self.n_heads == 0,
                f"--d-model {self.d_model} is not divisible by --heads {self.n_heads}: pick sizes where it is (e.g. 128 and 4)",
            )
            check(
                self.positions != "rope" or self.head_size % 2 == 0,
                f"rope needs an even head size, but --d-model {self.d_model} / --heads {self.n_heads} = {self.head_size}",
            )
        return self

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> ModelConfig:
        return from_dict(cls, d)


@dataclass
class TrainConfig(Validated):
    tokenizer: str = flag(
        "char", "Character-level, or byte-level BPE trained on the corpus.", choices=TOKENIZERS, section="Data"
    )
    # the BPE tokenizer's target size (ModelConfig.vocab_size is the real one, the tokenizer's)
    bpe_vocab: int = flag(1024, "BPE vocabulary size.", name="vocab-size", applies_to="bpe", section="Data")
    batch_size: int = flag(
        32, "Sequences per micro-batch and process.", from_preset=True, section="Optimisation", range=Range(1)
    )
    grad_accum: int = flag(
        1,
        "Micro-batches per optimizer step: effective batch = batch size × grad accum × processes.",
        section="Optimisation",
        range=Range(1, 65536),
    )
    lr: float = flag(
        3e-3,
        "Peak learning rate.",
        from_preset=True,
        section="Optimisation",
        range=Range(0, 10, low_open=True, high_open=True, text="a positive learning rate below 10"),
    )
    min_lr_ratio: float = internal(0.1, range=Range(0, 1), what="min lr ratio")  # cosine decays to lr * this
    warmup: int = flag(100, "Warmup steps.", section="Optimisation", range=Range(0, MAX_STEPS))
    optimizer: str = flag(
        "muon",
        "muon: Muon for hidden matrices + AdamW for the rest; adamw: AdamW for all.",
        choices=OPTIMIZERS,
        section="Optimisation",
    )
    muon_lr: float = flag(
        0.02,
        "Muon's peak learning rate (it follows the same schedule).",
        section="Optimisation",
        range=Range(0, 10, low_open=True, high_open=True, text="positive and below 10"),
    )
    muon_momentum: float = flag(
        0.95,
        "Muon's momentum (the share of the last update its next one keeps).",
        from_preset=True,
        section="Optimisation",
        range=Range(0, 1, high_open=True),
    )
    muon_steps: int = flag(
        5,
        "Muon's Newton-Schulz iterations a step (how nearly orthogonal its update is).",
        from_preset=True,
        section="Optimisation",
        range=Range(1, 20),
    )
    weight_decay: float = flag(
        0.1, "AdamW weight decay of matrices and embeddings.", section="Optimisation", range=Range(0)
    )
    beta2: float = internal(0.99, range=Range(0, 1, high_open=True))
    grad_clip: float = internal(1.0, range=Range(0, low_open=True), what="gradient clipping")
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
        range=Range(1, MAX_STEPS),
    )
    # seconds; training stops (and the schedule ends) when it runs out
    max_time: float | None = flag(
        None,
        f"Time budget, e.g. 90s, 10m, 1m30s, 1h [default: {DEFAULT_MAX_TIME / 60:g}m unless --steps].",
        parse=lambda text: parse_duration(text, "--max-time"),
        resumable=True,
        derived=True,
        section="Run",
        range=Range(0, MAX_TIME, low_open=True, text=f"positive and at most {MAX_TIME:g}s (about 31 years)"),
    )
    eval_interval: int | None = flag(
        None,
        "Steps between evaluations [default: the first after 5% of the budget, "
        "then as often as costs ~5% of the time].",
        resumable=True,
        section="Run",
        range=Range(1, MAX_STEPS),
    )
    eval_iters: int = flag(20, "Batches per evaluation.", resumable=True, section="Run", range=Range(1, MAX_ITERS))
    val_fraction: float = internal(0.1, range=Range(0, 1, low_open=True, high_open=True))
    sample_tokens: int = flag(
        200,
        "Length of the samples shown at each evaluation and at the end (0: none).",
        resumable=True,
        section="Run",
        range=Range(0, MAX_ITERS),
    )
    seed: int = flag(1337, "Seed of the initial weights, the batches and dropout.", section="Run", range=SEEDS)
    device: str = device_flag(resumable=True, section="Run")
    compile: bool = flag(False, "torch.compile the model.", resumable=True, section="Run")
    # distillation (charlm.training.distill): the loss is (1 - w) CE + w T² KL(teacher_T || student_T); w = 0 trains
    # as usual
    teacher: str | None = flag(
        None, "Distil from this checkpoint (a file or run directory; same tokenizer).", section="Distillation"
    )
    # the sha256 of the teacher's file, which the run records (with teacher as its absolute path) once it has
    # loaded it: a resume distils from that file or refuses (distill.Teacher); never set by a caller
    teacher_sha256: str | None = field(default=None, metadata=dict(flag=False, recorded=True))
    distill_temperature: float = flag(
        2.0,
        "Temperature of the teacher's and student's distributions.",
        section="Distillation",
        # below 0.1 the soft targets are the teacher's argmax and the T²-scaled term is lost in rounding; at 1e-40,
        # logits / T overflow and the first step's loss is NaN
        range=Range(MIN_DISTILL_T, 100),
    )
    distill_weight: float = flag(
        0.5,
        "Share of the loss from the teacher's soft targets (0: ordinary training).",
        section="Distillation",
        range=Range(0, 1),
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
        check(
            (self.tokenizer != "bpe" or 257 <= self.bpe_vocab) and self.bpe_vocab <= 1_000_000,
            f"--vocab-size must be between 257 and 1000000 for BPE (it starts from 256 bytes), got {self.bpe_vocab}",
        )
        check(
            self.batch_size <= MAX_BATCH,
            f"--batch-size must be at most {MAX_BATCH}, got {self.batch_size}: "
            "--grad-accum gives larger effective batches",
        )
        check(math.isfinite(self.weight_decay), f"--weight-decay must be a finite number, got {self.weight_decay}")
        check_paths(self, "teacher")
        check(
            self.teacher_sha256 is None or re.fullmatch(r"[0-9a-f]{64}", self.teacher_sha256) is not None,
            f"the teacher's recorded sha256 is not one, got {shown(self.teacher_sha256)}",
        )
        return self

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> TrainConfig:
        if "vocab_size" in d and "bpe_vocab" not in d:  # checkpoints written before the field's rename
            d = {("bpe_vocab" if k == "vocab_size" else k): v for k, v in d.items()}
        return from_dict(cls, d)


NONE_WORDS = ("none", "off", "random")  # typed for a setting that may be empty (a seed, the stop strings)


@dataclass
class SampleConfig(Validated):
    """How a prompt is read and each next token picked: the flags of sample, chat and compare, and chat's /set."""

    temperature: float = flag(
        0.8, "0: greedy (always the most likely token).", short="t", example="0.8", range=Range(0, 100)
    )
    top_k: int = flag(0, "Keep the k most likely tokens (0: off).", example="40", range=Range(0))
    top_p: float = flag(
        1.0, "Nucleus: keep tokens up to this probability (1: off).", example="0.9", range=Range(0, 1, low_open=True)
    )
    repetition_penalty: float = flag(
        1.0, ">1 discourages repeating tokens.", example="1.2", range=Range(0, 10, low_open=True)
    )
    max_tokens: int = flag(500, "New tokens to generate.", short="n", example="300", range=Range(0))
    stop: list[str] = flag(
        None,
        r"Stop at this text (cut off); repeatable; \n and \t are escapes.",
        parse=unescape,
        example=r"\n\n (or none)",
        default_factory=list,
    )
    seed: int | None = flag(None, "Same seed, same text [default: random].", example="42 (or none)", range=SEEDS)
    unknown: str = unknown_flag(example="drop")

    def validate(self) -> SampleConfig:
        check(all(s for s in self.stop), "stop strings must not be empty")
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
