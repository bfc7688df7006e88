"""The training loop: Muon + AdamW (or AdamW alone), warmup + cosine schedule, gradient clipping,
periodic evaluation, atomic checkpoints and exact resume. Gradient accumulation (grad_accum micro-batches per step), and
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
from itertools import zip_longest
from pathlib import Path
from typing import NoReturn

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from charlm import checkpoint, distributed, files, runs
from charlm.checkpoint import Corpus, Saved
from charlm.config import ModelConfig, SampleConfig, TrainConfig
from charlm.data import Batches, CorpusError, bits_per_char, corpus_sha256, load_tokens, prepare
from charlm.errors import ConfigError, UserError
from charlm.generate import Streamer
from charlm.models import build_model, count_params
from charlm.optim import make_optimizer
from charlm.runtime import autocast_dtype, pick_device
from charlm.settings import shown
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
class Stopping:
    """A signal (Ctrl-C, SIGTERM, SIGHUP) asked the run to stop: sent at once, from the signal handler."""

    signum: int
    saving: bool  # the run saves before it stops (False: in set-up, there is nothing to save yet)


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
    """Ctrl-C, SIGTERM or SIGHUP stopped the run. signum: the signal that stopped it; result: where training
    got to (None: stopped in set-up); saved_step: the step out_dir/last.pt holds (None: there is none), which
    is result.step unless a second signal quit without saving."""

    def __init__(
        self,
        result: Result | None,
        signum: int = signal.SIGINT,
        *,
        out_dir: Path | None = None,
        saved_step: int | None = -1,
    ):
        super().__init__("interrupted")
        self.result, self.signum = result, signum
        self.out_dir = out_dir if out_dir is not None else result.out_dir if result else None
        self.saved_step = result.step if saved_step == -1 and result else None if saved_step == -1 else saved_step


class _Abandon(Exception):
    """A stop was asked for: the evaluation or sample under way is given up (the run saves and stops)."""


class _Quit(Exception):
    """A second signal: stop now, without saving."""

    def __init__(self, signum: int):
        self.signum = signum


class SetupInterrupted(Exception):
    """A signal before training started (nothing of this session to save)."""

    def __init__(self, signum: int):
        self.signum = signum


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
    model,
    batches: Batches,
    cfg: TrainConfig,
    device: str,
    autocast,
    rank: int = 0,
    world_size: int = 1,
    abandon=lambda: False,
) -> dict[str, float]:
    """Mean loss over the same eval_iters windows of each split every time (a fixed generator), so
    evaluations are comparable and never disturb the training RNG. With several processes, each
    computes every world_size-th window and the sums are added up: the same numbers on every rank.
    abandon() is asked before each batch: True gives the evaluation up (_Abandon)."""
    model.eval()
    sums = []
    try:
        for split in ("train", "val"):
            gen = torch.Generator().manual_seed(cfg.seed + 1)
            total = 0.0
            for i in range(cfg.eval_iters):
                if abandon():
                    raise _Abandon
                x, y = batches.get_batch(
                    split, cfg.batch_size, gen, device
                )  # every rank draws every window: gens stay in step
                if i % world_size == rank:
                    with autocast:
                        _, loss = model(x, y)
                    total += loss.item()
            sums.append(total)
        train, val = distributed.all_sum(sums)
    finally:
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
        signals: RunSignals | None = None,
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
        # entered by fit() (and by commands.train, which passes its own, for the whole command); outside it,
        # holding() changes nothing
        self.signals = signals or RunSignals(
            *stop_signals(self.dist.enabled),
            notify=lambda signum, saving: self.on_event(Stopping(signum=signum, saving=saving)),
        )
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
        self.next_eval = self.EVAL_GAP  # the budget_spent() at which the next evaluation is due (no --eval-interval)
        self.saved_step = None  # the step last.pt was last written at by this process
        self.best_val_loss = self.best_val_bpc = None
        amp = autocast_dtype(self.device, self.cfg.precision)
        self.autocast = torch.autocast(self.device, dtype=amp) if amp else nullcontext()
        # fp16's narrow range needs a gradient scaler; bf16 has float32's range and does not
        self.scaler = torch.amp.GradScaler("cuda") if amp == torch.float16 else None

    def _restore(self, saved: Saved) -> None:
        """Weights, optimizer, RNGs and counters of the saved run: it continues exactly. A state that does not
        fit this model and machine (a crafted or damaged last.pt) is a CheckpointError that names the file."""
        path = self.out_dir / "last.pt"
        self.model.load_state_dict(saved.model)
        _load_optimizer(self.optimizer, saved.optimizer, path)
        ranks = saved.rng.get("ranks") if isinstance(saved.rng, dict) else None
        if self.dist.enabled and not (isinstance(ranks, list) and len(ranks) == self.dist.world_size):
            raise _unusable(path, "no random state for each process")
        rng = ranks[self.dist.rank] if self.dist.enabled else saved.rng
        _set_rng(self.data_gen, rng, self.device, path)
        if self.scaler and saved.scaler:
            try:
                self.scaler.load_state_dict(saved.scaler)
            except (ValueError, KeyError, TypeError, RuntimeError, AttributeError):
                raise _unusable(path, "a damaged gradient scaler state") from None
        self.step, self.train_seconds = saved.step, saved.train_seconds
        self.saved_step = saved.step  # what last.pt holds: a second Ctrl-C reports it
        self.best_val_loss, self.best_val_bpc = saved.best_val_loss, saved.best_val_bpc
        self.next_eval = self.spent() + self.EVAL_GAP  # a resumed run too shows a validation loss early
        best = self.out_dir / "best.pt"
        if not best.exists():
            return
        try:
            other = checkpoint.read_header(best)
        except checkpoint.CheckpointError as e:  # (its message says last.pt is there: move best.pt away)
            raise checkpoint.CheckpointError(f"{e}, then resume (the next evaluation writes a new best.pt)") from None
        if (other.model_config, other.tokenizer, other.corpus and other.corpus.sha256) != (
            saved.model_config,
            saved.tokenizer,
            saved.corpus.sha256,
        ):  # it would be kept as the run's best, and `charlm sample` of the run would use it
            raise checkpoint.CheckpointError(
                f"{best} is not this run's: it holds a {other.model_config.describe()} with another tokenizer or "
                f"corpus than {path}; move it away, then resume"
            )
        # a best.pt written after last.pt (a kill fell between the two: see the module's docstring) holds
        # the run's best so far
        if best.stat().st_mtime_ns > path.stat().st_mtime_ns:
            if other.best_val_loss is not None and (
                self.best_val_loss is None or other.best_val_loss < self.best_val_loss
            ):
                self.best_val_loss, self.best_val_bpc = other.best_val_loss, other.best_val_bpc

    def _drop_metrics_beyond(self, step: int) -> None:
        """metrics.jsonl as last.pt, the commit record, knows it: the lines of later steps, which a process
        killed before it wrote last.pt left, go (the run writes them again); every other line stays as it is
        (plot skips what is not an evaluation). Read a line at a time: the file may be large."""
        log = self.out_dir / "metrics.jsonl"
        if not self.dist.is_main or not os.path.lexists(log):
            return
        if why := files.not_regular(log):
            raise ConfigError(f"{log} is {why}, not a regular file: remove it, or choose another --out")

        def kept(f):
            for line in _lines(f):
                at = _step_of(line)
                if at is not None and at > step:
                    continue
                if not line.endswith(b"\n"):  # the last line, cut short by a kill: nothing can be appended to it
                    if at is None:
                        continue
                    line += b"\n"
                yield line

        try:
            with open(log, "rb") as f, open(log, "rb") as g:
                changed = any(a != b for a, b in zip_longest(_lines(f), kept(g)))
            if changed:
                with open(log, "rb") as f:
                    files.atomic_write(log, lambda out: out.writelines(kept(f)))
        except OSError as e:
            raise ConfigError(f"cannot read {log}: {e.strerror}") from None

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
        with self.signals, self.signals.deferring() as signals:
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
            try:
                while self.step < cfg.steps:
                    # every rank must leave the loop at the same step: they agree on Ctrl-C and on the clock
                    # (the max over ranks), which also gives them the same learning rate under --max-time
                    stop, self.train_seconds = distributed.all_max([float(signals.requested), self.train_seconds])
                    if stop:  # between steps, so the saved state is exactly this step's
                        self.stop(last_val)
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
                    # checked before the optimizer step, so the weights (and any checkpoint saved later) stay
                    # good; an infinite gradient norm would make clipping zero the gradients and stall the run
                    # silently. Both values are the same on every rank, so all ranks stop together.
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
                result = self.result(stopped, last_val)  # the final sample: a signal cuts it short
                if signals.requested:
                    self.stop(last_val)
                return result
            except _Abandon:  # an evaluation or sample given up for a stop: save at this step
                self.stop(last_val)
            except _Quit as e:  # a second signal: no save
                raise TrainingInterrupted(
                    self.result("interrupted", last_val), e.signum, saved_step=self.saved_step
                ) from None

    def stop(self, last_val: float | None) -> NoReturn:
        """A signal asked the run to stop: save last.pt at this step (unless an evaluation just did), then
        raise TrainingInterrupted. Further signals are ignored from here on."""
        self.signals.stopping = True
        if self.saved_step != self.step:
            with self.signals.holding():
                self.save("last.pt")
        raise TrainingInterrupted(self.result("interrupted", last_val), self.signals.signum or signal.SIGINT)

    # Without --eval-interval: the first evaluation after 5% of the budget (a short run shows a validation
    # loss early, not only at its end), then at least 5% of the budget apart, and far enough apart that
    # evaluating takes at most ~5% of the time (a two-minute CPU run evaluates ~3 times, an hour ~20 times).
    EVAL_GAP = EVAL_SHARE = 0.05

    def spent(self) -> float:
        """The fraction of the budget (steps or time, whichever runs out first) spent."""
        p = self.step / self.cfg.steps
        return max(p, self.train_seconds / self.cfg.max_time) if self.cfg.max_time else p

    def budget_spent(self) -> float:
        """spent(), the same on every rank: their clocks differ, and they must evaluate together."""
        return distributed.all_max([self.spent()])[0]

    def eval_due(self) -> bool:
        if self.step >= self.cfg.steps:
            return True
        if self.cfg.eval_interval:
            return self.step % self.cfg.eval_interval == 0
        return self.budget_spent() >= self.next_eval

    def scheduled_eval(self) -> float:
        """evaluate_and_save, then the next evaluation's place in the budget from what this one cost."""
        t0 = time.perf_counter()
        val = self.evaluate_and_save()
        (cost,) = distributed.all_max([time.perf_counter() - t0])
        done = self.budget_spent()
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

    def abandoning(self) -> bool:
        """Give up the evaluation or sample under way: a stop was asked for. (Not with several processes: they
        must all take part in every evaluation; they agree on the stop at the next step.)"""
        return self.signals.requested and not self.dist.enabled

    def sample_text(self, n_tokens: int, seed: int) -> str | None:
        """A short sample from the model on rank 0 (its own RNG: the training RNG is never touched); None when
        a stop is asked for meanwhile."""
        if not n_tokens or not self.dist.is_main or self.signals.requested:
            return None
        self.on_event(Phase(name="sampling"))
        self.model.eval()
        pieces = []
        try:
            for piece in Streamer(self.model, self.tokenizer).stream(
                [], SampleConfig(temperature=0.8, max_tokens=n_tokens, seed=seed)
            ):
                if self.signals.requested:
                    return None
                pieces.append(piece)
        finally:
            self.model.train()
        return "".join(pieces)

    def evaluate_and_save(self) -> float:
        """Evaluate; write best.pt when val loss improved, then the metrics line, then last.pt (the commit
        record: see the module's docstring), with signals held off until all three are written. Returns val loss."""
        self.on_event(Phase(name="evaluating"))
        losses = evaluate(
            self.model,
            self.batches,
            self.cfg,
            self.device,
            self.autocast,
            self.dist.rank,
            self.dist.world_size,
            abandon=self.abandoning,
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
        sample = self.sample_text(min(self.cfg.sample_tokens, 120), seed=self.step)
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


def _unusable(path: Path, what: str) -> checkpoint.CheckpointError:
    return checkpoint.CheckpointError(
        f"{path} cannot be resumed: it holds {what}; sample from it, or train a new run with another --out"
    )


def _load_optimizer(optimizer, state, path: Path) -> None:
    """optimizer.load_state_dict(state), with every tensor of the state checked against its parameter: torch
    takes a state of the wrong shape and fails (or trains on garbage) only at the next step. The settings of
    each group (betas, weight decay...) stay the ones this run's config gives."""
    settings = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    try:
        optimizer.load_state_dict(state)
    except (ValueError, KeyError, TypeError, IndexError, RuntimeError, AttributeError, ConfigError) as e:
        raise _unusable(path, f"an optimizer state that does not fit this model ({type(e).__name__})") from None
    for group, kept in zip(optimizer.param_groups, settings):
        group.update(kept)
    for o in optimizer.optimizers:
        params = {p for g in o.param_groups for p in g["params"]}
        for key in [k for k in o.state if k not in params]:  # state of no parameter of this model
            del o.state[key]
        for p, entry in o.state.items():
            if not isinstance(entry, dict):
                raise _unusable(path, "a damaged optimizer state")
            for name, value in entry.items():
                ok = isinstance(value, torch.Tensor) and value.is_floating_point()
                ok = ok and (value.numel() == 1 if name == "step" else value.shape == p.shape)
                if not ok or not bool(torch.isfinite(value).all()) or name == "step" and value.item() < 0:
                    raise _unusable(path, f"an optimizer state that does not fit this model ({shown(name)})")


def _set_rng(data_gen: torch.Generator, rng, device: str, path: Path) -> None:
    """The random states of a run (its batches', torch's for dropout, CUDA's), each checked before use."""
    if not isinstance(rng, dict):
        raise _unusable(path, "a damaged random state")
    for name, generator in (("data", data_gen), ("torch", None)):
        state = rng.get(name)
        if not (isinstance(state, torch.Tensor) and state.dtype == torch.uint8 and state.shape == (_RNG_BYTES,)):
            raise _unusable(path, f"a damaged random state ({name})")
        try:
            (generator or torch.Generator()).set_state(state)
        except (RuntimeError, TypeError, ValueError):
            raise _unusable(path, f"a damaged random state ({name})") from None
    torch.set_rng_state(rng["torch"])
    if device == "cuda" and isinstance(rng.get("cuda"), torch.Tensor):
        try:
            torch.cuda.set_rng_state(rng["cuda"])
        except (RuntimeError, TypeError, ValueError):
            raise _unusable(path, "a damaged random state (cuda)") from None


_RNG_BYTES = torch.Generator().get_state().numel()  # a CPU generator's state: 5056 bytes


def _load() -> float | None:
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):  # not on every system
        return None


def _lines(f, longest: int = 1 << 20):
    """The lines of a binary file, none longer than `longest` bytes (a longer one comes in pieces)."""
    return iter(lambda: f.readline(longest), b"")


def _step_of(line: bytes | str) -> int | None:
    """The step of a metrics.jsonl line; None for a line that is not one (cut short by a kill, not UTF-8...)."""
    try:
        step = json.loads(line).get("step")
    except (ValueError, AttributeError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def stop_signals(distributed_run: bool = False) -> tuple[int, ...]:
    """The signals that stop a run, saved: Ctrl-C, SIGTERM (kill, timeout, a scheduler) and SIGHUP (the terminal
    closed). Under torchrun only Ctrl-C: SIGTERM and SIGHUP stay the launcher's way to stop a rank (one blocked
    in a collective whose peer died cannot run a Python handler)."""
    extra = () if distributed_run else (signal.SIGTERM, *([signal.SIGHUP] if hasattr(signal, "SIGHUP") else []))
    return (signal.SIGINT, *extra)


class RunSignals:
    """What the stop signals do to a run, from its set-up to its exit.

    Entered (`with signals:`), it installs its handler. In set-up a first signal raises SetupInterrupted at
    once. Inside deferring() (fit: training, evaluations, samples, saves) a first signal only sets `requested`
    and tells notify() at once; the run gives up an evaluation or sample under way, saves at the step it is
    at and stops. A second signal quits without saving (_Quit), except inside holding(): a checkpoint being
    written is finished first (a signal inside torch.save would lose it), and the run stops right after,
    saved. Once a stop is under way (`stopping`) or training is over, further signals are ignored. With
    settle=True they stay ignored once the block ends (a process that only has to print and exit); else the
    handlers before are back. Only the main thread can handle signals, so elsewhere it does nothing."""

    def __init__(self, *signums: int, notify=None, settle: bool = False):
        self.signums, self.settle = signums, settle
        self.notify = notify or (lambda signum, saving: None)
        self.requested = False
        self.signum: int | None = None  # the first signal
        self.held = self.stopping = self.deferred = self.over = False
        self.depth = 0
        self.previous: dict[int, object] = {}

    def _handle(self, signum, frame):
        if self.stopping or self.over:
            return
        if not self.requested:
            self.requested, self.signum = True, signum
            if not self.deferred:
                self.stopping = True
                self._tell(signum, saving=False)
                raise SetupInterrupted(signum)
            self._tell(signum, saving=True)
        elif self.held:
            self.stopping = True
        else:
            self.stopping = True
            raise _Quit(signum)

    def _tell(self, signum: int, saving: bool) -> None:
        try:  # a terminal that closed (SIGHUP) cannot be written to: the save matters, the words do not
            self.notify(signum, saving)
        except (_Quit, SetupInterrupted):  # a second signal while the first was being told
            raise
        except Exception:
            pass

    @contextmanager
    def holding(self):
        """Signals only set `requested` in here."""
        held, self.held = self.held, True
        try:
            yield
        finally:
            self.held = held

    @contextmanager
    def deferring(self):
        """Training: a first signal asks for a stop, saved; see the class."""
        self.requested, self.signum, self.stopping, self.over, self.deferred = False, None, False, False, True
        try:
            yield self
        finally:
            self.deferred, self.over = False, True

    def __enter__(self) -> RunSignals:
        self.depth += 1
        if self.depth == 1:
            self.requested, self.signum, self.stopping, self.over = False, None, False, False
            if threading.current_thread() is threading.main_thread():
                self.previous = {s: signal.signal(s, self._handle) for s in self.signums}
        return self

    def __exit__(self, *exc) -> None:
        self.depth -= 1
        if self.depth:
            return
        for s, previous in self.previous.items():  # None: set outside Python; fall back to the default
            signal.signal(s, signal.SIG_IGN if self.settle else previous if previous is not None else signal.SIG_DFL)
        self.previous = {}
