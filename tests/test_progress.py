"""The live views of views/progress.py: the training view's bar, header, evaluations and summary, and the
commands it prints, at every width: the newest numbers at once, words and commands never cut, prose wrapped at
spaces."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from conftest import (
    strip_ansi,
)
from rich.console import Console


def test_the_progress_bar_shows_the_latest_evaluation_at_once():
    """Regression (issue 28, "Silence"): after the final evaluation the bar still showed the val loss of the
    evaluation before (it was only redrawn at the next step, and there is none after the last)."""
    import io

    from rich.console import Console

    from charlm.config import ModelConfig, TrainConfig
    from charlm.training.events import Evaluated, Started, Stepped
    from charlm.views.progress import TrainView

    view = TrainView(Console(file=io.StringIO(), force_terminal=True, width=120))
    started = dict(out_dir=Path("run"), device="cpu", params=1, start_step=0, train_tokens=1, val_tokens=1)
    view(Started(model_config=ModelConfig(), train_config=TrainConfig(steps=10), vocab_size=3, **started))
    view(Stepped(step=5, loss=2.0, lr=0.1, tokens_per_s=100, elapsed=1.0))
    view(Evaluated(step=5, train_loss=2.0, val_loss=3.874, val_bpc=5.5, is_best=True))
    view(Stepped(step=10, loss=1.5, lr=0.1, tokens_per_s=100, elapsed=2.0))
    view(Evaluated(step=10, train_loss=1.5, val_loss=1.234, val_bpc=1.8, is_best=True))  # the final one
    (task,) = view.progress.tasks
    view.close()
    assert "val 1.234" in task.fields["info"] and "3.874" not in task.fields["info"], task.fields["info"]


LONG_RUN = "checkpoints/tinyshakespeare-transformer-char-2nd-try"


def training_screen(cols: int, tmp_path, monkeypatch) -> tuple[str, object]:
    """What the training view prints on a terminal `cols` wide, with the console `charlm train` makes (soft_wrap:
    a log line in a pipe stays whole): the header, an evaluation with its sample, the summary of a run on a busy
    CPU that barely learned."""
    from conftest import tiny_train

    from charlm.config import ModelConfig
    from charlm.training.events import Evaluated, Result, Started, Stepped
    from charlm.views.progress import TrainView

    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1}, raising=False)
    screen = io.StringIO()
    view = TrainView(Console(file=screen, width=cols, height=40, force_terminal=True, soft_wrap=True), corpus="my.txt")

    def bar_elsewhere():  # the live bar redraws itself in place: draw it apart from the lines printed
        from rich.progress import Progress

        if view.progress is None:
            view.progress = Progress(console=Console(file=io.StringIO()))
            view.progress.start()
        return view.progress

    view._ensure_progress = bar_elsewhere
    cfg = tiny_train(50)
    view(Started(out_dir=LONG_RUN, device="cpu", params=1000, model_config=ModelConfig(vocab_size=65),
                 train_config=cfg, start_step=0, train_tokens=1000, val_tokens=100, vocab_size=65))  # fmt: skip
    for step in range(1, 21):
        view(Stepped(step=step, loss=4.0, lr=1e-3, tokens_per_s=5000.0, elapsed=step / 10, load=9.0))
    sample = "ROMEO:\nBut soft, what light through yonder window breaks? " * 6
    view(Evaluated(step=20, train_loss=4.0, val_loss=4.0, val_bpc=5.8, is_best=True, sample=sample))
    view.finish(Result(out_dir=LONG_RUN, step=20, stopped="steps", train_seconds=2.0, best_val_loss=4.0,
                       best_val_bpc=5.8, last_val_loss=4.0, params=1000))  # fmt: skip
    return strip_ansi(screen.getvalue()), view


def commands_in(lines: list[str]) -> list[str]:
    """The shell commands on a screen, their ' \\' continuation lines joined as a shell reads them."""
    found, current = [], ""
    for line in lines:
        if current or line.startswith("  charlm ") or line.startswith("resume with: charlm"):
            current += line.strip().removeprefix("resume with: ") if not current else " " + line.strip()
            if current.endswith(" \\"):
                current = current[:-2]
            else:
                found.append(current)
                current = ""
    return found


@pytest.mark.parametrize("cols", [60, 120])
def test_training_prose_wraps_at_spaces_and_commands_break_between_words(cols, tmp_path, monkeypatch):
    """Found: train's lines were wrapped by the terminal mid-word at every width (`…tinyshakespeare-transf⏎ormer-char`
    at 120 columns, `Train again w⏎hen`), and at 60 columns the commands meant to be copied broke
    (`--out checkpoints⏎/tinyshakespeare-lstm-char`); the samples at each evaluation overflowed even 200 columns."""
    out, _ = training_screen(cols, tmp_path, monkeypatch)
    lines = out.splitlines()
    assert max(map(len, lines)) <= cols, out  # nothing left for the terminal to wrap
    words = set(out.split())
    for word in ["quieter,", "Train", "again", "when", "barely", "started", LONG_RUN]:
        assert word in words, (word, out)  # each one whole
    run = LONG_RUN
    assert commands_in(lines) == [
        f"charlm train my.txt --out {run} --resume --max-time 10m",
        f"charlm chat {run}",
        f'charlm sample {run} --prompt "..."',
        f"charlm info {run}",
    ], out
    preview = [line for line in lines if line.startswith("  ROMEO:")]
    assert len(preview) == 1 and preview[0].endswith("…"), out  # the evaluation's sample: one line, cut


def test_the_resume_command_after_ctrl_c_breaks_between_words(tmp_path):
    """Found with the above: the resume command printed after Ctrl-C broke mid-path at 60 columns."""
    from charlm.training.events import TrainingInterrupted
    from charlm.views.progress import TrainView

    resume = f"charlm train 'my corpus.txt' --out {LONG_RUN} --resume"
    for cols in (60, 120):
        screen = io.StringIO()
        view = TrainView(Console(file=screen, width=cols, force_terminal=True, soft_wrap=True))
        view.interrupted(TrainingInterrupted(None, out_dir=LONG_RUN, saved_step=5), resume)
        lines = strip_ansi(screen.getvalue()).splitlines()
        assert max(map(len, lines)) <= cols and commands_in(lines) == [resume], lines
    piped = io.StringIO()  # a log keeps it on one line, as long as it is
    TrainView(Console(file=piped, width=60, soft_wrap=True)).interrupted(
        TrainingInterrupted(None, out_dir=LONG_RUN, saved_step=5), resume
    )
    assert f"resume with: {resume}\n" in piped.getvalue()


def test_a_command_broken_to_fit_reads_back_as_the_same_words():
    """command_lines breaks only between words: the shell reads the lines (joined at their ' \\') as the words of
    the command, for paths with spaces, quotes and escapes alike, at every width."""
    import shlex

    from charlm.views.text import command_lines, shell_quote

    paths = ["checkpoints/run", "my runs/a b", "it's here", "tab\there", "[bold]x", "é/ü 3"]
    for path in paths:
        command = f"charlm train {shell_quote(path + '.txt')} --out {shell_quote(path)} --resume --max-time 10m"
        for width in (20, 40, 60, 200):
            lines = command_lines(command, width)
            joined = "\n".join(lines).replace(" \\\n", " ")
            if "\t" not in path:  # ($'...' is bash's, not shlex's)
                assert shlex.split(joined) == shlex.split(command), lines
            assert joined.split() == command.split(), lines  # whole words, in order
            too_long = [line for line in lines if len(line) > width]  # only a word longer than a line stands alone
            assert all(len(shlex.split(line.strip().removesuffix(" \\"))) == 1 for line in too_long), lines


def test_the_bar_shows_the_final_evaluation_not_the_one_before():
    """Found: after the final evaluation the progress bar still showed the stale `val 3.874`."""
    from conftest import tiny_train

    from charlm.config import ModelConfig
    from charlm.training.events import Evaluated, Started, Stepped
    from charlm.views.progress import TrainView

    view = TrainView(Console(file=io.StringIO(), width=120, force_terminal=True))
    view(Started(out_dir="run", device="cpu", params=1000, model_config=ModelConfig(vocab_size=65),
                 train_config=tiny_train(50), start_step=0, train_tokens=1000, val_tokens=100, vocab_size=65))  # fmt: skip
    view(Stepped(step=25, loss=3.9, lr=1e-3, tokens_per_s=5000.0, elapsed=1.0))
    view(Evaluated(step=25, train_loss=3.9, val_loss=3.874, val_bpc=5.6, is_best=True))
    view(Stepped(step=50, loss=2.6, lr=1e-3, tokens_per_s=5000.0, elapsed=2.0))
    view(Evaluated(step=50, train_loss=2.6, val_loss=2.512, val_bpc=3.6, is_best=True))  # the last one: no step after
    info = view.progress.tasks[view.train_task].fields["info"]
    view.close()
    assert "val 2.512" in info and "3.874" not in info, info


@pytest.mark.parametrize("cols", [60, 80, 120])
def test_the_training_bar_leaves_words_out_rather_than_cut_them(cols):
    """Found with the audit: at 60 columns the live bar read `sam… step 14 · loss 3.982 · val 3.981 (5.74 bpc) ·
    30,480 …` (its label and the speed cut). Its words now fit the room the bar leaves them: the speed, then the
    loss left out."""
    import re

    from charlm.views.progress import TrainView

    for label in ("training", "evaluating"):
        console = Console(file=io.StringIO(), width=cols, force_terminal=True, color_system=None)
        view = TrainView(console)
        view.train_task = view._ensure_progress().add_task(label, total=100, info="", completed=50)
        view.last_step, view.tps, view.last_val = (1206, 1.479), 10731.0, " · val 1.666 (2.40 bpc)"
        view.progress.update(view.train_task, info=view._bar_info())
        view.progress.refresh()
        view.close()
        screen = strip_ansi(re.sub(r"\r", "\n", console.file.getvalue()))
        bar = [line for line in screen.splitlines() if line.strip()][-1]
        assert "…" not in bar and bar.startswith(label) and "step 1206 · " in bar and "val 1.666 (2.40 bpc)" in bar
        assert ("10,731 tok/s" in bar) == (cols >= 120) and ("loss 1.479" in bar) == (cols >= 80), bar
