"""`charlm eval` as a function: a checkpoint's loss, perplexity and bits per character/byte on a text file."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from charlm.evaluate import EvalResult, Progress, evaluate_file
from charlm.options import EvalOptions
from charlm.runtime import pick_device
from charlm.storage import checkpoint
from charlm.storage.checkpoint import Checkpoint


@dataclass
class Evaluation:
    ckpt: Checkpoint
    file: Path
    result: EvalResult

    def summary(self) -> dict:
        """What `charlm eval --json` prints: the checkpoint's summary, the file, the scores."""
        return {
            "checkpoint": str(self.ckpt.path),
            **self.ckpt.saved.summary(),
            "file": str(self.file),
            **self.result.to_dict(),
        }


def evaluate(ckpt: str, file: str, opts: EvalOptions | None = None, progress: Progress | None = None) -> Evaluation:
    """Score the whole file (see charlm.evaluate for what is counted and how a text longer than the
    context is read). progress(done, total) as tokens are scored."""
    opts = opts or EvalOptions()
    ck = checkpoint.load(ckpt, device=pick_device(opts.device))
    result = evaluate_file(ck.model, ck.tokenizer, file, stride=opts.stride, unknown=opts.unknown, progress=progress)
    return Evaluation(ck, Path(file), result)
