"""The command line: Click commands that map flags to configs (each option generated from its config field),
call one function of charlm.commands, and draw what it returns with charlm.views. Every user error is one
line on stderr and a non-zero exit, never a traceback (set CHARLM_DEBUG=1 to see one). Nothing here imports
torch at the top: --help, argument errors and the commands that only read files start in a blink.

Over ~450 lines on purpose: one Click command per charlm command, each a few lines, read best
side by side; the flags themselves come from the configs (flags.py), the work from charlm.commands."""

from __future__ import annotations

import itertools
import json
import os
import shlex
import signal
import sys
from pathlib import Path
from typing import NoReturn

import click
from click.core import ParameterSource

from charlm import config, errors, options, presets, settings
from charlm.commands import failure, user_errors
from charlm.flags import CharlmCommand, config_options, from_flags
from charlm.storage import runs
from charlm.training.stopping import Quit, SetupInterrupted
from charlm.views.text import (
    Loading,
    PipeClosed,
    err_console,
    keys_unechoed,
    out_console,
    print_error,
    print_json,
    print_notes,
    safe,
)

_AS_PROGRAM = False  # main() runs as the charlm process itself (not called in-process, as tests do)


class CharlmGroup(click.Group):
    """Turns every error into one line on stderr: Click's usage errors, ours, and unexpected ones."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        global _AS_PROGRAM
        _AS_PROGRAM = args is None  # the arguments come from the command line: this process ends here
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.exceptions.Exit as e:
            sys.exit(e.exit_code)
        except (click.exceptions.Abort, KeyboardInterrupt, SetupInterrupted, Quit) as e:
            # Ctrl-C; or a stop signal in a command's set-up, or a second one (a lab between its runs: nothing of
            # the run being set up to save), which carries its signal
            if isinstance(e.__cause__, EOFError):  # Click reads any EOFError as Ctrl-D: this one is a failure
                print_error(failure(e.__cause__))
                sys.exit(1)
            if _AS_PROGRAM:  # the process is ending: a second Ctrl-C or a SIGTERM could only cut this line short
                for s in (signal.SIGINT, signal.SIGTERM):
                    signal.signal(s, signal.SIG_IGN)
            err_console().print("interrupted")
            sys.exit(128 + e.signum if isinstance(e, (SetupInterrupted, Quit)) else 130)
        except PipeClosed:  # the reader went away (`| head`): stop quietly, as coreutils do
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing more to flush at exit
            sys.exit(128 + signal.SIGPIPE)
        except click.ClickException as e:
            if isinstance(e, click.MissingParameter) and e.param and e.param.name in ("ckpt", "ckpts", "run_dirs"):
                _missing_run(e)
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


def _missing_run(e: click.MissingParameter) -> NoReturn:
    """`charlm chat` (or any command) with no checkpoint or run: the usage line, then the runs to choose from."""
    from charlm.commands.runs import missing

    err_console().print(e.ctx.get_usage(), markup=False)  # (Click's parser raised it: its context is there)
    what = (
        "RUN: a run directory" if e.param.name == "run_dirs" else "CKPT: a run name, run directory or checkpoint file"
    )
    message, found = missing(what)
    print_error(message)
    for run in found:
        err_console().print(safe(f"  {run}"))
    sys.exit(e.exit_code)


@click.group(
    cls=CharlmGroup,
    invoke_without_command=True,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(None, "-V", "--version", package_name="charlm")
@click.pass_context
def main(ctx):
    """Train small character- and BPE-level language models (LSTM, GRU, Transformer) on any text file,
    then chat with them and look inside.

    Start with: charlm train corpora/tinyshakespeare.txt, then charlm chat on the run it prints.
    Every command has --help, with examples."""
    if ctx.invoked_subcommand is None:  # bare `charlm`: the help, as a successful answer
        click.echo(ctx.get_help())


@main.command(name="help", cls=CharlmCommand, short_help="Show a command's --help: charlm help train.")
@click.argument("name", required=False, metavar="[COMMAND]")
@click.pass_context
def help_(ctx, name):
    """Show a command's --help (charlm help train), or the list of commands."""
    group = ctx.parent.command
    if name is None:
        return click.echo(ctx.parent.get_help())
    cmd = group.get_command(ctx, name)
    if cmd is None:
        group.resolve_command(ctx, [name])  # an unknown name: the error, with what it may have meant
    click.echo(cmd.get_help(click.Context(cmd, info_name=name, parent=ctx.parent)))


def command(*configs, name: str | None = None, args=(), json: bool = False, defaults=None, **kw):
    """A charlm command: its arguments, the options of each config class (from its fields), and --json where
    it prints JSON; its --help ends with its examples from examples.txt."""
    options = [o for c in configs for o in config_options(c, defaults)]
    json_option = click.Option(["--json", "as_json"], is_flag=True, help="Print one JSON object instead.")
    return main.command(name, cls=CharlmCommand, params=[*args, *options, *([json_option] if json else [])], **kw)


def path_argument(name: str, **kw) -> click.Argument:
    return click.Argument([name], type=MODEL if name in ("ckpt", "ckpts") else click.Path(path_type=str), **kw)


class ModelPath(click.ParamType):
    """A checkpoint file, a run directory, or a run's name as `charlm runs` prints it (commands.runs.model_path)."""

    name = "path"

    def convert(self, value, param, ctx):
        if Path(value).exists():  # a path: nothing to look up (and numpy not imported yet)
            return str(value)
        from charlm.commands.runs import model_path

        return model_path(str(value))


MODEL = ModelPath()


# the text as an argument, as ollama, llm and litgpt take it (charlm sample RUN "ROMEO:"); -p keeps working
PROMPT_ARGUMENT = click.Argument(["text"], required=False, metavar="[PROMPT]")


def positional_prompt(text: str | None, flags: dict) -> dict:
    """flags with the PROMPT argument as --prompt."""
    if text is None:
        return flags
    if flags.get("prompt") is not None or flags.get("prompt_file") is not None:
        raise errors.ConfigError("give the text once: as an argument, or with --prompt/--prompt-file")
    return {**flags, "prompt": text}


@command(
    config.ModelConfig,
    config.TrainConfig,
    options.TrainOptions,
    args=[path_argument("corpus")],
    notes=("Presets (a size flag you give wins over the preset)", presets.describe_presets),
)
@click.pass_context
def train(ctx, corpus, **flags):
    """Train a language model on CORPUS (a UTF-8 text file).

    Several processes: charlm train CORPUS --nproc N, or torchrun --nproc-per-node N -m charlm train CORPUS."""
    opts = from_flags(options.TrainOptions, flags)
    model_cfg, train_cfg = presets.train_configs(opts.preset or "tiny", flags)  # checked before torch loads
    from charlm.commands import train as training
    from charlm.runtime import pick_device
    from charlm.training.events import TrainingInterrupted
    from charlm.views.progress import TrainView

    if opts.preset is None and pick_device(train_cfg.device) == "cuda":
        model_cfg, train_cfg = presets.train_configs("small", flags)

    def launch(cmd: list[str]) -> NoReturn:
        err_console().print(safe(f"launching: {shlex.join(cmd)}", "dim"), soft_wrap=True)
        training.exec_process(cmd)

    typed = {name for name in ctx.params if ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE}
    given = runs.given_settings(typed, opts.preset is not None)
    if not opts.resume:  # (a resumed run refuses them: runs.resume_configs)
        print_notes(ignored_flags(typed, model_cfg.kind, train_cfg.tokenizer))
    # every rank trains; only rank 0 shows it. soft_wrap: no cuts at 80 columns in a pipe
    view = TrainView(out_console(soft_wrap=True, quiet=int(os.environ.get("RANK", 0)) != 0), corpus=corpus)
    try:
        result = training.train(corpus, model_cfg, train_cfg, opts.out, resume=opts.resume, nproc=opts.nproc,
                     given=given, on_event=view, launch=launch, argv=sys.argv[1:], settle_signals=_AS_PROGRAM)  # fmt: skip
    except TrainingInterrupted as e:
        view.interrupted(e, training.resume_command(corpus, e.out_dir) if e.out_dir else None)
        if _AS_PROGRAM:  # everything is on disk: end now, not after seconds of tearing torch down
            from charlm.training.distributed import exit_process

            view.close()
            exit_process(128 + e.signum)
        sys.exit(128 + e.signum)  # the shell's convention: 130 for SIGINT, 143 for SIGTERM
    finally:
        view.close()
    view.finish(result)


def ignored_flags(typed: set[str], kind: str, tokenizer: str) -> list[str]:
    """A note for each flag typed that means nothing for this run (--heads for an LSTM, --vocab-size for chars)."""
    from dataclasses import fields

    notes = []
    for cls, run_is in ((config.ModelConfig, kind), (config.TrainConfig, tokenizer)):
        for f in fields(cls):
            only = f.metadata.get("applies_to")
            if only and only != run_is and f.name in typed:
                notes.append(f"--{settings.flag_name(f)} applies to {only} runs only: ignored for this {run_is} run")
    return notes


@command(
    options.PromptOptions,
    config.SampleConfig,
    options.SampleOptions,
    args=[path_argument("ckpt"), PROMPT_ARGUMENT],
    defaults={"max_tokens": 500},
    json=True,
)
def sample(ckpt, text, as_json, **flags):
    """Continue a prompt with CKPT (a run name, run directory or checkpoint file), streaming plain text to
    stdout (ready for pipes). The prompt: PROMPT, --prompt, --prompt-file or stdin."""
    flags = positional_prompt(text, flags)
    where, sample_cfg, opts = (
        from_flags(c, flags) for c in (options.PromptOptions, config.SampleConfig, options.SampleOptions)
    )
    with Loading(f"loading {ckpt}"):
        from charlm.commands.generate import read_prompt
        from charlm.commands.generate import sample as generate
        from charlm.generate import Stats
        from charlm.views.chat import print_samples

        samples = generate(ckpt, read_prompt(where), sample_cfg, opts)
        first = next(samples)  # the model loaded and the prompt read
    if first.streamer.sliding and first.prompt_tokens > first.streamer.context:
        print_notes([f"the prompt is {first.prompt_tokens} tokens: the model sees its last {first.streamer.context}"])
    if as_json:  # each sample whole, with its numbers, once it is done
        found = [{"text": "".join(c.pieces), **c.stats.to_dict()} for c in itertools.chain([first], samples)]
        return print_json({"prompt": first.prompt, "prompt_tokens": first.prompt_tokens,
                           "settings": sample_cfg.to_dict(), "samples": found})  # fmt: skip
    done = print_samples(out_console(), itertools.chain([first], samples), opts.echo)
    if opts.stats:
        stats = {**Stats.total(done).to_dict(), "samples": opts.num_samples, "cache": not opts.no_cache}
        click.echo(json.dumps(stats), err=True)


def chat_words() -> list[tuple[str, str]]:
    """What chat's /help lists, for its --help (commands.words: no torch to import)."""
    from charlm.commands.words import CHAT_COMMANDS, CHAT_HELP_ROWS

    return [*CHAT_COMMANDS.items(), *CHAT_HELP_ROWS]


@command(
    config.SampleConfig,
    options.ChatOptions,
    args=[path_argument("ckpt")],
    defaults={"max_tokens": 200},
    notes=("Inside the chat (/help lists them too)", chat_words),
)
def chat(ckpt, **flags):
    """Talk to CKPT: a REPL that streams each continuation as it is generated (/help inside)."""
    sample_cfg, opts = from_flags(config.SampleConfig, flags), from_flags(options.ChatOptions, flags)
    # keys typed while it loads wait for the prompt, never above the banner; a Ctrl-D among them leaves there
    with keys_unechoed(keep_ctrl_d=True):
        with Loading(f"loading {ckpt}"):
            from charlm.commands.chat import open_chat

            session = open_chat(ckpt, sample_cfg, opts, console=out_console())
        session.start()
    session.loop()


def _look(cls, ckpt, text, flags):
    """(checkpoint, its tokens of the text, view options, console, screen) for attn and gates."""
    flags = positional_prompt(text, flags)
    view, where = from_flags(cls, flags), from_flags(options.LookOptions, flags)
    with Loading(f"loading {ckpt}"):
        from charlm.commands.look import load_text
        from charlm.views.heatmap import Screen

        ck, ids = load_text(ckpt, where)
    console = out_console(width=where.width)
    return ck, ids, view, console, Screen.of(console, view.ascii, flags=True)


@command(options.LookOptions, options.AttnConfig, args=[path_argument("ckpt"), PROMPT_ARGUMENT], json=True)
def attn(ckpt, text, as_json, **flags):
    """Show a transformer's attention on a text (PROMPT, --prompt, --prompt-file or stdin) as terminal heat maps (by
    default: the last layer, mean over heads)."""
    ck, ids, view, console, screen = _look(options.AttnConfig, ckpt, text, flags)
    from charlm.commands.look import attention, attention_summary
    from charlm.views.attention import draw_attention

    if as_json:
        return print_json(attention_summary(ck.tokenizer, attention(ck.model, ck.tokenizer, ids, view)))
    draw_attention(console, ck.tokenizer, attention(ck.model, ck.tokenizer, ids, view), view, screen)


@command(options.LookOptions, options.GatesConfig, args=[path_argument("ckpt"), PROMPT_ARGUMENT], json=True)
def gates(ckpt, text, as_json, **flags):
    """Show an LSTM's forget/input/output gates (a GRU's update/reset gates) and its cell state over a text
    (PROMPT, --prompt, --prompt-file or stdin)."""
    ck, ids, view, console, screen = _look(options.GatesConfig, ckpt, text, flags)
    from charlm.commands.look import gates as trace
    from charlm.commands.look import gates_summary
    from charlm.views.gates import draw_gates, units_that_fit

    if as_json:  # no screen to fit: the default units, or those --units names
        return print_json(gates_summary(ck.tokenizer, trace(ck.model, ids, view)))

    layer = ck.model_config.n_layers - 1 if view.layer is None else view.layer
    fits = lambda t: units_that_fit(ck.tokenizer, ids, ck.model_config.kind, layer, t, view, screen)  # noqa: E731
    draw_gates(console, ck.tokenizer, trace(ck.model, ids, view, fits), view, screen)


@command(options.ExploreOptions, args=[path_argument("ckpt"), click.Argument(["text"], required=False)])
def explore(ckpt, text, **flags):
    """Walk through TEXT with CKPT in a full-screen app: each token's attention, head by head (a Transformer),
    or each unit's gates (an LSTM/GRU), its predictions and surprisal; knock a head out and see the loss rise
    (? inside: the keys, then what every label means)."""
    opts = from_flags(options.ExploreOptions, flags)
    from charlm.commands.explore import load
    from charlm.explore.app import explore as run_app

    if shot := run_app(*load(ckpt, text, opts), opts):
        out_console().print(safe(f"wrote the first screen ({opts.size}) to {shot}"), soft_wrap=True)


@command(
    options.EvalOptions,
    name="eval",
    args=[path_argument("ckpt"), path_argument("file")],
    json=True,
)
def eval_(ckpt, file, as_json, **flags):
    """Loss, perplexity and bits per character of CKPT on any text FILE. Bits per byte too, over the whole
    file: the Transformer reads it in overlapping windows of its context, an LSTM/GRU in one pass."""
    opts = from_flags(options.EvalOptions, flags)
    with Loading(f"loading {ckpt}") as loading:
        from charlm.commands.evaluate import evaluate
        from charlm.views.eval import EvalProgress, render_eval

        with EvalProgress(err_console(), before=loading) as progress:
            done = evaluate(ckpt, file, opts, progress)
    print_json(done.summary()) if as_json else render_eval(out_console(), done.ckpt, done.file, done.result)


@command(
    options.CompareOptions,
    config.SampleConfig,
    defaults={"max_tokens": 200},
    args=[path_argument("ckpts", nargs=-1, required=True)],
    json=True,
)
def compare(ckpts, as_json, **flags):
    """Continue the same prompt with two or more checkpoints, side by side, then compare them in a table.

    When the models' tokens differ (a char and a BPE model), --max-tokens counts characters, so every text is
    as long."""
    sample_cfg, opts = from_flags(config.SampleConfig, flags), from_flags(options.CompareOptions, flags)
    if as_json and opts.interactive:
        raise errors.ConfigError("--json prints one run: drop --interactive or --json")
    with Loading(f"loading {len(ckpts)} models") as loading:
        from charlm.commands.compare import CompareSession
        from charlm.commands.compare import compare as compare_models
        from charlm.views.compare import CompareView

        # --json: stdout holds the JSON alone (the bars of --eval stay on stderr)
        view = CompareView(out_console(quiet=as_json), err_console(), before=loading)
        comparison = compare_models(list(ckpts), sample_cfg, opts, view)
    if opts.interactive:
        CompareSession(comparison, view).run()
    elif as_json:
        print_json(comparison.summary())
    else:
        view.show(comparison)


@command(options.CompressOptions, args=[path_argument("ckpt")], json=True)
def compress(ckpt, as_json, **flags):
    """A smaller run from CKPT (int8/int4 weights, heads or units dropped) that every command opens, measured
    before → after on the run's validation text; --report: every method at a few settings, one table."""
    opts = from_flags(options.CompressOptions, flags)
    from charlm.training.stopping import SetupInterrupted
    from charlm.views.compress import CompressProgress, render_compressed, render_report

    try:
        with CompressProgress() as progress:  # drawn now: importing torch is the first slow step
            from charlm.commands import compress as compressing

            if opts.report:
                rep = compressing.report(ckpt, opts, progress)
            else:
                done = compressing.compress(ckpt, opts, progress)
    except SetupInterrupted as e:  # (Ctrl-C, SIGTERM, SIGHUP: what was being written is gone, the rest as it was)
        err_console().print("interrupted: nothing written" if not opts.report else "interrupted")
        sys.exit(128 + e.signum)
    if opts.report:
        return print_json(rep.to_dict()) if as_json else render_report(out_console(), rep)
    if as_json:
        return print_json(
            {"original": done.original.to_dict(), "compressed": done.result.to_dict(), "path": str(done.path)}
        )
    render_compressed(out_console(), done)


@command(args=[path_argument("ckpt")], json=True)
def info(ckpt, as_json):
    """Show what a checkpoint (a file or a run directory) holds."""
    from charlm.commands.runs import curves, info
    from charlm.views.runs import render_info

    summary = info(ckpt)  # checked without torch: no tensor is read, no model built
    if as_json:
        return print_json(summary)
    notes = []
    render_info(out_console(), summary, curves([str(Path(summary["path"]).parent)], missing_ok=True, notes=notes))
    print_notes(notes)


@command(name="runs", args=[click.Argument(["directory"], required=False, type=click.Path(path_type=Path))], json=True)
def runs_(directory, as_json):
    """List the runs in DIRECTORY [default: checkpoints]: model, tokenizer, size, steps, time, best score, corpus."""
    from charlm.commands.runs import list_runs
    from charlm.views.runs import render_runs

    root, rows = list_runs(directory)
    if as_json:
        print_json(rows)
    elif not rows:
        # soft_wrap: the terminal folds the line, and copying it gives the command whole
        err_console().print(
            safe(f"no runs in {root}: train one with charlm train FILE --out {root}/NAME"), soft_wrap=True
        )
    else:
        render_runs(out_console(), rows, f"{len(rows)} run{'s' * (len(rows) > 1)} in {root}")


@command(
    options.PlotConfig,
    args=[path_argument("run_dirs", metavar="RUN...", nargs=-1, required=True)],
    json=True,
)
def plot(run_dirs, as_json, **flags):
    """Loss curves of one run, or several overlaid: train and val, from each run's metrics.jsonl."""
    from charlm.commands.runs import curves
    from charlm.views.runs import print_chart

    opts, notes = from_flags(options.PlotConfig, flags), []
    found = curves(list(run_dirs), notes=notes)
    print_notes(notes)
    if as_json:
        return print_json([{"run": name, "evaluations": points} for name, points in found.items()])
    console = out_console()
    print_chart(console, found, y=opts.y, x=opts.x, width=opts.width or min(console.width, 120), height=opts.height)


@command(
    options.LabConfig,
    args=[click.Argument(["name"], required=False), path_argument("ckpt", required=False)],
    json=True,
)
def lab(name, ckpt, as_json, **flags):
    """Small controlled experiments on the two memories. `charlm lab` lists them; `charlm lab NAME` runs one.

    At default size an experiment that trains takes minutes of one core a seed (docs/lab.md gives each one's
    CPU time, with the machine it was measured on); --quick takes seconds; --seeds K takes K times as long.
    """
    from charlm.commands.lab import lab as run_lab
    from charlm.lab import EXPERIMENTS
    from charlm.views.lab import render_lab, render_list

    console, lab_cfg = out_console(), from_flags(options.LabConfig, flags)
    if name is None:
        return render_list(console, EXPERIMENTS)
    # the progress line lives on stderr and goes away when the experiment ends (none with --json)
    with err_console(quiet=as_json).status(f"lab {name}") as status:
        done = run_lab(name, lab_cfg, ckpt=ckpt, progress=status.update, views=not as_json)
    if as_json:
        return print_json(done.result.to_dict())
    render_lab(console, done.result, color=not lab_cfg.plain, views=done.views)
