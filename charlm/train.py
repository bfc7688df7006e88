"""The training loop: AdamW, warmup + cosine schedule, gradient clipping, periodic evaluation,
atomic checkpoints and exact resume. Gradient accumulation (grad_accum micro-batches per step), and
under torchrun one process per rank with DistributedDataParallel (see charlm.distributed): each rank
samples its own batches, every rank runs the same loop and takes part in every collective, rank 0 writes.

The trainer never prints. It reports what happens as events (the dataclasses below) to a callback;
the CLI renders them.

Nothing is lost to an interruption: Ctrl-C and SIGTERM stop the run at a step boundary, saved; a second
signal cannot cut a save short; and an evaluation writes best.pt, then its metrics.jsonl line, then
last.pt, the run's commit record. A resume drops what a kill left beyond last.pt (metrics lines of
later steps) and adopts a best.pt written after it, so every file agrees with every other.
"""

from __future__ import annotations

import json
import math
import os
import signal
import statistics
import threading
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NoReturn

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from charlm import checkpoint, distributed, files, runs
from charlm.checkpoint import Corpus, Saved
from charlm.config import ConfigError, ModelConfig, SampleConfig, TrainConfig
from charlm.data import Batches, CorpusError, bits_per_char, corpus_sha256, load_tokens, prepare
from charlm.errors import UserError
from charlm.generate import Streamer
from charlm.models import build_model, count_params
from charlm.optim import make_optimizer
from charlm.runtime import autocast_dtype, pick_device
from charlm.tokenizer import tokenizer_from_json

# ---- events -------------------------------------------------------------------------------------


@dataclass(kw_only=True)
class Encoding:
    done: int  # bytes of the corpus encoded so far
    total: int


@dataclass(kw_only=True)
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
    start_seconds: float = 0.0  # seconds trained by earlier sessions of a resumed run


@dataclass(kw_only=True)
class Phase:
    name: str  # "evaluating" | "sampling" | "saving": work between steps that shows no progress of its own


@dataclass(kw_only=True)
class Stepped:
    step: int
    loss: float
    lr: float
    tokens_per_s: float
    elapsed: float  # seconds of training so far, earlier sessions included
    load: float | None = None  # the machine's 1-minute load average (None where the system has none)


@dataclass(kw_only=True)
class Evaluated:
    step: int
    train_loss: float
    val_loss: float
    val_bpc: float
    is_best: bool
    sample: str | None = None  # a short sample of the model at this step (sample_tokens > 0)


@dataclass(kw_only=True)
class Result:
    out_dir: Path
    step: int
    stopped: str  # "steps" | "time" | "interrupted" | "until"
    train_seconds: float
    best_val_loss: float | None  # None: never evaluated
    best_val_bpc: float | None
    last_val_loss: float | None
    params: int
    sample: str | None = None  # the final sample (sample_tokens > 0, rank 0)
    tokens_per_s: float | None = None  # this session's median over its steps (evaluations left out)
    usual_tokens_per_s: float | None = None  # the fastest this machine trained this set-up before (commands.train)


class TrainingInterrupted(Exception):
    """Ctrl-C or SIGTERM: the run was saved and can be resumed. signum: the signal that stopped it."""

    def __init__(self, result: Result, signum: int = signal.SIGINT):
        super().__init__("interrupted")
        self.result, self.signum = result, signum


class TrainingDiverged(UserError):
    """The loss became NaN or infinite; the last good checkpoint is kept."""


# ---- helpers ------------------------------------------------------------------------------------


WARMUP_TIME_FRACTION = 0.1  # with a time budget, warmup ends after this share of it at the latest


def lr_at(cfg: TrainConfig, step: int, elapsed: float) -> float:
    """Linear warmup, then cosine decay to lr * min_lr_ratio. With a time budget the warmup and the decay
    follow the clock too, so a --max-time run still ends its schedule when the time runs out, even one
    shorter than its --warmup steps."""
    warmed = (step + 1) / cfg.warmup if step < cfg.warmup else 1.0
    if cfg.max_time:
        warmed = max(warmed, elapsed / (WARMUP_TIME_FRACTION * cfg.max_time))
    if warmed < 1.0:
        return cfg.lr * warmed
    progress = max(0.0, (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup))  # 0 on warmup's last step
    if cfg.max_time:
        progress = max(progress, elapsed / cfg.max_time)
    progress = min(progress, 1.0)
    min_lr = cfg.lr * cfg.min_lr_ratio
    return min_lr + 0.5 * (cfg.lr - min_lr) * (1 + math.cos(math.pi * progress))


@torch.no_grad()
def evaluate(
    model, batches: Batches, cfg: TrainConfig, device: str, autocast, rank: int = 0, world_size: int = 1
) -> dict[str, float]:
    """Mean loss over the same eval_iters windows of each split every time (a fixed generator), so
    evaluations are comparable and never disturb the training RNG. With several processes, each
    computes every world_size-th window and the sums are added up: the same numbers on every rank."""
    model.eval()
    sums = []
    for split in ("train", "val"):
        gen = torch.Generator().manual_seed(cfg.seed + 1)
        total = 0.0
        for i in range(cfg.eval_iters):
            x, y = batches.get_batch(
                split, cfg.batch_size, gen, device
            )  # every rank draws every window: gens stay in step
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
    """One training run: set up from a corpus (or from out_dir/last.pt when resuming), then fit().
    The configs are taken as given (the CLI validated them); the caller's objects are never changed.
    starts, mask (token-aligned, optional): windows begin at examples, the loss covers only the targets, in
    training and evaluation alike (data.Batches). They are the caller's to give again on a resume."""

    def __init__(
        self,
        corpus,
        model_cfg: ModelConfig,
        cfg: TrainConfig,
        out_dir,
        resume=False,
        on_event=None,
        starts=None,
        mask=None,
    ):
        self.out_dir, self.cfg = Path(out_dir), cfg
        self.starts, self.mask = starts, mask  # a task posed example by example: see data.Batches
        self.on_event = on_event or (lambda event: None)
        self.speeds: list[float] = []  # tokens/s of each step of the latest fit(): its session
        self.device = pick_device(cfg.device)
        self.dist = distributed.init(self.device)  # under torchrun: join the other ranks
        # model init (DDP then copies rank 0's weights to all) and dropout; rank 0 == a single process
        torch.manual_seed(cfg.seed + self.dist.rank)
        if self.dist.is_main:
            files.remove_dead_temps(self.out_dir)  # checkpoints that a killed process was writing
        # entered by fit(); outside it, holding() changes nothing. Under torchrun SIGTERM stays the launcher's
        # way to stop a rank: one blocked in a collective whose peer died cannot run a Python handler
        self.signals = _DeferredInterrupt(signal.SIGINT, *([] if self.dist.enabled else [signal.SIGTERM]))
        saved = self._saved_run(corpus, model_cfg) if resume else None
        self._prepare_data(corpus, model_cfg, saved)
        self._build()
        if saved:
            self._restore(saved)
        self._drop_metrics_beyond(
            self.step
        )  # (a new run: all of them, the log of a run killed before its first last.pt)
        self._wrap()

    def _saved_run(self, corpus, model_cfg: ModelConfig) -> Saved:
        """The run to continue, after the one resume rule (runs.py) agreed to these configs."""
        path = self.out_dir / "last.pt"
        saved = checkpoint.read(path)
        saved.require_training_state(path)
        runs.resume_configs(self.out_dir, saved, model_cfg, self.cfg, self.dist.world_size)
        # hash before encoding: another text would fail later with a less helpful message
        # (_prepare_data passes the same hash on, so the corpus is read for hashing once)
        if saved.corpus.sha256 != corpus_sha256(corpus):
            raise ConfigError(
                f"{corpus} is not the text this run was trained on: resume with that file, or use a new --out"
            )
        return saved

    def _prepare_data(self, corpus, model_cfg: ModelConfig, saved: Saved | None) -> None:
        """Tokenizer and token ids; the model config gets the tokenizer's vocabulary size."""
        # one process per machine trains the tokenizer and encodes the corpus; the others wait, then
        # find both in the cache (CHARLM_CACHE) instead of doing the same work at the same time
        if self.dist.local_rank != 0:
            distributed.barrier()
        self.tokenizer, tokens_path, corpus_sha = prepare(
            corpus,
            self.cfg.tokenizer,
            self.cfg.vocab_size,
            tokenizer=tokenizer_from_json(saved.tokenizer) if saved else None,
            progress=lambda done, total: self.on_event(Encoding(done=done, total=total)),
            sha256=saved.corpus.sha256 if saved else None,  # checked equal to the file's hash by _saved_run
        )
        if self.dist.local_rank == 0:
            distributed.barrier()
        if self.tokenizer.vocab_size < 2:
            raise CorpusError(f"{corpus} holds a single distinct character: there is nothing to learn from it")
        self.model_cfg = replace(model_cfg, vocab_size=self.tokenizer.vocab_size)
        self.batches = Batches(
            load_tokens(tokens_path),
            context=self.model_cfg.context,
            val_fraction=self.cfg.val_fraction,
            starts=self.starts,
            mask=self.mask,
        )
        self.batches.check()
        self.corpus = Corpus(
            name=Path(corpus).name,
            path=str(Path(corpus).resolve()),
            sha256=corpus_sha,
            train_tokens=len(self.batches.train),
            val_tokens=len(self.batches.val),
            chars_per_token=self.batches.chars_per_token(self.tokenizer),
        )

    def _build(self) -> None:
        """Model, optimizer and mixed precision, fresh."""
        self.model = build_model(self.model_cfg).to(self.device)
        self.params = count_params(self.model)
        self.teacher = None  # distillation (charlm.distill): never loaded at weight 0, which trains as without one
        if self.cfg.teacher is not None and self.cfg.distill_weight > 0:
            from charlm.distill import Teacher

            self.teacher = Teacher(self.cfg, self.tokenizer, self.model_cfg, self.device)
        self.optimizer = make_optimizer(self.model, self.cfg, self.device)
        self.data_gen = torch.Generator().manual_seed(self.cfg.seed + self.dist.rank)  # each rank its own batches
        self.step, self.train_seconds = 0, 0.0
        self.next_eval = self.EVAL_GAP  # the progress() at which the next evaluation is due (no --eval-interval)
        self.saved_step = None  # the step last.pt was last written at by this process
        self.best_val_loss = self.best_val_bpc = None
        amp = autocast_dtype(self.device, self.cfg.precision)
        self.autocast = torch.autocast(self.device, dtype=amp) if amp else nullcontext()
        # fp16's narrow range needs a gradient scaler; bf16 has float32's range and does not
        self.scaler = torch.amp.GradScaler("cuda") if amp == torch.float16 else None

    def _restore(self, saved: Saved) -> None:
        """Weights, optimizer, RNGs and counters of the saved run: it continues exactly."""
        self.model.load_state_dict(saved.model)
        self.optimizer.load_state_dict(saved.optimizer)
        rng = saved.rng["ranks"][self.dist.rank] if self.dist.enabled else saved.rng
        self.data_gen.set_state(rng["data"])
        torch.set_rng_state(rng["torch"])
        if self.device == "cuda" and "cuda" in rng:
            torch.cuda.set_rng_state(rng["cuda"])
        if self.scaler and saved.scaler:
            self.scaler.load_state_dict(saved.scaler)
        self.step, self.train_seconds = saved.step, saved.train_seconds
        self.best_val_loss, self.best_val_bpc = saved.best_val_loss, saved.best_val_bpc
        self.next_eval = self.spent() + self.EVAL_GAP  # a resumed run too shows a validation loss early
        # a best.pt written after last.pt (a kill fell between the two: see the module's docstring) holds
        # the run's best so far
        best = self.out_dir / "best.pt"
        if best.exists() and best.stat().st_mtime_ns > (self.out_dir / "last.pt").stat().st_mtime_ns:
            newer = checkpoint.read(best)
            if newer.best_val_loss is not None and (
                self.best_val_loss is None or newer.best_val_loss < self.best_val_loss
            ):
                self.best_val_loss, self.best_val_bpc = newer.best_val_loss, newer.best_val_bpc

    def _drop_metrics_beyond(self, step: int) -> None:
        """metrics.jsonl as last.pt, the commit record, knows it: the lines of later steps, which a process
        killed before it wrote last.pt left, go (the run writes them again)."""
        log = self.out_dir / "metrics.jsonl"
        if not self.dist.is_main or not log.exists():
            return
        lines = log.read_text(encoding="utf-8").splitlines()
        kept = [line for line in lines if (at := _step_of(line)) is not None and at <= step]
        if kept != lines:
            files.atomic_write(log, lambda f: f.write("".join(line + "\n" for line in kept).encode("utf-8")))

    def _wrap(self) -> None:
        # DDP averages gradients across ranks during backward. self.model stays the plain module and is
        # what gets saved: never the DDP or compiled wrapper (their keys get "module."/"_orig_mod." prefixes)
        self.ddp = None
        if self.dist.enabled:
            self.ddp = DDP(self.model, device_ids=[self.dist.local_rank] if self.device == "cuda" else None)
        self.forward = torch.compile(self.ddp or self.model) if self.cfg.compile else (self.ddp or self.model)

    def fit(self, until: int | None = None) -> Result:
        """Train up to cfg.steps (or the time budget). `until` pauses at that step, saved, without
        changing the schedule. Ctrl-C finishes the current step, saves and raises TrainingInterrupted."""
        cfg, model = self.cfg, self.model
        # tokens/s counts optimizer steps over all ranks: the effective batch
        tokens_per_step = cfg.batch_size * cfg.grad_accum * self.dist.world_size * self.model_cfg.context
        last_eval_step, last_val, stopped = None, None, "steps"
        seconds_before, session_start = self.train_seconds, time.perf_counter()
        self.speeds = []
        model.train()
        with self.signals as signals:
            self.on_event(
                Started(
                    out_dir=self.out_dir,
                    device=self.device,
                    params=self.params,
                    model_config=self.model_cfg,
                    train_config=cfg,
                    start_step=self.step,
                    train_tokens=len(self.batches.train),
                    val_tokens=len(self.batches.val),
                    vocab_size=self.tokenizer.vocab_size,
                    world_size=self.dist.world_size,
                    start_seconds=self.train_seconds,
                )
            )
            while self.step < cfg.steps:
                # every rank must leave the loop at the same step: they agree on Ctrl-C and on the clock
                # (the max over ranks), which also gives them the same learning rate under --max-time
                stop, self.train_seconds = distributed.all_max([float(signals.requested), self.train_seconds])
                if stop:  # between steps, so the saved state is exactly this step's
                    signals.stopping = True
                    if self.saved_step != self.step:  # (an evaluation may just have saved it)
                        with signals.holding():
                            self.save("last.pt")
                    raise TrainingInterrupted(self.result("interrupted", last_val), signals.signum or signal.SIGINT)
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
                self.optimizer.step(self.scaler)
                self.optimizer.zero_grad(set_to_none=True)
                self.step += 1
                self.train_seconds = seconds_before + time.perf_counter() - session_start
                elapsed = time.perf_counter() - t0
                self.speeds.append(tokens_per_step / max(elapsed, 1e-9))
                self.on_event(
                    Stepped(
                        step=self.step,
                        loss=loss_value,
                        lr=lr,
                        tokens_per_s=tokens_per_step / max(elapsed, 1e-9),
                        elapsed=self.train_seconds,
                        load=_load(),
                    )
                )
                if self.eval_due():
                    last_val, last_eval_step = self.scheduled_eval(), self.step
            if last_eval_step != self.step:  # stopped by the clock or `until` between evaluations
                last_val = self.evaluate_and_save()
        return self.result(stopped, last_val)

    # Without --eval-interval: the first evaluation after 5% of the budget (a short run shows a validation
    # loss early, not only at its end), then at least 5% of the budget apart, and far enough apart that
    # evaluating takes at most ~5% of the time (a two-minute CPU run evaluates ~3 times, an hour ~20 times).
    EVAL_GAP = EVAL_SHARE = 0.05

    def spent(self) -> float:
        """The fraction of the budget (steps or time, whichever runs out first) spent."""
        p = self.step / self.cfg.steps
        return max(p, self.train_seconds / self.cfg.max_time) if self.cfg.max_time else p

    def progress(self) -> float:
        """spent(), the same on every rank: their clocks differ, and they must evaluate together."""
        return distributed.all_max([self.spent()])[0]

    def eval_due(self) -> bool:
        if self.step >= self.cfg.steps:
            return True
        if self.cfg.eval_interval:
            return self.step % self.cfg.eval_interval == 0
        return self.progress() >= self.next_eval

    def scheduled_eval(self) -> float:
        """evaluate_and_save, then the next evaluation's place in the budget from what this one cost."""
        t0 = time.perf_counter()
        val = self.evaluate_and_save()
        (cost,) = distributed.all_max([time.perf_counter() - t0])
        done = self.progress()
        total = self.cfg.max_time or self.train_seconds / max(done, 1e-9)  # seconds the whole budget takes
        self.next_eval = done + max(self.EVAL_GAP, cost / (self.EVAL_SHARE * total))
        return val

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
                    logits, loss = self.forward(x, y)
                    if self.teacher is not None:
                        loss = self.teacher.loss(x, y, logits, loss)
                loss = loss / K  # gradients add up over the micro-batches: this makes their sum a mean
                (self.scaler.scale(loss) if self.scaler else loss).backward()
            loss_sum += loss.detach()
        self.optimizer.unscale(self.scaler)  # clip the true gradients, not the scaled ones
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
        (loss_value,) = distributed.all_sum([loss_sum.item()])
        return loss_value / self.dist.world_size, grad_norm.item()

    def diverged(self, what: str, step: int) -> NoReturn:
        what += f" at step {step}"
        weights = self.model.state_dict().items()
        if bad := next((n for n, t in weights if t.is_floating_point() and not torch.isfinite(t).all()), None):
            what += f" ({checkpoint.NONFINITE.format(tensor=bad)})"  # the words a load of such weights says
        kept = (
            f"the last good checkpoint in {self.out_dir} was kept"
            if (self.out_dir / "last.pt").exists()
            else "nothing was saved"
        )
        raise TrainingDiverged(f"{what}: training stopped, and {kept}; try a lower --lr (now {self.cfg.lr:g})")

    def result(self, stopped: str, last_val: float | None) -> Result:
        final = self.sample_text(self.cfg.sample_tokens, seed=self.cfg.seed) if stopped != "interrupted" else None
        return Result(
            out_dir=self.out_dir,
            step=self.step,
            stopped=stopped,
            train_seconds=self.train_seconds,
            best_val_loss=self.best_val_loss,
            best_val_bpc=self.best_val_bpc,
            last_val_loss=last_val,
            params=self.params,
            sample=final,
            tokens_per_s=statistics.median(self.speeds) if self.speeds else None,
        )

    def sample_text(self, n_tokens: int, seed: int) -> str | None:
        """A short sample from the model on rank 0 (its own RNG: the training RNG is never touched)."""
        if not n_tokens or not self.dist.is_main:
            return None
        self.on_event(Phase(name="sampling"))
        self.model.eval()
        try:
            return Streamer(self.model, self.tokenizer).complete(
                [], SampleConfig(temperature=0.8, max_tokens=n_tokens, seed=seed)
            )
        finally:
            self.model.train()

    def evaluate_and_save(self) -> float:
        """Evaluate; write best.pt when val loss improved, then the metrics line, then last.pt (the commit
        record: see the module's docstring), with signals held off until all three are written. Returns val loss."""
        self.on_event(Phase(name="evaluating"))
        losses = evaluate(
            self.model, self.batches, self.cfg, self.device, self.autocast, self.dist.rank, self.dist.world_size
        )
        if not all(map(math.isfinite, losses.values())):  # never overwrite a good checkpoint with this
            self.diverged(f"the evaluation loss became {losses['val']}", self.step)
        val_bpc = bits_per_char(losses["val"], self.corpus.chars_per_token)
        is_best = self.best_val_loss is None or losses["val"] < self.best_val_loss
        if is_best:
            self.best_val_loss, self.best_val_bpc = losses["val"], val_bpc
        metrics = {
            "step": self.step,
            "train_loss": losses["train"],
            "val_loss": losses["val"],
            "val_bpc": val_bpc,
            "elapsed": round(self.train_seconds, 3),
        }
        self.on_event(Phase(name="saving"))
        with self.signals.holding():
            if is_best:
                self.save("best.pt", metrics)
            if self.dist.is_main:
                files.append_line(self.out_dir / "metrics.jsonl", json.dumps(metrics))
            self.save("last.pt", metrics)
        sample = None if self.signals.requested else self.sample_text(min(self.cfg.sample_tokens, 120), seed=self.step)
        self.on_event(
            Evaluated(
                step=self.step,
                train_loss=losses["train"],
                val_loss=losses["val"],
                val_bpc=val_bpc,
                is_best=is_best,
                sample=sample,
            )
        )  # (no sample when the run is stopping)
        return losses["val"]

    def save(self, name: str, metrics: dict | None = None) -> None:
        """Write out_dir/name. With several processes every rank calls this and rank 0 writes: the file
        gets each rank's RNG states (for an exact resume) and a digest of each rank's weights, which
        must all be equal (DDP keeps them so; if not, rank 0's file alone would misrepresent the run)."""
        rng, world_size, digests = self.rng_state(), 1, None
        if self.dist.enabled:
            ranks = distributed.all_gather({"rng": rng, "weights": distributed.weights_digest(self.model.state_dict())})
            digests = [r["weights"] for r in ranks]
            if len(set(digests)) > 1:  # every rank sees the same list, so every rank raises
                raise RuntimeError(
                    f"the {len(digests)} processes hold different weights at step {self.step}: "
                    f"sha256 {', '.join(d[:12] for d in digests)}"
                )
            rng, world_size = {**rng, "ranks": [r["rng"] for r in ranks]}, len(ranks)
        if self.dist.is_main:
            saved = Saved(
                run_name=self.out_dir.resolve().name,
                model_config=self.model_cfg,
                train_config=self.cfg,
                tokenizer=self.tokenizer.to_json(),
                model=self.model.state_dict(),
                step=self.step,
                train_seconds=self.train_seconds,
                best_val_loss=self.best_val_loss,
                best_val_bpc=self.best_val_bpc,
                params=self.params,
                device=self.device,
                metrics=metrics or {"step": self.step},
                corpus=self.corpus,
                optimizer=self.optimizer.state_dict(),
                rng=rng,
                scaler=self.scaler.state_dict() if self.scaler else None,
                world_size=world_size,
                weights_sha256=digests,
            )
            checkpoint.save(saved, self.out_dir / name)
        if name == "last.pt":
            self.saved_step = self.step
        # the others wait until the file is written: once save() returns on any rank, a resume may read it
        distributed.barrier()

    def rng_state(self) -> dict:
        rng = {"data": self.data_gen.get_state(), "torch": torch.get_rng_state()}  # torch: dropout
        if self.device == "cuda":
            rng["cuda"] = torch.cuda.get_rng_state()
        return rng


def _load() -> float | None:
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):  # not on every system
        return None


def _step_of(line: str) -> int | None:
    """The step of a metrics.jsonl line; None for a line that is not one (cut short by a kill)."""
    try:
        step = json.loads(line).get("step")
    except (ValueError, AttributeError):
        return None
    return step if isinstance(step, int) else None


class _DeferredInterrupt:
    """While active, a first Ctrl-C or SIGTERM only sets `requested` (the loop stops cleanly at the next
    step); a second one raises KeyboardInterrupt at once, except inside holding(): a checkpoint being
    written is finished first (a KeyboardInterrupt inside torch.save would lose it), and the run stops
    right after, saved, ignoring any further signal (`stopping`, also set once the loop stops). Only the
    main thread can handle signals, so elsewhere it does nothing."""

    def __init__(self, *signums: int):
        self.signums = signums
        self.requested = False
        self.signum: int | None = None  # the first signal
        self.held = self.stopping = False
        self.previous: dict[int, object] = {}

    def _handle(self, signum, frame):
        if not self.requested:
            self.requested, self.signum = True, signum
        elif self.held:
            self.stopping = True
        elif not self.stopping:
            raise KeyboardInterrupt

    @contextmanager
    def holding(self):
        """Signals only set `requested` in here."""
        held, self.held = self.held, True
        try:
            yield
        finally:
            self.held = held

    def __enter__(self) -> _DeferredInterrupt:
        self.requested, self.signum, self.stopping = False, None, False
        if threading.current_thread() is threading.main_thread():
            self.previous = {s: signal.signal(s, self._handle) for s in self.signums}
        return self

    def __exit__(self, *exc) -> None:
        for s, previous in self.previous.items():  # None: set outside Python; fall back to the default
            signal.signal(s, previous if previous is not None else signal.SIG_DFL)
        self.previous = {}
