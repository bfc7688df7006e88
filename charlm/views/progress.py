"""Renders training events: a live Rich progress bar on a terminal, plain log lines otherwise. Either shows
the run from its first step: the bar says it is at its first step until one is done, and a log has a line for
step 1, then every log_every steps or LOG_SECONDS, whichever comes first (a loaded machine may take a minute
for 50 steps, and the first evaluation comes sooner)."""

from __future__ import annotations

import math
import os
import signal
import time

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from charlm.storage.checkpoint import BEST, LAST
from charlm.training.events import Encoding, Evaluated, Phase, Result, Started, Stepped, Stopping, TrainingInterrupted
from charlm.views.text import command_lines, duration, safe, safe_text, shell_quote

LOG_SECONDS = 10.0  # at most this long between two log lines of steps (a pipe or a file)
FIRST_STEP = "first step…"  # the bar's words until a step is done (the first one also warms up torch)


class TrainView:
    """Call it with each training event."""

    def __init__(self, console: Console, log_every: int = 50, corpus: str = "CORPUS"):
        self.console = console
        self.corpus = corpus  # the path the user trained on, for the resume command the summary prints
        self.live = console.is_terminal
        self.log_every = log_every
        self.progress: Progress | None = None
        self.encode_task = self.train_task = None
        self.total = 0
        self.tps = 0.0  # smoothed tokens/s
        self.last_val = ""
        self.last_step: tuple[int, float] | None = None  # (step, loss) of the latest step
        self.t_logged: float | None = None  # when the log's latest line of a step was written
        self.unsaid: Text | None = None  # a stop's acknowledgment that could not be written when the signal came
        self.loads: list[float] = []  # the machine's load average at each step: was it busy?
        self.readings: list[tuple[float, float, int]] = []  # (others, own, threads) at each step: Stepped's
        self.started: Started | None = None
        # wall-clock marks, so the summary's time adds up to what the user waited
        self.t_created = time.perf_counter()
        self.t_started: float | None = None

    def __call__(self, event) -> None:
        self._say_unsaid()
        if isinstance(event, Encoding):
            self._encoding(event)
        elif isinstance(event, Started):
            self._started(event)
        elif isinstance(event, Stepped):
            self._stepped(event)
        elif isinstance(event, Evaluated):
            self._evaluated(event)
        elif isinstance(event, Phase):
            self._phase(event)
        elif isinstance(event, Stopping):
            self._stopping(event)

    def _print(self, *objects, **kw) -> None:
        """Prose, wrapped at spaces by Rich on a terminal (the terminal would split words); a log line in a pipe
        or a file stays whole, as long as it is."""
        self.console.print(*objects, soft_wrap=not self.live, **kw)

    def _command(self, command: str, lead: str = "  ") -> None:
        """A command to be copied: broken between its words with ' \\' to fit the terminal, never inside one."""
        for line in command_lines(command, self.console.width if self.live else None, lead=lead):
            self.console.print(line, soft_wrap=True, markup=False, highlight=False)

    def _stopping(self, e: Stopping) -> None:
        """A signal asked the run to stop: say so at once (the save may take a moment)."""
        if not e.saving:
            return  # in set-up: the run stops at once, and interrupted() says so
        name = "" if e.signum == signal.SIGINT else f"{signal.Signals(e.signum).name}: "
        line = f"{name}stopping: saving after this batch… Ctrl-C again to quit without saving"
        if self.live and self.train_task is not None:
            self.progress.update(self.train_task, description="stopping")
        try:
            self._print(Text(line, style="yellow"))
        except RuntimeError:  # the signal came while this process wrote to the same stream ("reentrant call")
            self.unsaid = Text(line, style="yellow")  # said with the next event, or with the interruption

    def _say_unsaid(self) -> None:
        if self.unsaid is not None:
            line, self.unsaid = self.unsaid, None
            self._print(line)

    def _phase(self, e: Phase) -> None:
        """Name the work between steps on the bar, which would otherwise sit still without a word."""
        if self.live and self.train_task is not None:
            self.progress.update(self.train_task, description=e.name)

    def _ensure_progress(self) -> Progress:
        if self.progress is None:
            self.progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(bar_width=None),  # the room the words leave it
                TextColumn("{task.fields[info]}"),
                TimeRemainingColumn(),
                console=self.console,
                transient=False,
            )
            self.progress.start()
        return self.progress

    def _encoding(self, e: Encoding) -> None:
        if not self.live:
            return
        p = self._ensure_progress()
        if self.encode_task is None:
            self.encode_task = p.add_task("encoding", total=e.total, info="")
        p.update(self.encode_task, completed=e.done, info=f"{e.done / 1e6:.1f}/{e.total / 1e6:.1f} MB")

    def _started(self, e: Started) -> None:
        self.started, self.t_started = e, time.perf_counter()
        m, t = e.model_config, e.train_config
        # a time-only run has an effectively unlimited step count: don't print 1000000000 steps
        budget = " or ".join(
            ([f"{t.steps} steps"] if t.step_limited else []) + ([duration(t.max_time)] if t.max_time else [])
        )
        resumed = f", resuming at step {e.start_step}" if e.start_step else ""
        batch = f"batch {t.batch_size}"
        if t.grad_accum > 1 or e.world_size > 1:  # the effective batch: what one optimizer step sees
            batch += (
                f" × {t.grad_accum} accum × {e.world_size} processes = {t.batch_size * t.grad_accum * e.world_size}"
            )
        self._print(
            f"[bold]charlm train[/] {m.describe()}, {e.params / 1e6:.2f}M params, "
            f"{t.tokenizer} tokenizer ({e.vocab_size} tokens), on {e.device}"
        )
        self._print(
            Text(
                f"  data: {e.train_tokens:,} train / {e.val_tokens:,} val tokens · {batch} · "
                f"lr {t.lr:g} · {budget}{resumed} · saving to "
            )
            + safe(e.out_dir)
        )
        self.total = t.steps
        if self.live:
            p = self._ensure_progress()
            if self.encode_task is not None:
                p.update(self.encode_task, visible=False)
            self.train_task = p.add_task(
                "training",
                total=t.max_time if t.max_time else t.steps,
                completed=0 if t.max_time else e.start_step,
                info=FIRST_STEP,
            )

    def _info(self, width: int | None = None) -> str:
        """The bar's words: the latest step, its loss, the latest evaluation, the speed; within `width` (the
        room a live bar leaves them), the speed, then the loss left out rather than a number cut."""
        if self.last_step is None:
            return ""
        step, loss = self.last_step
        val = [self.last_val.removeprefix(" · ")] if self.last_val else []
        parts = [f"step {step}", f"loss {loss:.3f}", *val, f"{self.tps:,.0f} tok/s"]
        for drop in ((), (3 if val else 2,), (1, 3 if val else 2)):
            text = " · ".join(p for k, p in enumerate(parts) if k not in drop)
            if width is None or len(text) <= width:
                return text
        return text

    def _bar_info(self) -> str:
        """_info on a live bar: the console's width less its label, a short bar and the time left."""
        return self._info(self.console.width - 28)

    def _stepped(self, e: Stepped) -> None:
        self.tps = e.tokens_per_s if self.tps == 0 else 0.9 * self.tps + 0.1 * e.tokens_per_s
        if e.load is not None:
            self.loads.append(e.load)
        if e.others is not None:
            self.readings.append((e.others, e.own, e.threads))
        self.last_step = (e.step, e.loss)
        info = self._bar_info() if self.live else self._info()
        if self.live:
            t = self.started.train_config
            done = min(e.elapsed, t.max_time) if t.max_time else e.step
            if t.max_time:  # whichever budget runs out first drives the bar
                done = max(done, t.max_time * e.step / t.steps)
            self.progress.update(self.train_task, completed=done, info=info, description="training")
        elif (
            self.t_logged is None or e.step % self.log_every == 0 or time.perf_counter() - self.t_logged >= LOG_SECONDS
        ):
            self.t_logged = time.perf_counter()
            self._print(f"{info} · {duration(e.elapsed)}", highlight=False)

    def _evaluated(self, e: Evaluated) -> None:
        self.last_val = f" · val {e.val_loss:.3f} ({e.val_bpc:.2f} bpc)"
        if self.live and self.train_task is not None:  # the bar shows this evaluation, not the one before
            self.progress.update(self.train_task, info=self._bar_info(), description="training")
        best = " [green]best[/]" if e.is_best else ""
        self._print(
            f"[cyan]eval[/] step {e.step}: train {e.train_loss:.4f} · val {e.val_loss:.4f} · "
            f"{e.val_bpc:.3f} bits/char{best}",
            highlight=False,
        )
        if e.sample is not None:  # a preview: one line, cut to the terminal's width (whole in a log)
            preview = Text("  ") + Text(safe_text(e.sample.replace("\n", " ⏎ ")), style="dim italic")
            self._print(preview, **({"no_wrap": True, "overflow": "ellipsis"} if self.live else {}))

    def interrupted(self, e: TrainingInterrupted, resume: str | None) -> None:
        """A signal stopped the run: where it got to, what its last checkpoint holds, and the command that continues it."""
        try:
            self.close()
            self._say_unsaid()
            name = "interrupted" if e.signum == signal.SIGINT else f"stopped by {signal.Signals(e.signum).name}"
            at = f" at step {e.result.step}" if e.result else " before training started"
            if e.out_dir is None or e.saved_step is None:
                self._print(Text.assemble("\n", (name, "yellow"), f"{at}; nothing saved"))
                return
            last = safe(f"{e.out_dir}/{LAST}")
            if e.result and e.saved_step == e.result.step:
                self._print(Text.assemble("\n", (name, "yellow"), f"{at}; saved ", last))
            else:
                unsaved = " without saving" if e.result else ""
                self._print(
                    Text.assemble("\n", (name, "yellow"), f"{at}{unsaved}; ", last, f" holds step {e.saved_step}")
                )
            # quoted for the shell, and never read as markup: paths may hold spaces, [brackets] or escapes
            if resume:
                self._command(resume, lead="resume with: ")
        except OSError:  # the terminal is gone (SIGHUP): what was saved is saved
            pass

    def finish(self, result: Result) -> None:
        self.close()
        table = Table(
            title="training done" if result.stopped != "interrupted" else "training interrupted", show_header=False
        )
        table.add_column(style="bold")
        table.add_column(overflow="fold")  # a path is folded, never cut with an ellipsis
        why = {"steps": "reached --steps", "time": "--max-time ran out", "until": "paused", "interrupted": "Ctrl-C"}
        table.add_row("steps", f"{result.step} ({why[result.stopped]})")
        table.add_row("time", self._time(result))
        table.add_row("parameters", f"{result.params:,}")
        table.add_row("speed", f"{result.tokens_per_s or self.tps:,.0f} tokens/s")  # the median over the steps
        if result.best_val_loss is not None:
            table.add_row(
                "best val loss", f"{result.best_val_loss:.4f} nats/token · {result.best_val_bpc:.3f} bits/char"
            )
        # (a space before the names: a narrow table breaks the line there, not inside a file name)
        table.add_row("checkpoints", safe(f"{result.out_dir}/ ({BEST}, {LAST})"))
        self._print(table)
        if busy := self._busy(result) or self._slow(result):
            self._print(Text(busy, style="yellow"))
        if result.sample:
            self._print("[bold]sample:[/]")
            self._print(Text(safe_text(result.sample), style="italic"))
        run = shell_quote(result.out_dir)  # printed to be copied into a shell, never read as markup
        if self._barely_learned(result):
            uniform = math.log(self.started.vocab_size)
            self._print(
                f"\n[bold yellow]train longer:[/] val loss {result.best_val_loss:.2f} nats/token is still "
                f"{result.best_val_loss / uniform:.0%} of a uniform guess among {self.started.vocab_size} tokens "
                f"({uniform:.2f}): the model has barely started to learn. Continue it with a larger total time:"
            )
            self._command(f"charlm train {shell_quote(self.corpus)} --out {run} --resume --max-time 10m")
        self._print("\n[bold]try next:[/]")
        for command in (f"charlm chat {run}", f'charlm sample {run} --prompt "..."', f"charlm info {run}"):
            self._command(command)

    def _busy(self, result: Result) -> str:
        """A word on a CPU that other programs kept busy: training then does fewer steps than the machine
        can, and the result reads worse than it is."""
        if self.started is None or self.started.device != "cpu":
            return ""
        if len(self.readings) >= 10:  # what the trainer measured: other programs' CPU time and its own
            cores = os.cpu_count() or 1
            others, own, threads = (sorted(r)[len(r) // 2] for r in zip(*self.readings))  # medians
            if others < max(0.5, 0.25 * cores):
                return ""
            usual, now = result.usual_tokens_per_s, result.tokens_per_s or self.tps
            if usual and now and now >= 0.9 * usual:  # others ran, but gave way (niced): no steps were lost
                return ""
            return (
                f"the CPU was busy: other programs kept {others:.1f} of its {cores} cores busy, so this run used "
                f"{own:.1f} ({own / cores:.0%} of the machine, torch on {threads} thread{'s' * (threads > 1)}) at "
                f"{result.tokens_per_s or self.tps:,.0f} tokens/s, and did fewer steps than this machine can alone. Train again when it "
                "is quieter, or for longer."
            )
        if len(self.loads) < 10:
            return ""
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        load = sorted(self.loads)[len(self.loads) // 2]  # the median: one spike is no busy machine
        if load <= 1.5 * cores:
            return ""
        return (
            f"the CPU was busy: load {load:.1f} on {cores} cores, so this run had about {cores / load:.0%} of it "
            f"({self.tps:,.0f} tokens/s) and did fewer steps than this machine can alone. Train again when it is "
            "quieter, or for longer."
        )

    def _slow(self, result: Result) -> str:
        """A word on a run much slower than this machine has trained the same set-up before (another program
        on one of two cores makes torch's threads wait on each other at every step: a 3x slower run, though
        the load average hardly shows it)."""
        usual, now = result.usual_tokens_per_s, result.tokens_per_s
        if not usual or not now or now >= 0.6 * usual:
            return ""
        return (
            f"this run trained at {now:,.0f} tokens/s, {usual / now:.1f}x slower than this machine has trained the "
            f"same model before ({usual:,.0f}): the CPU was busy, so it did fewer steps than it can. Train again "
            "when it is quieter, or for longer."
        )

    def _time(self, result: Result) -> str:
        """Training time (evaluations included), and what else the wait held, so the numbers add up."""
        if self.started is None or self.t_started is None:
            return duration(result.train_seconds)
        session = result.train_seconds - self.started.start_seconds
        setup = self.t_started - self.t_created
        after = max(0.0, time.perf_counter() - self.t_started - session)
        text = f"{duration(session)} training, evaluations included"
        if self.started.start_seconds:
            text += f" ({duration(result.train_seconds)} with the earlier sessions)"
        return (
            text + f" · {duration(setup + session + after)} in all: {duration(setup)} to set up and encode, "
            f"{duration(after)} for the last evaluation and sample"
        )

    def _barely_learned(self, result: Result) -> bool:
        """Val loss above 60% of a uniform guess's, ln(vocab): on English characters that is about what
        letter frequencies alone give (~2.9 of 4.2 nats); two minutes of the tiny preset reach ~40%."""
        return (
            result.best_val_loss is not None
            and self.started is not None
            and self.started.vocab_size > 1
            and result.best_val_loss > 0.6 * math.log(self.started.vocab_size)
        )

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None
