"""The training loop: AdamW, warmup + cosine schedule, gradient clipping, periodic evaluation,
atomic checkpoints and exact resume. Gradient accumulation (grad_accum micro-batches per step), and
under torchrun one process per rank with DistributedDataParallel (see charlm.distributed): each rank
samples its own batches, every rank runs the same loop and takes part in every collective, rank 0 writes.

The trainer never prints. It reports what happens as events (the dataclasses below) to a callback;
the CLI renders them.
"""

from __future__ import annotations

import json
import math
import signal
import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from charlm import checkpoint, distributed
from charlm.config import ConfigError, ModelConfig, TrainConfig
from charlm.data import Batches, CorpusError, bits_per_char, corpus_sha256, load_tokens, prepare
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
    world_size: int = 1  # processes (torchrun ranks): effective batch = batch_size * grad_accum * world_size


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


class Optimizers:
    """Several optimizers stepped as one (Muon for hidden matrices, AdamW for the rest).

    Each param group carries an "lr_scale": the schedule sets lr = scheduled lr * lr_scale."""

    def __init__(self, optimizers: list[torch.optim.Optimizer]):
        self.optimizers = optimizers

    @property
    def param_groups(self) -> list[dict]:
        return [g for o in self.optimizers for g in o.param_groups]

    def set_lr(self, lr: float) -> None:
        for group in self.param_groups:
            group["lr"] = lr * group["lr_scale"]

    def step(self) -> None:
        for o in self.optimizers:
            o.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self.optimizers:
            o.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return {"optimizers": [o.state_dict() for o in self.optimizers]}

    def load_state_dict(self, state: dict) -> None:
        if len(state.get("optimizers", [])) != len(self.optimizers):
            raise ConfigError("the checkpoint's optimizer state does not match --optimizer: resume with the same optimizer")
        for o, s in zip(self.optimizers, state["optimizers"]):
            o.load_state_dict(s)


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig, device: str) -> Optimizers:
    """AdamW; or, with cfg.optimizer == "muon", Muon for the 2-D weights inside the network (attention,
    MLP, recurrent matrices) and AdamW for embeddings, the output head, norms and biases (Muon is
    only meant for hidden matrices)."""
    named = {id(p): (n, p) for n, p in model.named_parameters() if p.requires_grad}.values()  # tied weights once
    hidden = lambda n, p: p.dim() == 2 and not n.startswith(("tok_emb", "pos_emb", "head"))  # noqa: E731
    adam = dict(betas=(0.9, cfg.beta2), fused=device == "cuda")
    if cfg.optimizer == "muon":
        muon = [p for n, p in named if hidden(n, p)]
        rest = [(n, p) for n, p in named if not hidden(n, p)]
        groups = [
            {"params": [p for n, p in rest if p.dim() >= 2], "weight_decay": cfg.weight_decay, "lr_scale": 1.0},
            {"params": [p for n, p in rest if p.dim() < 2], "weight_decay": 0.0, "lr_scale": 1.0},
        ]
        return Optimizers([
            torch.optim.Muon([{"params": muon, "lr_scale": cfg.muon_lr / cfg.lr}], lr=cfg.muon_lr, weight_decay=0.0),
            torch.optim.AdamW(groups, lr=cfg.lr, **adam),
        ])
    decay = [p for n, p in named if p.dim() >= 2]  # matrices and embeddings
    no_decay = [p for n, p in named if p.dim() < 2]  # norms and biases
    groups = [{"params": decay, "weight_decay": cfg.weight_decay, "lr_scale": 1.0},
              {"params": no_decay, "weight_decay": 0.0, "lr_scale": 1.0}]
    return Optimizers([torch.optim.AdamW(groups, lr=cfg.lr, **adam)])


def autocast_dtype(device: str, precision: str) -> torch.dtype | None:
    """The dtype matrix products run in under autocast (weights stay float32), or None for plain fp32.

    auto: bf16 on GPUs that have it (fp16 on older ones), and on CPUs with native bf16 instructions
    (AVX512-BF16 or AMX), where it makes the tiny LSTM ~1.5x faster (benchmarks/RESULTS.md)."""
    if precision == "fp32":
        return None
    if device == "cuda":
        return torch.bfloat16 if precision == "bf16" or torch.cuda.is_bf16_supported() else torch.float16
    native_bf16 = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    return torch.bfloat16 if precision == "bf16" or native_bf16 else None


@torch.no_grad()
def evaluate(model, batches: Batches, cfg: TrainConfig, device: str, autocast,
             rank: int = 0, world_size: int = 1) -> dict[str, float]:
    """Mean loss over the same eval_iters windows of each split every time (a fixed generator), so
    evaluations are comparable and never disturb the training RNG. With several processes, each
    computes every world_size-th window and the sums are added up: the same numbers on every rank."""
    model.eval()
    sums = []
    for split in ("train", "val"):
        gen = torch.Generator().manual_seed(cfg.seed + 1)
        total = 0.0
        for i in range(cfg.eval_iters):
            x, y = batches.get_batch(split, cfg.batch_size, gen, device)  # every rank draws every window: gens stay in step
            if i % world_size == rank:
                with autocast:
                    _, loss = model(x, y)
                total += loss.item()
        sums.append(total)
    train, val = distributed.all_sum(sums)
    model.train()
    return {"train": train / cfg.eval_iters, "val": val / cfg.eval_iters}


# ---- the run ------------------------------------------------------------------------------------


class Trainer:
    """One training run: set up from a corpus (or from out_dir/last.pt when resuming), then fit()."""

    def __init__(self, corpus, model_cfg: ModelConfig, cfg: TrainConfig, out_dir, resume=False, on_event=None):
        self.out_dir, self.cfg, self.model_cfg = Path(out_dir), cfg.validate(), model_cfg
        self.on_event = on_event or (lambda event: None)
        self.device = pick_device(cfg.device)
        self.dist = distributed.init(self.device)  # under torchrun: join the other ranks
        # model init (DDP then copies rank 0's weights to all) and dropout; rank 0 == a single process
        torch.manual_seed(cfg.seed + self.dist.rank)

        state = tokenizer = None
        if resume:
            state = checkpoint.load_raw(self.out_dir / "last.pt", required=checkpoint.REQUIRED + checkpoint.TRAINING_STATE)
            trained_on = state.get("distributed", {}).get("world_size", 1)
            if trained_on != self.dist.world_size:  # each rank's batches are part of the run
                raise ConfigError(f"cannot resume {self.out_dir} with {self.dist.world_size} process(es): it was trained "
                                  f"with {trained_on}; resume it with --nproc {trained_on} (or torchrun --nproc-per-node {trained_on})")
            # hash before encoding: another text would fail later with a less helpful message
            if state["corpus"].get("sha256") != corpus_sha256(corpus):
                raise ConfigError(f"{corpus} is not the text this run was trained on: resume with that file, or use a new --out")
            tokenizer = tokenizer_from_json(state["tokenizer"])
        # one process per machine trains the tokenizer and encodes the corpus; the others wait, then
        # find both in the cache (CHARLM_CACHE) instead of doing the same work at the same time
        if self.dist.local_rank != 0:
            distributed.barrier()
        self.tokenizer, tokens_path, corpus_sha = prepare(
            corpus, cfg.tokenizer, cfg.vocab_size, tokenizer=tokenizer,
            progress=lambda done, total: self.on_event(Encoding(done, total)),
        )
        if self.dist.local_rank == 0:
            distributed.barrier()
        if self.tokenizer.vocab_size < 2:
            raise CorpusError(f"{corpus} holds a single distinct character: there is nothing to learn from it")
        model_cfg.vocab_size = self.tokenizer.vocab_size
        model_cfg.validate()
        if state:
            saved = ModelConfig.from_dict(state["model_config"])
            diff = [f"{k} {v} (now {getattr(model_cfg, k)})" for k, v in saved.to_dict().items() if getattr(model_cfg, k) != v]
            if diff:
                raise ConfigError(f"cannot resume {self.out_dir}: it was trained with {', '.join(diff)}; use the same model settings")
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
        self.data_gen = torch.Generator().manual_seed(cfg.seed + self.dist.rank)  # each rank its own batches
        self.step, self.train_seconds = 0, 0.0
        self.best_val_loss = self.best_val_bpc = float("inf")
        amp = autocast_dtype(self.device, cfg.precision)
        self.autocast = torch.autocast(self.device, dtype=amp) if amp else nullcontext()
        # fp16's narrow range needs a gradient scaler; bf16 has float32's range and does not
        self.scaler = torch.amp.GradScaler("cuda") if amp == torch.float16 else None
        if state:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            rng = state["rng"]["ranks"][self.dist.rank] if self.dist.enabled else state["rng"]
            self.data_gen.set_state(rng["data"])
            torch.set_rng_state(rng["torch"])
            if self.device == "cuda" and "cuda" in rng:
                torch.cuda.set_rng_state(rng["cuda"])
            if self.scaler and "scaler" in state:
                self.scaler.load_state_dict(state["scaler"])
            self.step, self.train_seconds = state["step"], state["train_seconds"]
            self.best_val_loss, self.best_val_bpc = state["best_val_loss"], state["best_val_bpc"]
        # DDP averages gradients across ranks during backward. self.model stays the plain module and is
        # what gets saved: never the DDP or compiled wrapper (their keys get "module."/"_orig_mod." prefixes)
        self.ddp = None
        if self.dist.enabled:
            self.ddp = DDP(self.model, device_ids=[self.dist.local_rank] if self.device == "cuda" else None)
        self.forward = torch.compile(self.ddp or self.model) if cfg.compile else (self.ddp or self.model)

    def fit(self, until: int | None = None) -> Result:
        """Train up to cfg.steps (or the time budget). `until` pauses at that step, saved, without
        changing the schedule. Ctrl-C finishes the current step, saves and raises TrainingInterrupted."""
        cfg, model = self.cfg, self.model
        self.on_event(Started(self.out_dir, self.device, self.params, self.model_cfg, cfg, self.step,
                              len(self.batches.train), len(self.batches.val), self.tokenizer.vocab_size,
                              self.dist.world_size))
        # tokens/s counts optimizer steps over all ranks: the effective batch
        tokens_per_step = cfg.batch_size * cfg.grad_accum * self.dist.world_size * self.model_cfg.context
        last_eval_step, last_val, stopped = None, None, "steps"
        seconds_before, session_start = self.train_seconds, time.perf_counter()
        model.train()
        with _DeferredInterrupt() as interrupt:
            while self.step < cfg.steps:
                # every rank must leave the loop at the same step: they agree on Ctrl-C and on the clock
                # (the max over ranks), which also gives them the same learning rate under --max-time
                stop, self.train_seconds = distributed.all_max([float(interrupt.requested), self.train_seconds])
                if stop:  # between steps, so the saved state is exactly this step's
                    self.save("last.pt")
                    raise TrainingInterrupted(self.result("interrupted", last_val))
                if until is not None and self.step >= until:
                    stopped = "until"
                    break
                if cfg.max_time and self.train_seconds >= cfg.max_time:
                    stopped = "time"
                    break
                t0 = time.perf_counter()
                lr = lr_at(cfg, self.step, self.train_seconds)
                self.optimizer.set_lr(lr)
                loss_value, norm_value = self.forward_backward()
                # checked before the optimizer step, so the weights (and any checkpoint saved later) stay good;
                # an infinite gradient norm would make clipping zero the gradients and stall the run silently.
                # Both values are the same on every rank, so all ranks stop together.
                if not math.isfinite(loss_value):
                    self.diverged(f"the loss became {loss_value}", self.step + 1)
                if not math.isfinite(norm_value) and self.scaler is None:  # fp16: the scaler skips such steps
                    self.diverged(f"the gradient norm became {norm_value} (loss {loss_value:.3g})", self.step + 1)
                if self.scaler:
                    for o in self.optimizer.optimizers:
                        self.scaler.step(o)
                    self.scaler.update()
                else:
                    self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
                self.step += 1
                self.train_seconds = seconds_before + time.perf_counter() - session_start
                elapsed = time.perf_counter() - t0
                self.on_event(Stepped(self.step, loss_value, lr, tokens_per_step / max(elapsed, 1e-9), self.train_seconds))
                if self.step % cfg.eval_interval == 0 or self.step == cfg.steps:
                    last_val, last_eval_step = self.evaluate_and_save(), self.step
            if last_eval_step != self.step:  # stopped by the clock or `until` between evaluations
                last_val = self.evaluate_and_save()
        return self.result(stopped, last_val)

    def forward_backward(self) -> tuple[float, float]:
        """Gradients of one optimizer step: grad_accum micro-batches, then clipping. Returns the loss
        (the mean over all ranks and micro-batches) and the gradient norm (identical on all ranks)."""
        cfg, K = self.cfg, self.cfg.grad_accum
        loss_sum = torch.zeros((), device=self.device)
        for micro in range(K):
            x, y = self.batches.get_batch("train", cfg.batch_size, self.data_gen, self.device)
            # DDP all-reduces the gradients in each backward; only the last micro-batch's needs to
            sync = self.ddp.no_sync() if self.ddp is not None and micro < K - 1 else nullcontext()
            with sync:
                with self.autocast:
                    _, loss = self.forward(x, y)
                loss = loss / K  # gradients add up over the micro-batches: this makes their sum a mean
                (self.scaler.scale(loss) if self.scaler else loss).backward()
            loss_sum += loss.detach()
        if self.scaler:
            for o in self.optimizer.optimizers:
                self.scaler.unscale_(o)  # clip the true gradients, not the scaled ones
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
        (loss_value,) = distributed.all_sum([loss_sum.item()])
        return loss_value / self.dist.world_size, grad_norm.item()

    def diverged(self, what: str, step: int) -> NoReturn:
        kept = (f"the last good checkpoint in {self.out_dir} was kept" if (self.out_dir / "last.pt").exists()
                else "nothing was saved")
        raise TrainingDiverged(f"{what} at step {step}: training stopped, and {kept}; try a lower --lr (now {self.cfg.lr:g})")

    def result(self, stopped: str, last_val: float | None) -> Result:
        return Result(self.out_dir, self.step, stopped, self.train_seconds, self.best_val_loss,
                      self.best_val_bpc, last_val, self.params)

    def evaluate_and_save(self) -> float:
        """Evaluate; log the metrics; write last.pt, and best.pt when val loss improved. Returns val loss."""
        losses = evaluate(self.model, self.batches, self.cfg, self.device, self.autocast,
                          self.dist.rank, self.dist.world_size)
        if not all(map(math.isfinite, losses.values())):  # never overwrite a good checkpoint with this
            self.diverged(f"the evaluation loss became {losses['val']}", self.step)
        val_bpc = bits_per_char(losses["val"], self.corpus_info["chars_per_token"])
        is_best = losses["val"] < self.best_val_loss
        if is_best:
            self.best_val_loss, self.best_val_bpc = losses["val"], val_bpc
        metrics = {"step": self.step, "train_loss": losses["train"], "val_loss": losses["val"],
                   "val_bpc": val_bpc, "elapsed": round(self.train_seconds, 3)}
        self.save("last.pt", metrics)
        if is_best:
            self.save("best.pt", metrics)
        if self.dist.is_main:
            with open(self.out_dir / "metrics.jsonl", "a") as f:
                f.write(json.dumps(metrics) + "\n")
        self.model.eval()  # a view may sample from the model during this event (with its own RNG)
        self.on_event(Evaluated(self.step, losses["train"], losses["val"], val_bpc, is_best, self.model, self.tokenizer))
        self.model.train()
        return losses["val"]

    def save(self, name: str, metrics: dict | None = None) -> None:
        """Write out_dir/name. With several processes every rank calls this and rank 0 writes: the file
        gets each rank's RNG states (for an exact resume) and a digest of each rank's weights, which
        must all be equal (DDP keeps them so; if not, rank 0's file alone would misrepresent the run)."""
        rng, extra = self.rng_state(), {}
        if self.scaler:
            extra["scaler"] = self.scaler.state_dict()
        if self.dist.enabled:
            ranks = distributed.all_gather({"rng": rng, "weights": distributed.weights_digest(self.model.state_dict())})
            digests = [r["weights"] for r in ranks]
            if len(set(digests)) > 1:  # every rank sees the same list, so every rank raises
                raise RuntimeError(f"the {len(digests)} processes hold different weights at step {self.step}: "
                                   f"sha256 {', '.join(d[:12] for d in digests)}")
            rng = {**rng, "ranks": [r["rng"] for r in ranks]}
            extra["distributed"] = {"world_size": len(ranks), "weights_sha256": digests}
        if self.dist.is_main:
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
                    "rng": rng,
                    "corpus": self.corpus_info,
                    "metrics": metrics or {"step": self.step},
                    "params": self.params,
                    "device": self.device,
                    **extra,
                },
                self.out_dir / name,
            )
        # the others wait until the file is written: once save() returns on any rank, a resume may read it
        distributed.barrier()

    def rng_state(self) -> dict:
        rng = {"data": self.data_gen.get_state(), "torch": torch.get_rng_state()}  # torch: dropout
        if self.device == "cuda":
            rng["cuda"] = torch.cuda.get_rng_state()
        return rng


class _DeferredInterrupt:
    """While active, a first Ctrl-C only sets `requested` (the loop stops cleanly at the next step);
    a second one raises KeyboardInterrupt at once. Only the main thread can handle signals, so
    elsewhere it does nothing."""

    def __init__(self):
        self.requested = False
        self.installed = False
        self.previous = None

    def _handle(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def __enter__(self) -> "_DeferredInterrupt":
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGINT, self._handle)
            self.installed = True
        return self

    def __exit__(self, *exc) -> None:
        if self.installed:  # previous is None when it was set outside Python: fall back to the default
            signal.signal(signal.SIGINT, self.previous if self.previous is not None else signal.SIG_DFL)
