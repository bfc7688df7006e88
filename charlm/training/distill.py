"""Distillation (Hinton et al. 2015): a student trained on a teacher's next-token distribution mixed with the
true next token. With weight w and temperature T, per scored position:

    loss = (1 - w) · CE(student, next token) + w · T² · KL(softmax(teacher / T) || softmax(student / T))

The T² keeps the soft term's gradients about as large as the hard term's whatever T is (they shrink as 1/T²).
The teacher's logits are computed on the fly, on the student's own batch (no cache: a teacher of the sizes
charlm trains costs about one more forward pass a step). The student must read the teacher's tokens: the same
tokenizer, which training on the teacher's corpus with its --tokenizer gives. With w = 0 the trainer never
loads a teacher and trains exactly as without one.

The run records its teacher as the absolute path of the checkpoint file and that file's sha256 (TrainConfig's
teacher and teacher_sha256): a resume, from whatever directory, distils from that same file, or refuses in
one line when it is gone or has changed.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F

from charlm import files
from charlm.config import ModelConfig, TrainConfig
from charlm.errors import ConfigError
from charlm.storage import checkpoint
from charlm.storage.runs import teacher_file


class Teacher:
    def __init__(self, cfg: TrainConfig, tokenizer, student: ModelConfig, device: str):
        self.file, self.sha256 = _identify(cfg)
        self.ck = checkpoint.load(self.file, device=device)
        self.weight, self.T = cfg.distill_weight, cfg.distill_temperature
        t = self.ck.tokenizer
        same = t.kind == tokenizer.kind and t.vocab_size == tokenizer.vocab_size
        if not (same and all(t.token_bytes(i) == tokenizer.token_bytes(i) for i in range(t.vocab_size))):
            raise ConfigError(
                f"--teacher {cfg.teacher}: its tokenizer ({t.kind}, {t.vocab_size} tokens) is not the student's "
                f"({tokenizer.kind}, {tokenizer.vocab_size}): train on the teacher's corpus with its --tokenizer"
            )
        window = self.ck.model.window
        if window is not None and window < student.context:
            raise ConfigError(
                f"--teacher {cfg.teacher} sees {window} tokens at once, fewer than the student's --context "
                f"{student.context}: give the student --context {window} or less"
            )
        self.ck.model.requires_grad_(False)

    def recorded(self, cfg: TrainConfig) -> TrainConfig:
        """cfg with this teacher as the run records it: the absolute path of its file, and its sha256."""
        return replace(cfg, teacher=str(self.file), teacher_sha256=self.sha256)

    def loss(self, x: torch.Tensor, targets: torch.Tensor, logits: torch.Tensor, ce: torch.Tensor) -> torch.Tensor:
        """The mixed loss for the student's logits (B, T, vocab) on inputs x, given its cross-entropy ce."""
        with torch.no_grad():
            teacher = self.ck.model(x)[0]
        scored = targets.reshape(-1) != -1  # a masked run scores only its targets (data.Batches)
        s = F.log_softmax(logits.reshape(-1, logits.size(-1)).float()[scored] / self.T, dim=-1)
        t = F.log_softmax(teacher.reshape(-1, teacher.size(-1)).float()[scored] / self.T, dim=-1)
        kl = F.kl_div(s, t, log_target=True, reduction="batchmean")
        return (1 - self.weight) * ce + self.weight * self.T**2 * kl


def _identify(cfg: TrainConfig) -> tuple[Path, str]:
    """(the teacher's checkpoint file, absolute and free of links; its sha256). A run that recorded its
    teacher (a resume) gets that very file back, or a ConfigError when it is gone or its bytes differ."""
    if cfg.teacher_sha256 is None:  # a new run (or one recorded before teachers were identified by hash)
        file = Path(teacher_file(cfg.teacher))
        return file, files.sha256(file, "teacher")
    file = Path(cfg.teacher)
    redo = "put it back, or train a new run with another --out"
    if not file.exists():  # (a FIFO or a directory there: files.sha256 below says which)
        raise ConfigError(f"--resume: this run distils from the teacher {file}, which is no longer there: {redo}")
    try:
        sha = files.sha256(file, "teacher")
    except ValueError as e:  # files.ReadError: a FIFO or a directory put there, no permission...
        raise ConfigError(f"--resume: {e}: {redo}") from None
    if sha != cfg.teacher_sha256:
        raise ConfigError(
            f"--resume: the teacher at {file} is not the one this run distils from (its sha256 is {sha[:12]}..., "
            f"the run recorded {cfg.teacher_sha256[:12]}...): put the original back, or train a new run with another --out"
        )
    return file, sha
