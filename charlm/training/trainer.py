"""The training loop: Muon for the hidden matrices + AdamW for the rest (or AdamW alone: --optimizer), warmup +
cosine schedule (schedule.py), gradient clipping, periodic evaluation, atomic checkpoints and exact resume
(resume.py). Gradient accumulation (grad_accum micro-batches per step), and under torchrun one process per rank
with DistributedDataParallel (see charlm.training.distributed): each rank samples its own batches, every rank runs the
same loop and takes part in every collective, rank 0 writes.

The trainer never prints. It reports what happens as events (events.py) to a callback; the CLI renders them.

Nothing is lost to an interruption: Ctrl-C and SIGTERM stop the run at a step boundary, saved (stopping.py); a
second signal cannot cut a save short; and an evaluation writes best.safetensors, then its metrics.jsonl line, then
last.safetensors, the run's commit record. A resume drops what a kill left beyond last.safetensors (metrics lines of
later steps) and adopts a best.safetensors written after it, so every file agrees with every other.

(About 490 lines: the Trainer's set-up, loop, evaluation and saving stay together so that one run reads top to
bottom in one place; each job of its own lives beside it: schedule.py, stopping.py, resume.py, events.py.)
"""

from __future__ import annotations

import json
import math
import os
import signal
import statistics
import time
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path
from typing import NoReturn

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from charlm import files
from charlm.config import ModelConfig, SampleConfig, TrainConfig
from charlm.data import Batches, CorpusError, bits_per_char, load_tokens, prepare
from charlm.generate import Streamer
from charlm.models import build_model, count_params
from charlm.runtime import CpuShare, autocast_dtype, pick_device
from charlm.storage import checkpoint
from charlm.storage.checkpoint import Corpus, Saved
from charlm.tokenizer import tokenizer_from_json
from charlm.training import distributed
from charlm.training.events import (
    Encoding,
    Evaluated,
    Phase,
    Result,
    Started,
    Stepped,
    Stopping,
    TrainingDiverged,
    TrainingInterrupted,
)
from charlm.training.optim import make_optimizer
from charlm.training.resume import Resumed, best_so_far, drop_metrics_beyond, restore_state, resume_run
from charlm.training.schedule import EvalSchedule, lr_at, spent
from charlm.training.stopping import Abandon, Quit, RunSignals, stop_signals


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
    abandon() is asked before each batch: True gives the evaluation up (Abandon)."""
    model.eval()
    sums = []
    try:
        for split in ("train", "val"):
            gen = torch.Generator().manual_seed(cfg.seed + 1)
            total = 0.0
            for i in range(cfg.eval_iters):
                if abandon():
                    raise Abandon
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
    """One training run: set up from a corpus (or from out_dir/last.safetensors when resuming), then fit().
    The configs are taken as given (validated where they were made); the caller's objects are never changed.
    resume: True continues the run in out_dir (resume.resume_run decides it here, for these configs), or the
    resume.Resumed a caller decided already (commands.train): then its configs are the run's.
    starts, mask (token-aligned, optional): windows begin at examples, the loss covers only the targets, in
    training and evaluation alike (data.Batches). They are the caller's to give again on a resume."""

    def __init__(
        self,
        corpus,
        model_cfg: ModelConfig,
        cfg: TrainConfig,
        out_dir,
        resume: bool | Resumed = False,
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
        # what other programs took of the CPU, for the summary and torch's threads (not under torchrun: the other
        # ranks would count)
        self.cpu_share = CpuShare(enabled=self.device == "cpu" and not self.dist.enabled)
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
        if resume is True:
            resume = resume_run(self.out_dir, corpus, model_cfg, cfg, self.dist.world_size)
        if resume:
            model_cfg, self.cfg = resume.model_cfg, resume.train_cfg
        self._prepare_data(corpus, model_cfg, resume.saved if resume else None)
        self._build()
        if resume:
            self._restore(resume)
        if self.dist.is_main:
            drop_metrics_beyond(self.out_dir, self.step)
        self._wrap()

    def _restore(self, resumed: Resumed) -> None:
        """The saved run's state and counters: it continues exactly."""
        restore_state(resumed, self.model, self.optimizer, self.data_gen, self.scaler, self.device, self.dist)
        saved = resumed.saved
        self.step, self.train_seconds = saved.step, saved.train_seconds
        self.saved_step = saved.step  # what last.safetensors holds: a second Ctrl-C reports it
        self.best_val_loss, self.best_val_bpc = best_so_far(resumed)
        self.schedule = EvalSchedule(self.cfg, spent(self.cfg, self.step, self.train_seconds))

    def _prepare_data(self, corpus, model_cfg: ModelConfig, saved: Saved | None) -> None:
        """Tokenizer and token ids; the model config gets the tokenizer's vocabulary size."""
        # one process per machine trains the tokenizer and encodes the corpus; the others wait, then
        # find both in the cache (CHARLM_CACHE) instead of doing the same work at the same time
        if self.dist.local_rank != 0:
            distributed.barrier()
        self.tokenizer, tokens_path, corpus_sha = prepare(
            corpus,
            self.cfg.tokenizer,
            self.cfg.bpe_vocab,
            tokenizer=tokenizer_from_json(saved.tokenizer) if saved else None,
            progress=lambda done, total: self.on_event(Encoding(done=done, total=total)),
            sha256=saved.corpus.sha256 if saved else None,  # checked equal to the file's hash by resume.resume_run
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
        self.teacher = (
            None  # distillation (charlm.training.distill): never loaded at weight 0, which trains as without one
        )
        if self.cfg.teacher is not None and self.cfg.distill_weight > 0:
            from charlm.training.distill import Teacher

            self.teacher = Teacher(self.cfg, self.tokenizer, self.model_cfg, self.device)
            self.cfg = self.teacher.recorded(self.cfg)  # by absolute path and sha256: a resume uses that file
        self.optimizer = make_optimizer(self.model, self.cfg, self.device)
        self.data_gen = torch.Generator().manual_seed(self.cfg.seed + self.dist.rank)  # each rank its own batches
        self.step, self.train_seconds = 0, 0.0
        self.schedule = EvalSchedule(self.cfg)
        self.saved_step = None  # the step last.safetensors was last written at by this process
        self.best_val_loss = self.best_val_bpc = None
        amp = autocast_dtype(self.device, self.cfg.precision)
        self.autocast = torch.autocast(self.device, dtype=amp) if amp else nullcontext()
        # fp16's narrow range needs a gradient scaler; bf16 has float32's range and does not
        self.scaler = torch.amp.GradScaler("cuda") if amp == torch.float16 else None

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
        with self.signals, self.signals.deferring() as signals, self.cpu_share.fitted_threads():
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
                    self.cpu_share.tick()
                    self.on_event(
                        Stepped(
                            step=self.step,
                            loss=loss_value,
                            lr=lr,
                            tokens_per_s=tokens_per_step / max(elapsed, 1e-9),
                            elapsed=self.train_seconds,
                            load=_load(),
                            others=self.cpu_share.others,
                            own=self.cpu_share.own,
                            threads=torch.get_num_threads(),
                        )
                    )
                    if self.schedule.due(self.step, self.budget_spent):
                        last_val, last_eval_step = self.scheduled_eval(), self.step
                if last_eval_step != self.step:  # stopped by the clock or `until` between evaluations
                    last_val = self.evaluate_and_save()
                result = self.result(stopped, last_val)  # the final sample: a signal cuts it short
                if signals.requested:
                    self.stop(last_val)
                return result
            except Abandon:  # an evaluation or sample given up for a stop: save at this step
                self.stop(last_val)
            except Quit as e:  # a second signal: no save
                raise TrainingInterrupted(
                    self.result("interrupted", last_val), e.signum, saved_step=self.saved_step
                ) from None

    def stop(self, last_val: float | None) -> NoReturn:
        """A signal asked the run to stop: save last.safetensors at this step (unless an evaluation just did), then
        raise TrainingInterrupted. Further signals are ignored from here on."""
        self.signals.stopping = True
        if self.saved_step != self.step:
            with self.signals.holding():
                self.save(checkpoint.LAST)
        raise TrainingInterrupted(self.result("interrupted", last_val), self.signals.signum or signal.SIGINT)

    def budget_spent(self) -> float:
        """The share of the budget spent (schedule.spent), the same on every rank: their clocks differ, and they
        must evaluate together."""
        return distributed.all_max([spent(self.cfg, self.step, self.train_seconds)])[0]

    def scheduled_eval(self) -> float:
        """evaluate_and_save, then the next evaluation's place in the budget from what this one cost."""
        t0 = time.perf_counter()
        val = self.evaluate_and_save()
        (cost,) = distributed.all_max([time.perf_counter() - t0])
        self.schedule.evaluated(self.budget_spent(), cost, self.train_seconds)
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
            if (self.out_dir / checkpoint.LAST).exists()
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
        """Evaluate; write best.safetensors when val loss improved, then the metrics line, then last.safetensors (the commit
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
                self.save(checkpoint.BEST, metrics)
            if self.dist.is_main:
                files.append_line(self.out_dir / "metrics.jsonl", json.dumps(metrics))
            self.save(checkpoint.LAST, metrics)
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
        must all be equal (DDP keeps them so; if not, rank 0's file alone would misrepresent the run). The
        training state (optimizer, random states, scaler) goes into the last checkpoint only: a resume reads that."""
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
            last = name == checkpoint.LAST
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
                optimizer=self.optimizer.state_dict() if last else None,
                rng=rng if last else None,
                scaler=self.scaler.state_dict() if self.scaler and last else None,
                world_size=world_size,
                weights_sha256=digests,
            )
            checkpoint.save(saved, self.out_dir / name)
        if name == checkpoint.LAST:
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
