"""The training loop: AdamW, warmup + cosine schedule, gradient clipping, periodic evaluation,
atomic checkpoints and exact resume.

The trainer never prints. It reports what happens as events (the dataclasses below) to a callback;
the CLI renders them.
"""

from __future__ import annotations

import json
import math
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import torch

from charlm import checkpoint
from charlm.config import ConfigError, ModelConfig, TrainConfig
from charlm.data import Batches, bits_per_char, load_tokens, prepare
from charlm.models import build_model, count_params
from charlm.tokenizer import tokenizer_from_json


# ---- events -------------------------------------------------------------------------------------


@dataclass
class Encoding:
    done: int  # bytes of the corpus encoded so far
    total: int


@dataclass
class Started:
    out_dir: Path
    device: str
    params: int
    model_config: ModelConfig
    train_config: TrainConfig
    start_step: int
    train_tokens: int
    val_tokens: int
    vocab_size: int


@dataclass
class Stepped:
    step: int
    loss: float
    lr: float
    tokens_per_s: float
    elapsed: float  # seconds of training so far, earlier sessions included


@dataclass
class Evaluated:
    step: int
    train_loss: float
    val_loss: float
    val_bpc: float
    is_best: bool
    model: torch.nn.Module = field(repr=False)  # in eval mode during the event: a view may sample from it
    tokenizer: object = field(repr=False)


@dataclass
class Result:
    out_dir: Path
    step: int
    stopped: str  # "steps" | "time" | "interrupted" | "until"
    train_seconds: float
    best_val_loss: float
    best_val_bpc: float
    last_val_loss: float | None
    params: int


class TrainingInterrupted(Exception):
    """Ctrl-C: the run was saved and can be resumed."""

    def __init__(self, result: Result):
        super().__init__("interrupted")
        self.result = result


class TrainingDiverged(Exception):
    """The loss became NaN or infinite; the last good checkpoint is kept."""


# ---- helpers ------------------------------------------------------------------------------------


def pick_device(name: str) -> str:
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda was asked for, but PyTorch sees no CUDA GPU: use --device cpu")
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def lr_at(cfg: TrainConfig, step: int, elapsed: float) -> float:
    """Linear warmup, then cosine decay to lr * min_lr_ratio. With a time budget the decay follows
    the clock, so a --max-time run still ends its schedule when the time runs out."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    if cfg.max_time:
        progress = max(progress, elapsed / cfg.max_time)
    progress = min(progress, 1.0)
    min_lr = cfg.lr * cfg.min_lr_ratio
    return min_lr + 0.5 * (cfg.lr - min_lr) * (1 + math.cos(math.pi * progress))


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig, device: str) -> torch.optim.Optimizer:
    params = {id(p): p for p in model.parameters() if p.requires_grad}.values()  # tied weights once
    decay = [p for p in params if p.dim() >= 2]  # matrices and embeddings
    no_decay = [p for p in params if p.dim() < 2]  # norms and biases
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, cfg.beta2), fused=device == "cuda")


@torch.no_grad()
def evaluate(model, batches: Batches, cfg: TrainConfig, device: str, autocast) -> dict[str, float]:
    """Mean loss over the same eval_iters windows of each split every time (a fixed generator), so
    evaluations are comparable and never disturb the training RNG."""
    model.eval()
    out = {}
    for split in ("train", "val"):
        gen = torch.Generator().manual_seed(cfg.seed + 1)
        losses = []
        for _ in range(cfg.eval_iters):
            x, y = batches.get_batch(split, cfg.batch_size, gen, device)
            with autocast:
                _, loss = model(x, y)
            losses.append(loss.item())
        out[split] = sum(losses) / len(losses)
    model.train()
    return out


# ---- the run ------------------------------------------------------------------------------------


class Trainer:
    """One training run: set up from a corpus (or from out_dir/last.pt when resuming), then fit()."""

    def __init__(self, corpus, model_cfg: ModelConfig, cfg: TrainConfig, out_dir, resume=False, on_event=None):
        self.out_dir, self.cfg, self.model_cfg = Path(out_dir), cfg.validate(), model_cfg
        self.on_event = on_event or (lambda event: None)
        self.device = pick_device(cfg.device)
        torch.manual_seed(cfg.seed)

        state = checkpoint.load_raw(self.out_dir / "last.pt") if resume else None
        tokenizer = tokenizer_from_json(state["tokenizer"]) if state else None
        self.tokenizer, tokens_path, corpus_sha = prepare(
            corpus, cfg.tokenizer, cfg.vocab_size, tokenizer=tokenizer,
            progress=lambda done, total: self.on_event(Encoding(done, total)),
        )
        if state and state["corpus"]["sha256"] != corpus_sha:
            raise ConfigError(f"{corpus} is not the text this run was trained on: resume with that file, or use a new --out")
        model_cfg.vocab_size = self.tokenizer.vocab_size
        model_cfg.validate()
        self.batches = Batches(load_tokens(tokens_path), context=model_cfg.context, val_fraction=cfg.val_fraction)
        self.batches.check()
        self.corpus_info = {
            "name": Path(corpus).name,
            "sha256": corpus_sha,
            "train_tokens": len(self.batches.train),
            "val_tokens": len(self.batches.val),
            "chars_per_token": self.batches.chars_per_token(self.tokenizer),
        }

        self.model = build_model(model_cfg).to(self.device)
        self.params = count_params(self.model)
        self.optimizer = make_optimizer(self.model, cfg, self.device)
        self.data_gen = torch.Generator().manual_seed(cfg.seed)
        self.step, self.train_seconds = 0, 0.0
        self.best_val_loss = self.best_val_bpc = float("inf")
        if state:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.data_gen.set_state(state["rng"]["data"])
            torch.set_rng_state(state["rng"]["torch"])
            self.step, self.train_seconds = state["step"], state["train_seconds"]
            self.best_val_loss, self.best_val_bpc = state["best_val_loss"], state["best_val_bpc"]
        self.autocast = torch.autocast("cuda", dtype=torch.bfloat16) if self.device == "cuda" else nullcontext()
        # compile for speed, but always save self.model: never the compiled wrapper (its keys differ)
        self.forward = torch.compile(self.model) if cfg.compile else self.model

    def fit(self, until: int | None = None) -> Result:
        """Train up to cfg.steps (or the time budget). `until` pauses at that step, saved, without
        changing the schedule; Ctrl-C saves and raises TrainingInterrupted."""
        cfg, model = self.cfg, self.model
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.on_event(Started(self.out_dir, self.device, self.params, self.model_cfg, cfg, self.step,
                              len(self.batches.train), len(self.batches.val), self.tokenizer.vocab_size))
        tokens_per_step = cfg.batch_size * self.model_cfg.context
        last_eval_step, last_val, stopped = None, None, "steps"
        seconds_before, session_start = self.train_seconds, time.perf_counter()
        model.train()
        try:
            while self.step < cfg.steps:
                if until is not None and self.step >= until:
                    stopped = "until"
                    break
                if cfg.max_time and self.train_seconds >= cfg.max_time:
                    stopped = "time"
                    break
                t0 = time.perf_counter()
                lr = lr_at(cfg, self.step, self.train_seconds)
                for group in self.optimizer.param_groups:
                    group["lr"] = lr
                x, y = self.batches.get_batch("train", cfg.batch_size, self.data_gen, self.device)
                with self.autocast:
                    _, loss = self.forward(x, y)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
                loss_value = loss.item()
                if not math.isfinite(loss_value):
                    raise TrainingDiverged(
                        f"the loss became {loss_value} at step {self.step + 1}: training stopped, and the last good "
                        f"checkpoint in {self.out_dir} was kept; try a lower --lr (now {cfg.lr:g})"
                    )
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
                self.step += 1
                self.train_seconds = seconds_before + time.perf_counter() - session_start
                elapsed = time.perf_counter() - t0
                self.on_event(Stepped(self.step, loss_value, lr, tokens_per_step / max(elapsed, 1e-9), self.train_seconds))
                if self.step % cfg.eval_interval == 0 or self.step == cfg.steps:
                    last_val, last_eval_step = self.evaluate_and_save(), self.step
        except KeyboardInterrupt:
            self.save("last.pt")
            raise TrainingInterrupted(self.result("interrupted", None)) from None
        if last_eval_step != self.step:  # stopped by the clock or `until` between evaluations
            last_val = self.evaluate_and_save()
        return self.result(stopped, last_val)

    def result(self, stopped: str, last_val: float | None) -> Result:
        return Result(self.out_dir, self.step, stopped, self.train_seconds, self.best_val_loss,
                      self.best_val_bpc, last_val, self.params)

    def evaluate_and_save(self) -> float:
        """Evaluate; log the metrics; write last.pt, and best.pt when val loss improved. Returns val loss."""
        losses = evaluate(self.model, self.batches, self.cfg, self.device, self.autocast)
        val_bpc = bits_per_char(losses["val"], self.corpus_info["chars_per_token"])
        is_best = losses["val"] < self.best_val_loss
        if is_best:
            self.best_val_loss, self.best_val_bpc = losses["val"], val_bpc
        metrics = {"step": self.step, "train_loss": losses["train"], "val_loss": losses["val"],
                   "val_bpc": val_bpc, "elapsed": round(self.train_seconds, 3)}
        self.save("last.pt", metrics)
        if is_best:
            self.save("best.pt", metrics)
        with open(self.out_dir / "metrics.jsonl", "a") as f:
            f.write(json.dumps(metrics) + "\n")
        self.model.eval()  # a view may sample from the model during this event (with its own RNG)
        self.on_event(Evaluated(self.step, losses["train"], losses["val"], val_bpc, is_best, self.model, self.tokenizer))
        self.model.train()
        return losses["val"]

    def save(self, name: str, metrics: dict | None = None) -> None:
        checkpoint.save(
            {
                "run_name": self.out_dir.resolve().name,
                "model_config": self.model_cfg.to_dict(),
                "train_config": self.cfg.to_dict(),
                "tokenizer": self.tokenizer.to_json(),
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "step": self.step,
                "train_seconds": self.train_seconds,
                "best_val_loss": self.best_val_loss,
                "best_val_bpc": self.best_val_bpc,
                "rng": {"data": self.data_gen.get_state(), "torch": torch.get_rng_state()},
                "corpus": self.corpus_info,
                "metrics": metrics or {"step": self.step},
                "params": self.params,
                "device": self.device,
            },
            self.out_dir / name,
        )
