"""The command line: Click commands that map flags to configs (each option generated from its config field),
call one function of charlm.commands, and draw what it returns with charlm.views. Every user error is one
line on stderr and a non-zero exit, never a traceback (set CHARLM_DEBUG=1 to see one). Nothing here imports
torch at the top: --help, argument errors and the commands that only read files start in a blink."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import signal
import sys
from pathlib import Path
from typing import NoReturn

import click
from click import _textwrap as click_textwrap
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
    ModelConfig,
    SampleConfig,
    TrainConfig,
    flag_fields,
    flag_name,
)
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
        rows = [(name, _summary(self.get_command(ctx, name))) for name in self.list_commands(ctx)]
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


def _summary(command: click.Command) -> str:
    if command.short_help:
        return command.short_help
    first = (command.help or "").split("\n\n")[0]
    return " ".join(first.split(". ")[0].split()).rstrip(".") + "."


class CharlmCommand(click.Command):
    """A command whose --help lists its options in titled sections (each option's `section`, from its config
    field), then `notes` (title, rows), then examples (what it does, the command line)."""

    def __init__(self, *args, examples: list[tuple[str, str]] | None = None, notes=None, **kw):
        super().__init__(*args, **kw)
        self.examples, self.notes = examples or [], notes

    def format_options(self, ctx, formatter) -> None:
        sections: dict[str, list] = {}
        for p in self.get_params(ctx):
            if isinstance(p, click.Option) and (record := p.get_help_record(ctx)):
                sections.setdefault(getattr(p, "section", None), []).append(record)
        other = sections.pop(None, [])
        for title, rows in [*sections.items(), ("Other options" if sections else "Options", other)]:
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)

    def format_epilog(self, ctx, formatter) -> None:
        for title, rows in self.notes() if self.notes else ():
            with formatter.section(title):
                formatter.write_dl(rows)
        if self.examples:  # verbatim: a command line must not be re-wrapped
            with formatter.section("Examples"):
                pad = " " * formatter.current_indent
                for what, line in self.examples:
                    formatter.write(f"{pad}# {what}\n{pad}{line}\n")


CharlmGroup.command_class = CharlmCommand
# Click wraps help with textwrap, which breaks at hyphens ("--max-" / "time"): flags must stay whole
# (tests/test_cli_help.py notices if a Click release moves this class)
click_textwrap.TextWrapper.wordsep_re = click_textwrap.TextWrapper.wordsep_simple_re  # split at spaces only


def option(*decls, section: str | None = None, **kw):
    """click.option, placed in a --help section."""

    def decorate(f):
        f = click.option(*decls, **kw)(f)
        f.__click_params__[-1].section = section
        return f

    return decorate


def config_options(cls, defaults: dict | None = None):
    """Click options generated from a config dataclass's fields (config.flag): name, default, help, choices and
    --help section are written once, in config.py. `defaults` overrides a default for one command (chat's
    shorter --max-tokens). Values typed as text (a duration) reach the command as text: from_flags reads them."""
    options = []
    for f in flag_fields(cls):
        name, m = flag_name(f), f.metadata
        decls = [f"--{name}"] + ([f"-{m['short']}"] if m["short"] else []) + [f.name]
        kw = dict(help=m["help"], section=m["section"])
        if m["from_preset"]:
            kw.update(type=type(f.default), default=None, help=m["help"] + " [default: from --preset]")
        elif f.type == "bool":  # a setting a resumed run may change can also be turned off: --no-compile
            two = f.default or m["resumable"]
            decls[0] = f"--{name}/--no-{name}" if two else f"--{name}"
            kw.update(default=f.default, show_default=two, is_flag=True)
        elif f.type.startswith("list"):  # a repeatable flag
            kw.update(multiple=True, type=str)
        elif m["parse"] or m["derived"] or f.default is None:
            kw.update(type=str if m["parse"] or f.type.startswith("str") else int, default=None)
        else:
            kw.update(default=(defaults or {}).get(f.name, f.default), show_default=True, type=type(f.default))
        if m["choices"]:
            kw["type"] = click.Choice(m["choices"])
        options.append(option(*decls, **kw))

    def decorate(command):
        for o in reversed(options):
            command = o(command)
        return command

    return decorate


def from_flags(cls, values: dict, **extra):
    """The config the flags describe (a flag not given keeps the field's default), validated."""
    picked = {}
    for f in flag_fields(cls):
        value = values.get(f.name)
        if isinstance(value, tuple):  # a repeatable flag
            value = [config.from_text(f, v) for v in value]
        elif isinstance(value, str) and f.metadata["parse"]:
            value = config.from_text(f, value)
        if value is not None:
            picked[f.name] = value
    return cls(**{**picked, **extra}).validate()


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
        result = run(corpus, model_cfg, train_cfg, out, resume=resume, nproc=nproc, given=_given(ctx, preset_name),
                     on_event=view, launch=launch, settle_signals=_AS_PROGRAM)  # fmt: skip
    except TrainingInterrupted as e:
        view.interrupted(e.result, e.signum, resume_command(corpus, e.result.out_dir))
        sys.exit(128 + e.signum)  # the shell's convention: 130 for SIGINT, 143 for SIGTERM
    finally:
        view.close()
    view.finish(result)


def _given(ctx: click.Context, preset_name: str | None) -> set[str]:
    """What the user typed, in runs.resume_configs' terms: a --preset stands for every size it holds."""
    typed = {name for name in ctx.params if ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE}
    model_flags = {f.name for f in flag_fields(ModelConfig)}  # --vocab-size is TrainConfig's
    given = {("model." + n if n in model_flags else n) for n in typed}
    if preset_name is not None:
        fields = [f for cls in (ModelConfig, TrainConfig) for f in dataclasses.fields(cls)]
        given |= {"preset:" + f.name for f in fields if f.metadata.get("from_preset")}
    return given


# ---- generation: sample, chat -------------------------------------------------------------------


prompt_options = [
    option("--prompt", "-p", help="The text [default: --prompt-file, else stdin when piped, else none]."),
    option("--prompt-file", type=str, help="Read the text from this file ('-': stdin)."),
]


def with_options(*decorators):
    def decorate(f):
        for d in reversed(decorators):
            f = d(f)
        return f

    return decorate


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
@option("--y", type=click.Choice(["bpc", "loss"]), default="bpc", show_default=True,
        help="Bits per character (comparable across tokenizers), or loss in nats per token.")  # fmt: skip
@option("--x", type=click.Choice(["step", "time"]), default="step", show_default=True,
        help="Optimizer steps, or seconds of training.")  # fmt: skip
@option("--width", type=int, help="Width in characters [default: the terminal's, at most 120].")
@option("--height", type=int, default=20, show_default=True, help="Height in lines.")
@json_option
def plot(run_dirs, y, x, width, height, as_json):
    """Loss curves of one run, or several overlaid: train and val, from each run's metrics.jsonl."""
    from charlm.commands.runs import curves
    from charlm.views.runs import print_chart

    if width is not None and width < 30:
        raise ConfigError(f"--width must be at least 30, got {width}")
    if height < 8:
        raise ConfigError(f"--height must be at least 8, got {height}")
    notes = []
    found = curves(list(run_dirs), notes=notes)
    print_notes(notes)
    if as_json:
        click.echo(json.dumps([{"run": name, "evaluations": points} for name, points in found.items()]))
    else:
        console = out_console()
        print_chart(console, found, y=y, x=x, width=width or min(console.width, 120), height=height)


# ---- lab ----------------------------------------------------------------------------------------


@command()
@click.argument("name", required=False)
@click.argument("ckpt", required=False, type=click.Path(path_type=str))
@option("--quick", is_flag=True, help="Test size: seconds instead of minutes.")
@option("--seed", type=int, default=0, show_default=True, help="Same seed, same table.")
@option(
    "--seeds",
    type=click.IntRange(1, 100),
    default=1,
    show_default=True,
    help="Train each model with this many seeds (--seed, --seed + 1, ...); the table shows every one.",
)
@option(
    "--out",
    type=click.Path(path_type=Path),
    help="Where the lab's models are saved, as normal runs [default: checkpoints/lab].",
)
@option(
    "--text",
    "text_file",
    type=click.Path(path_type=str),
    help="ablate: the text scored [default: the run's corpus.txt].",
)
@option("--plain", is_flag=True, help="A chart without colours (series told apart by their markers).")
@device_option
@json_option
def lab(name, ckpt, quick, seed, seeds, out, text_file, plain, device, as_json):
    """Small controlled experiments on the two memories. `charlm lab` lists them; `charlm lab NAME` runs one.

    \b
    CPU time of one seed at default size on a 2-core AMD EPYC (Zen 4), about the wall time on an idle
    core (the lab runs torch on one thread); --seeds K takes K times as long:
      copy 75 s · recall 211 s · capacity 127 s · induction 39 s · cost 9 s · positions 12 s
      heads 2 s · ablate 2 s
    """
    from contextlib import nullcontext

    from charlm.lab import EXPERIMENTS, LAB_DIR, run_experiment
    from charlm.views.lab import render_lab, render_list

    console = out_console()
    if name is None:
        render_list(console, EXPERIMENTS)
        return
    status = err_console().status(f"lab {name}") if not as_json else nullcontext()
    with status:  # the progress line lives on stderr and goes away when the experiment ends
        result = run_experiment(
            name, ckpt=ckpt, quick=quick, seed=seed, seeds=seeds, device=device, out=out or LAB_DIR, text=text_file,
            progress=status.update if not as_json else (lambda message: None),
        )  # fmt: skip
    if as_json:
        click.echo(json.dumps(result.to_dict()))
    else:
        render_lab(console, result, color=not plain)
        if result.experiment == "copy":  # show why, with the viewers
            _copy_views(console, result.details, plain)


def _copy_views(console: Console, d: dict, plain: bool) -> None:
    """The copy experiment's why: the Transformer's copy head and the LSTM's gates on one example."""
    from charlm import checkpoint
    from charlm.commands.look import attention
    from charlm.commands.look import gates as trace
    from charlm.views.heatmap import Screen
    from charlm.views.lab import render_copy_views

    tf, lstm, text, head = (
        checkpoint.load(d["transformer_run"]),
        checkpoint.load(d["lstm_run"]),
        "\n" + d["example"],
        d["copy_head"],
    )
    att = attention(
        tf.model, tf.tokenizer, tf.tokenizer.encode(text), AttnConfig(layer=head["layer"], head=head["head"])
    )
    g = trace(lstm.model, lstm.tokenizer.encode(text), GatesConfig())
    render_copy_views(console, d, (tf.tokenizer, att), (lstm.tokenizer, g), Screen.of(console, plain))
