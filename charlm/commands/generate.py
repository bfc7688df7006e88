"""`charlm sample` as a function: a checkpoint's continuations of a prompt, streamed piece by piece."""

from __future__ import annotations

import copy
import sys
from collections.abc import Iterator
from dataclasses import dataclass

from charlm import files
from charlm.config import SampleConfig
from charlm.errors import ConfigError
from charlm.generate import Stats, Streamer
from charlm.options import PromptOptions, SampleOptions
from charlm.runtime import pick_device
from charlm.storage import checkpoint


@dataclass
class Continuation:
    """One sample: the prompt as the model reads it (characters it never saw dropped or replaced, as
    settings.unknown says), then its continuation as it is generated. stats: complete once pieces is."""

    prompt: str
    prompt_tokens: int
    pieces: Iterator[str]
    streamer: Streamer

    @property
    def stats(self) -> Stats:
        return self.streamer.stats


def sample(ckpt: str, prompt: str, settings: SampleConfig, opts: SampleOptions | None = None) -> Iterator[Continuation]:
    """opts.num_samples continuations of prompt by the checkpoint (a file or a run directory). With a seed,
    sample i uses seed + i: the same seed gives the same samples."""
    opts = opts or SampleOptions()
    ck = checkpoint.load(ckpt, device=pick_device(opts.device))
    ids = ck.tokenizer.encode(prompt, unknown=settings.unknown)
    shown = ck.tokenizer.decode(ids)
    streamer = Streamer(ck.model, ck.tokenizer, use_cache=not opts.no_cache)
    for i in range(opts.num_samples):
        run = copy.copy(settings)  # settings with the seed moved on: checked when made (seed + i may pass 2^63 - 1)
        run.seed = None if settings.seed is None else settings.seed + i
        streamer.reset()
        yield Continuation(shown, len(ids), streamer.stream(ids, run), streamer)


MAX_PROMPT_BYTES = 16 << 20  # far beyond any context: a prompt is cut to the model's context anyway


def read_prompt(where: PromptOptions) -> str:
    """The text a command reads: --prompt, else the file --prompt-file names ('-': stdin), else stdin when
    it is piped, else none."""
    prompt, prompt_file = where.prompt, where.prompt_file
    if prompt is not None:
        return prompt
    if prompt_file is None and sys.stdin.isatty():
        return ""
    piped = prompt_file in (None, "-")
    where = "stdin" if piped else prompt_file
    try:  # at most MAX_PROMPT_BYTES: `yes |` or /dev/zero never end
        if piped:
            raw = sys.stdin.buffer.read(MAX_PROMPT_BYTES + 1)
        else:
            # a plain open, unlike files.open_read: a pipe named by the user (<(cmd), /dev/stdin) is read
            with open(prompt_file, "rb") as f:
                raw = f.read(MAX_PROMPT_BYTES + 1)
        if len(raw) > MAX_PROMPT_BYTES:
            raise ConfigError(
                f"--prompt-file: {where} holds more than {MAX_PROMPT_BYTES >> 20} MB of text: give a shorter one"
            )
        return raw.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")  # as text mode reads it
    except FileNotFoundError:
        raise ConfigError(f"--prompt-file: no such file {prompt_file}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"--prompt-file: {where} is not UTF-8 text") from None
    except OSError as e:
        raise ConfigError(f"--prompt-file: cannot read {prompt_file} ({files.reason(e)})") from None
