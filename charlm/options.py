"""What each command takes beside the run's settings (config.py): what attn and gates show (AttnConfig,
GatesConfig; also the words of chat's /attn and /gates), what plot draws and how lab runs (PlotConfig,
LabConfig), and the *Options classes -- the rest of each command's flags (the prompt, the device, --out...).
Every field is its flag (charlm.settings.flag); each class validates itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from charlm.config import device_flag, unknown_flag
from charlm.errors import ConfigError
from charlm.presets import PRESETS
from charlm.settings import SEEDS, Range, Validated, check, check_paths, flag


def no_cache_flag():
    return flag(False, "Recompute the whole text for every token (slow: to compare).")


@dataclass
class ViewConfig(Validated):
    """What part of a text the viewers show: the flags attn and gates share, and the words of /attn and /gates."""

    layer: int | None = flag(None, "Layer (from 0) [default: the last].", positional=True)
    tokens: int | None = flag(None, "How many tokens to show [default: as many as fit].", range=Range(1))
    end: int | None = flag(None, "Show the tokens before this position [default: the end].")
    ascii: bool = flag(False, "Plain ASCII shades and labels.")


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
    top: int = flag(10, "Keys listed by --focus.", range=Range(1))
    scale: str = flag("row", "Shade by each row's largest weight, or absolute (1 = darkest).", choices=("row", "abs"))

    @property
    def show_map(self) -> bool:
        # the map unless another view is asked for (the layer/head choice then applies to the focus view)
        return not (self.overview or self.stats or self.focus is not None)

    def validate(self) -> AttnConfig:
        super().validate()
        check(
            not (self.overview and (self.layer is not None or self.head is not None or self.mean)),
            "overview shows every head: drop the layer/head/mean choice, or drop overview",
        )
        check(not (self.head is not None and self.mean), "choose one head or the mean over heads, not both")
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
        check(self.units != [], "give at least one unit")
        return self


@dataclass
class PlotConfig(Validated):
    """What `charlm plot` draws."""

    y: str = flag(
        "bpc", "Bits per character (comparable across tokenizers), or loss in nats per token.", choices=("bpc", "loss")
    )
    x: str = flag("step", "Optimizer steps, or training time.", choices=("step", "time"))
    width: int | None = flag(None, "Width in characters [default: the terminal's, at most 120].", range=Range(30))
    height: int = flag(20, "Height in lines.", range=Range(8))


@dataclass
class LabConfig(Validated):
    """How `charlm lab NAME` runs an experiment (charlm.lab.run_experiment) and draws it."""

    quick: bool = flag(False, "Test size: seconds instead of minutes.")
    seed: int = flag(0, "Same seed, same table.", range=SEEDS)
    seeds: int = flag(
        1,
        "Train each model with this many seeds (--seed, --seed + 1, ...); the table shows every one.",
        range=Range(1, 100),
    )
    out: str | None = flag(None, "Where the lab's models are saved, as normal runs [default: checkpoints/lab].")
    text: str | None = flag(None, "ablate: the text scored [default: the run's corpus.txt].")
    task: str | None = flag(
        None, "width: the task measured against width [default: recall].", choices=("recall", "copy")
    )
    plain: bool = flag(False, "A chart without colours (series told apart by their markers).")
    device: str = device_flag()

    def validate(self) -> LabConfig:
        check_paths(self, "out", "text")
        return self


# ---- the rest of each command's flags: what it reads, where it runs, what it prints ----------------------


@dataclass
class TrainOptions(Validated):
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
        check_paths(self, "out")
        return self


@dataclass
class PromptOptions(Validated):
    """Where a command's text comes from (commands.generate.read_prompt)."""

    prompt: str | None = flag(None, "The text [default: --prompt-file, else stdin when piped, else none].", short="p")
    prompt_file: str | None = flag(None, "Read the text from this file ('-': stdin).")

    def validate(self):
        check(self.prompt is None or self.prompt_file is None, "give --prompt or --prompt-file, not both")
        check_paths(self, "prompt_file")
        return self


@dataclass
class SampleOptions(Validated):
    """`charlm sample`'s flags beside its prompt and its SampleConfig."""

    num_samples: int = flag(1, "Samples, separated by a line '---'.", range=Range(1))
    echo: bool = flag(True, "Print the prompt before its continuation.")
    stats: bool = flag(False, "One JSON line on stderr: tokens, seconds, tokens_per_s, ttft_ms.")
    no_cache: bool = no_cache_flag()
    device: str = device_flag()


@dataclass
class ChatOptions(Validated):
    """`charlm chat`'s flags beside its SampleConfig."""

    mode: str = flag("fresh", "Each prompt starts anew, or continues the running text.", choices=("fresh", "continue"))
    no_cache: bool = no_cache_flag()
    device: str = device_flag()


@dataclass
class LookOptions(PromptOptions):
    """The text attn and gates read, and how wide they draw (their views: AttnConfig, GatesConfig)."""

    width: int | None = flag(None, "Width in characters [default: the terminal's].", range=Range(20))
    unknown: str = unknown_flag()


@dataclass
class ExploreOptions(PromptOptions):
    """`charlm explore`'s flags beside its text (a TEXT argument, --prompt or --prompt-file)."""

    screenshot: str | None = flag(None, "Render the first screen to this SVG file and exit (no terminal needed).")
    size: str = flag("100x30", "--screenshot's size in columns x rows.")
    unknown: str = unknown_flag()

    def validate(self) -> ExploreOptions:
        super().validate()
        check_paths(self, "screenshot")
        check(bool(re.fullmatch(r"\d+x\d+", self.size)), f"--size must be COLUMNSxROWS like 100x30, got '{self.size}'")
        w, h = self.columns_rows
        check(40 <= w <= 400 and 12 <= h <= 200, f"--size must be 40x12 to 400x200, got {self.size}")
        return self

    @property
    def columns_rows(self) -> tuple[int, int]:
        w, h = self.size.split("x")
        return int(w), int(h)


@dataclass
class EvalOptions(Validated):
    """How `charlm eval` reads its text."""

    stride: int | None = flag(None, "Transformer: tokens each window advances [default: context/2].")
    unknown: str = unknown_flag()
    device: str = device_flag()


BITS = (32, 16, 8, 4)  # what charlm compress stores a weight in: float32, bf16, int8, int4


@dataclass
class CompressOptions(Validated):
    """How `charlm compress` makes a smaller run, and how it measures it."""

    to: str | None = flag(
        None, "Directory of the compressed run (every command opens it) [default: beside the run, e.g. RUN-int4]."
    )
    bits: int = flag(
        32, "Bits per stored weight: 32 (float32), 16 (bf16), 8 (int8 per output channel), 4 (int4 per group of 32)."
    )
    drop_heads: int = flag(
        0, "Transformer: drop this many heads of each layer, the least important (measured).", range=Range(0)
    )
    drop_units: int = flag(
        0, "LSTM/GRU: drop this many hidden units of each layer, the least important (measured).", range=Range(0)
    )
    report: bool = flag(False, "Measure every method at a few settings, one table (writes nothing).")
    text: str | None = flag(None, "The text scored [default: the validation part of the run's corpus].")
    tokens: int = flag(32768, "Tokens of the text scored (and 1/8 of them to measure importance).", range=Range(64))

    def validate(self) -> CompressOptions:
        check_paths(self, "to", "text")
        check(self.bits in BITS, f"--bits must be one of {', '.join(map(str, BITS))}, got {self.bits}")
        if self.report:  # (short: the terminal folds a line past 80 columns mid-word)
            given = [f"--{name}" for name, value in self._writing().items() if value]
            why = "measures every setting and writes nothing" if len(given) < 2 else "writes nothing"
            check(not given, f"--report {why}: drop {', '.join(given)}")
        return self

    def _writing(self) -> dict:
        """The flags that say what to write (--report takes none)."""
        return {"to": self.to, "bits": self.bits if self.bits != 32 else None} | {
            "drop-heads": self.drop_heads,
            "drop-units": self.drop_units,
        }


@dataclass
class CompareOptions(Validated):
    """`charlm compare`'s flags beside its SampleConfig."""

    prompt: str = flag("", "Text every model continues [default: none].", short="p")
    eval_file: str | None = flag(None, "Also show each model's bits/char on this text.", name="eval")
    interactive: bool = flag(False, "A prompt loop: each prompt goes to every model.", short="i")
    device: str = device_flag()

    def validate(self) -> CompareOptions:
        check_paths(self, "eval_file")
        return self
