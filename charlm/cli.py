"""The command line: Click commands that map flags to configs (each option generated from its config field),
call one function of charlm.commands, and draw what it returns with charlm.views. Every user error is one
line on stderr and a non-zero exit, never a traceback (set CHARLM_DEBUG=1 to see one). Nothing here imports
torch at the top: --help, argument errors and the commands that only read files start in a blink."""

from __future__ import annotations

import json
import os
import shlex
import signal
import sys
from pathlib import Path
from typing import NoReturn

import click
from click.core import ParameterSource
from rich.console import Console

from charlm import config, runs
from charlm.commands import failure, user_errors
from charlm.config import (
    DEVICES,
    PRESETS,
    AttnConfig,
    ConfigError,
    GatesConfig,
    LabConfig,
    ModelConfig,
    PlotConfig,
    SampleConfig,
    TrainConfig,
    flag_fields,
)
from charlm.flags import CharlmCommand, config_options, from_flags, option, summary, with_options
from charlm.views.text import print_error, safe

RUN = "checkpoints/tinyshakespeare-transformer-char"  # the run the README's first command leaves, for examples
_AS_PROGRAM = False  # main() runs as the charlm process itself (not called in-process, as tests do)


def err_console() -> Console:
    return Console(stderr=True, highlight=False)


def out_console(**kw) -> Console:
    """Where a command's results go. A reader that goes away (`| head`) ends the command quietly, as
    SIGPIPE would (Rich's own answer is exit 1, which reads as a failure)."""
    console = Console(highlight=False, **kw)
    console.on_broken_pipe = _pipe_closed
    return console


def _pipe_closed() -> NoReturn:
    raise PipeClosed


def _ignore_signals() -> None:
    """The process is ending: a Ctrl-C or SIGTERM could only cut its last lines short, so they are ignored
    from here on. Not when main() was called in-process: the caller keeps its handlers."""
    if _AS_PROGRAM:
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, signal.SIG_IGN)


class PipeClosed(Exception):
    """stdout's reader went away."""


class CharlmGroup(click.Group):
    """Turns every error into one line on stderr: Click's usage errors, ours, and unexpected ones."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        global _AS_PROGRAM
        _AS_PROGRAM = args is None  # the arguments come from the command line: this process ends here
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.exceptions.Exit as e:
            sys.exit(e.exit_code)
        except (click.exceptions.Abort, KeyboardInterrupt):
            _ignore_signals()
            err_console().print("interrupted")
            sys.exit(130)
        except PipeClosed:  # the reader went away (`| head`): stop quietly, as coreutils do
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing more to flush at exit
            sys.exit(128 + signal.SIGPIPE)
        except click.MissingParameter as e:
            if e.param is not None and e.param.name in ("ckpt", "ckpts", "run_dirs"):
                _missing_run(e)
            print_error(e.format_message())
            sys.exit(e.exit_code)
        except click.ClickException as e:
            print_error(e.format_message())
            sys.exit(e.exit_code)
        except Exception as e:
            if os.environ.get("CHARLM_DEBUG") and not isinstance(e, user_errors()):
                raise
            print_error(failure(e))
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) and not isinstance(rv, bool) and standalone_mode else 0)

    def make_context(self, *args, **kw):
        try:  # (--help prints here)
            return super().make_context(*args, **kw)
        except BrokenPipeError:  # Click's own handling would exit 1, an error, where the shell expects 141
            raise PipeClosed from None

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            raise PipeClosed from None

    def format_commands(self, ctx, formatter) -> None:
        """Each command with its whole first sentence, wrapped: Click's own list cuts it at ~45 characters."""
        rows = [(name, summary(self.get_command(ctx, name))) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def _missing_run(e: click.MissingParameter) -> NoReturn:
    """`charlm chat` (or any command) with no checkpoint or run: the usage line, then the runs to choose from."""
    console = err_console()
    what = "RUN: a run directory" if e.param.name == "run_dirs" else "CKPT: a checkpoint file or run directory"
    if e.ctx is not None:
        console.print(e.ctx.get_usage(), markup=False)
    found = runs.find_runs() if runs.RUNS.is_dir() else []
    if not found:
        print_error(f"missing {what}; there are no runs in {runs.RUNS}/ yet: train one with charlm train FILE")
        sys.exit(e.exit_code)
    print_error(f"missing {what}, such as one of the runs in {runs.RUNS}/ (newest first; charlm runs shows them all):")
    for run in found[:5]:
        console.print(safe(f"  {run}"))
    sys.exit(e.exit_code)


CharlmGroup.command_class = CharlmCommand


@click.group(
    cls=CharlmGroup,
    invoke_without_command=True,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(package_name="charlm")
@click.pass_context
def main(ctx):
    """Train small character- and BPE-level language models (LSTM, GRU, Transformer) on any text file,
    then chat with them and look inside.

    Start with: charlm train corpora/tinyshakespeare.txt, then charlm chat on the run it prints.
    Every command has --help, with examples."""
    if ctx.invoked_subcommand is None:  # bare `charlm`: the help, as a successful answer
        click.echo(ctx.get_help())


device_option = option(
    "--device",
    type=click.Choice(DEVICES),
    default="auto",
    show_default=True,
    help=TrainConfig.__dataclass_fields__["device"].metadata["help"],
)
unknown_option = option(
    "--unknown", type=click.Choice(config.UNKNOWN), default="error", show_default=True,
    help=SampleConfig.__dataclass_fields__["unknown"].metadata["help"],
)  # fmt: skip
json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead.")

EXAMPLES = {  # what each command's --help ends with: (what it does, the command line)
    "train": [
        ("a tiny character-level Transformer, two minutes on a CPU", "charlm train corpora/tinyshakespeare.txt"),
        ("an LSTM on BPE tokens for ten minutes", "charlm train notes.txt --model lstm --tokenizer bpe --max-time 10m"),
        ("five more minutes of the first run (--max-time is the total)",
         f"charlm train corpora/tinyshakespeare.txt --out {RUN} --resume --max-time 7m"),
    ],
    "sample": [
        ("200 tokens after a prompt", f'charlm sample {RUN} -p "ROMEO:" -n 200'),
        ("the prompt from a pipe, the text to a file, the same text each time",
         f'echo "To be" | charlm sample {RUN} --seed 1 > out.txt'),
    ],
    "chat": [
        ("talk to the run the README's first command trains", f"charlm chat {RUN}"),
        ("each prompt continues the running text, less random", f"charlm chat {RUN} --mode continue -t 0.5"),
    ],
    "attn": [
        ("the last layer's attention, mean over heads", f'charlm attn {RUN} -p "To be, or not to be"'),
        ("every layer × head as small maps", f'charlm attn {RUN} -p "To be, or not to be" --overview'),
        ("what the last token looked at", f'charlm attn {RUN} -p "To be, or not to be" --focus -1'),
    ],
    "gates": [
        ("the 8 units whose gates change most", 'charlm gates checkpoints/tinyshakespeare-lstm-char -p "To be, or not to be"'),
        ("three chosen units of the first layer",
         'charlm gates checkpoints/tinyshakespeare-lstm-char -p "To be" --layer 0 --units 3,17,42'),
    ],
    "eval": [
        ("bits per character on the whole corpus", f"charlm eval {RUN} corpora/tinyshakespeare.txt"),
        ("the same as one JSON object", f"charlm eval {RUN} other.txt --json"),
    ],
    "compare": [
        ("two runs continue the same prompt, then a table", f'charlm compare {RUN} {RUN}-2 -p "ROMEO:"'),
        ("with each one's bits per character on a text", f"charlm compare {RUN} {RUN}-2 --eval corpora/tinyshakespeare.txt"),
        ("a prompt loop: each prompt goes to every model", f"charlm compare {RUN} {RUN}-2 -i"),
    ],
    "info": [
        ("the model, its size, training and best score, and its loss curve", f"charlm info {RUN}"),
        ("the same as one JSON object", f"charlm info {RUN}/best.pt --json"),
    ],
    "runs": [
        ("the runs under checkpoints/, newest first", "charlm runs"),
        ("the runs in another folder, as JSON", "charlm runs /data/runs --json"),
    ],
    "plot": [
        ("one run's train and val bits/char against steps", f"charlm plot {RUN}"),
        ("two runs overlaid, loss against seconds of training", f"charlm plot {RUN} {RUN}-2 --y loss --x time"),
        ("the numbers behind the chart", f"charlm plot {RUN} --json"),
    ],
    "lab": [
        ("the experiments, one line each", "charlm lab"),
        ("delayed copy: where the LSTM's fixed state runs out and attention does not", "charlm lab copy"),
        ("time per token against the context, with fitted growth exponents", "charlm lab cost --json"),
        ("every head of a trained Transformer, named by what it does", f"charlm lab heads {RUN}"),
    ],
}  # fmt: skip


def command(name: str | None = None, **kw):
    """main.command, with the examples of EXAMPLES[name]."""

    def decorate(f):
        return main.command(name, examples=EXAMPLES[name or f.__name__], **kw)(f)

    return decorate


ckpt_argument = click.argument("ckpt", type=click.Path(path_type=str))
no_cache_option = option(
    "--no-cache", is_flag=True, help="Recompute the whole text for every token (slow: to compare)."
)


# ---- train --------------------------------------------------------------------------------------


def _preset_notes():
    return [("Presets (a size flag you give wins over the preset)", [(n, config.describe_preset(n)) for n in PRESETS])]


@command(notes=_preset_notes)
@click.argument("corpus", type=click.Path(path_type=str))
@option("--preset", "preset_name", type=click.Choice(PRESETS), section="Model",
        help="Model size and batch/lr defaults [default: tiny on CPU, small on CUDA].")  # fmt: skip
@config_options(ModelConfig)
@config_options(TrainConfig)
@option("--out", type=click.Path(path_type=Path), section="Run",
        help="Run directory [default: checkpoints/<corpus>-<model>-<tokenizer>].")  # fmt: skip
@option("--resume", is_flag=True, section="Run", help="Continue the run in --out from its last checkpoint.")
@option(
    "--nproc",
    type=int,
    section="Run",
    help="Train with N processes (DistributedDataParallel): starts torchrun for you.",
)
@click.pass_context
def train(ctx, corpus, preset_name, out, resume, nproc, **flags):
    """Train a language model on CORPUS (a UTF-8 text file).

    Several processes: charlm train CORPUS --nproc N, or torchrun --nproc-per-node N -m charlm train CORPUS."""
    parse = {f.name: f for cls in (ModelConfig, TrainConfig) for f in flag_fields(cls) if f.metadata["parse"]}
    given = {k: config.from_text(parse[k], v) if k in parse and v is not None else v for k, v in flags.items()}
    model_cfg, train_cfg = config.train_configs(given["kind"], preset_name or "tiny", given)  # (before torch)
    from charlm.commands.train import exec_process, resume_command
    from charlm.commands.train import train as run
    from charlm.runtime import pick_device
    from charlm.train import TrainingInterrupted
    from charlm.views.progress import TrainView

    if preset_name is None and pick_device(train_cfg.device) == "cuda":
        model_cfg, train_cfg = config.train_configs(given["kind"], "small", given)

    def launch(cmd: list[str]) -> NoReturn:
        err_console().print(safe(f"launching: {shlex.join(cmd)}", "dim"), soft_wrap=True)
        exec_process(cmd)

    # every rank trains; only rank 0 shows it. soft_wrap: no cuts at 80 columns in a pipe
    console = out_console(soft_wrap=True, quiet=int(os.environ.get("RANK", 0)) != 0)
    view = TrainView(console, corpus=corpus)
    try:
        result = run(corpus, model_cfg, train_cfg, out, resume=resume, nproc=nproc, given=runs.given_settings(_typed(ctx), preset_name is not None),
                     on_event=view, launch=launch, settle_signals=_AS_PROGRAM)  # fmt: skip
    except TrainingInterrupted as e:
        view.interrupted(e.result, e.signum, resume_command(corpus, e.result.out_dir))
        sys.exit(128 + e.signum)  # the shell's convention: 130 for SIGINT, 143 for SIGTERM
    finally:
        view.close()
    view.finish(result)


def _typed(ctx: click.Context) -> set[str]:
    """The options the user typed on the command line (not their defaults)."""
    return {name for name in ctx.params if ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE}


# ---- generation: sample, chat -------------------------------------------------------------------


prompt_options = [
    option("--prompt", "-p", help="The text [default: --prompt-file, else stdin when piped, else none]."),
    option("--prompt-file", type=str, help="Read the text from this file ('-': stdin)."),
]


@command()
@ckpt_argument
@with_options(*prompt_options)
@config_options(SampleConfig, defaults={"max_tokens": 500})
@option("--num-samples", type=int, default=1, show_default=True, help="Samples, separated by a line '---'.")
@option("--echo/--no-echo", default=True, show_default=True, help="Print the prompt before its continuation.")
@option("--stats", is_flag=True, help="One JSON line on stderr: tokens, seconds, tokens_per_s, ttft_ms.")
@no_cache_option
@device_option
def sample(ckpt, prompt, prompt_file, num_samples, echo, stats, no_cache, device, **flags):
    """Continue a prompt with CKPT, streaming plain text to stdout (ready for pipes)."""
    from charlm.commands.generate import read_prompt
    from charlm.commands.generate import sample as generate
    from charlm.generate import Stats
    from charlm.views.chat import print_samples

    settings, text = from_flags(SampleConfig, flags), read_prompt(prompt, prompt_file)
    samples = generate(ckpt, text, settings, num_samples=num_samples, device=device, use_cache=not no_cache)
    done = print_samples(out_console(), samples, echo)
    if stats:
        click.echo(json.dumps({**Stats.total(done).to_dict(), "samples": num_samples, "cache": not no_cache}), err=True)


@command()
@ckpt_argument
@config_options(SampleConfig, defaults={"max_tokens": 200})
@option("--mode", type=click.Choice(["fresh", "continue"]), default="fresh", show_default=True,
        help="Each prompt starts anew, or continues the running text.")  # fmt: skip
@no_cache_option
@device_option
def chat(ckpt, mode, no_cache, device, **flags):
    """Talk to CKPT: a REPL that streams each continuation as it is generated (/help inside)."""
    from charlm.commands.chat import chat as talk

    talk(
        ckpt,
        from_flags(SampleConfig, flags),
        mode=mode,
        device=device,
        use_cache=not no_cache,
        console=out_console(),
    )


# ---- viewers: attn, gates -----------------------------------------------------------------------


def _look(cls, ckpt, prompt, prompt_file, width, unknown, flags):
    """(checkpoint, its tokens of the text, view options, console, screen) for attn and gates."""
    from charlm.commands.generate import read_prompt
    from charlm.commands.look import load_text
    from charlm.views.heatmap import Screen

    opts = from_flags(cls, flags)
    if width is not None and width < 20:
        raise ConfigError(f"--width must be at least 20, got {width}")
    ck, ids = load_text(ckpt, read_prompt(prompt, prompt_file), unknown, empty=prompt == "")
    console = out_console(width=width)
    return ck, ids, opts, console, Screen.of(console, opts.ascii, flags=True)


viewer_options = with_options(
    ckpt_argument, *prompt_options,
    option("--width", type=int, help="Width in characters [default: the terminal's]."), unknown_option,
)  # fmt: skip


@command()
@viewer_options
@config_options(AttnConfig)
def attn(ckpt, prompt, prompt_file, width, unknown, **flags):
    """Show a transformer's attention on a text (--prompt, --prompt-file or stdin) as terminal heat maps (by
    default: the last layer, mean over heads)."""
    from charlm.commands.look import attention
    from charlm.views.attention import draw_attention

    ck, ids, opts, console, screen = _look(AttnConfig, ckpt, prompt, prompt_file, width, unknown, flags)
    draw_attention(console, ck.tokenizer, attention(ck.model, ck.tokenizer, ids, opts), opts, screen)


@command()
@viewer_options
@config_options(GatesConfig)
def gates(ckpt, prompt, prompt_file, width, unknown, **flags):
    """Show an LSTM's forget/input/output gates (a GRU's update/reset gates) and its cell state over a text
    (--prompt, --prompt-file or stdin)."""
    from charlm.commands.look import gates as trace
    from charlm.views.gates import draw_gates, fitting_units, panels

    ck, ids, opts, console, screen = _look(GatesConfig, ckpt, prompt, prompt_file, width, unknown, flags)
    fits = lambda t: fitting_units(len(panels(t)), screen.height)  # noqa: E731
    draw_gates(console, ck.tokenizer, trace(ck.model, ids, opts, fits), opts, screen)


# ---- comparison: eval, compare ------------------------------------------------------------------


@command("eval", short_help="Loss, perplexity and bits per character of CKPT on any text FILE.")
@ckpt_argument
@click.argument("file", type=click.Path(path_type=str))
@option("--stride", type=int, help="Transformer: tokens each window advances [default: context/2].")
@unknown_option
@device_option
@json_option
def eval_(ckpt, file, stride, unknown, device, as_json):
    """Loss, perplexity, bits per character and per byte of CKPT on FILE (any UTF-8 text), over the
    whole file: the Transformer reads it in overlapping windows of its context, an LSTM/GRU in one pass."""
    from charlm.commands.evaluate import evaluate
    from charlm.views.eval import EvalProgress, render_eval

    with EvalProgress(err_console()) as progress:
        done = evaluate(ckpt, file, stride=stride, unknown=unknown, device=device, progress=progress)
    if as_json:
        click.echo(json.dumps(done.summary()))
    else:
        render_eval(out_console(), done.ckpt, done.file, done.result)


@command()
@click.argument("ckpts", nargs=-1, required=True, type=click.Path(path_type=str))
@option("--prompt", "-p", default="", help="Text every model continues [default: none].")
@config_options(SampleConfig, defaults={"max_tokens": 200})
@option("--eval", "eval_file", type=click.Path(path_type=str), help="Also show each model's bits/char on this text.")
@option("--interactive", "-i", is_flag=True, help="A prompt loop: each prompt goes to every model.")
@json_option
@device_option
def compare(ckpts, prompt, eval_file, interactive, as_json, device, **flags):
    """Continue the same prompt with two or more checkpoints, side by side, then compare them in a table."""
    from charlm.commands.compare import CompareSession
    from charlm.commands.compare import compare as load
    from charlm.views.compare import CompareView
    from charlm.views.eval import EvalProgress

    if as_json and interactive:
        raise ConfigError("--json prints one run: drop --interactive or --json")
    comparison = load(list(ckpts), from_flags(SampleConfig, flags), device=device)
    view = CompareView(comparison, out_console())
    if eval_file:
        comparison.evaluate(eval_file, lambda name: EvalProgress(err_console(), f"eval {name}"))
        view.notes()  # e.g. a char model that cannot read the file: said once, up front
    if interactive:
        CompareSession(comparison, view.show, view.console).run()
    elif as_json:
        comparison.run(prompt)
        click.echo(json.dumps(comparison.summary()))
    else:
        view.show(prompt)


# ---- runs: info, runs, plot ---------------------------------------------------------------------


def print_notes(notes: list[str]) -> None:
    """What a command skipped (a damaged line of a run file): one yellow line each, on stderr."""
    for note in notes:
        err_console().print(safe(note, "yellow"), soft_wrap=True)


@command()
@ckpt_argument
@json_option
def info(ckpt, as_json):
    """Show what a checkpoint (a file or a run directory) holds."""
    from charlm.commands.runs import curves, info
    from charlm.views.runs import render_info

    summary = info(ckpt)  # checked without torch: no tensor is read, no model built
    if as_json:
        click.echo(json.dumps(summary))
    else:
        notes = []
        found = curves([str(Path(summary["path"]).parent)], missing_ok=True, notes=notes)
        render_info(out_console(), summary, found)
        print_notes(notes)


@command("runs")
@click.argument("directory", required=False, type=click.Path(path_type=Path))
@json_option
def runs_(directory, as_json):
    """List the runs in DIRECTORY [default: checkpoints]: model, tokenizer, size, steps, time, best score, corpus."""
    from charlm.commands.runs import list_runs
    from charlm.views.runs import render_runs

    root, rows = list_runs(directory)
    if as_json:
        click.echo(json.dumps(rows))
    elif not rows:
        err_console().print(safe(f"no runs in {root}: train one with charlm train FILE --out {root}/NAME"))
    else:
        render_runs(out_console(), rows, f"{len(rows)} run{'s' * (len(rows) > 1)} in {root}")


@command()
@click.argument("run_dirs", metavar="RUN...", nargs=-1, required=True, type=click.Path(path_type=str))
@config_options(PlotConfig)
@json_option
def plot(run_dirs, as_json, **flags):
    """Loss curves of one run, or several overlaid: train and val, from each run's metrics.jsonl."""
    from charlm.commands.runs import curves
    from charlm.views.runs import print_chart

    opts, notes = from_flags(PlotConfig, flags), []
    found = curves(list(run_dirs), notes=notes)
    print_notes(notes)
    if as_json:
        click.echo(json.dumps([{"run": name, "evaluations": points} for name, points in found.items()]))
    else:
        console = out_console()
        print_chart(console, found, y=opts.y, x=opts.x, width=opts.width or min(console.width, 120), height=opts.height)


# ---- lab ----------------------------------------------------------------------------------------


@command()
@click.argument("name", required=False)
@click.argument("ckpt", required=False, type=click.Path(path_type=str))
@config_options(LabConfig)
@device_option
@json_option
def lab(name, ckpt, device, as_json, **flags):
    """Small controlled experiments on the two memories. `charlm lab` lists them; `charlm lab NAME` runs one.

    \b
    CPU time of one seed at default size on a 2-core AMD EPYC (Zen 4), about the wall time on an idle
    core (the lab runs torch on one thread); --seeds K takes K times as long:
      copy 75 s · recall 211 s · capacity 127 s · induction 39 s · cost 9 s · positions 12 s
      heads 2 s · ablate 2 s
    """
    from contextlib import nullcontext

    from charlm.lab import EXPERIMENTS, run_experiment
    from charlm.views.lab import render_lab, render_list

    console, settings = out_console(), from_flags(LabConfig, flags)
    if name is None:
        return render_list(console, EXPERIMENTS)
    status = err_console().status(f"lab {name}") if not as_json else nullcontext()
    with status:  # the progress line lives on stderr and goes away when the experiment ends
        progress = status.update if not as_json else (lambda message: None)
        result = run_experiment(name, settings, ckpt=ckpt, device=device, progress=progress)
    if as_json:
        return click.echo(json.dumps(result.to_dict()))
    render_lab(console, result, color=not settings.plain)
    if result.experiment == "copy":  # show why, with the viewers
        from charlm.commands.look import copy_views
        from charlm.views.heatmap import Screen
        from charlm.views.lab import render_copy_views

        render_copy_views(console, result.details, *copy_views(result.details), Screen.of(console, settings.plain))
