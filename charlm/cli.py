"""The command line: thin Click commands that validate input, call one function each and render the
result with Rich. Every user error is one line on stderr and a non-zero exit, never a traceback
(set CHARLM_DEBUG=1 to see one)."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import signal
import sys
import tempfile
from pathlib import Path
from typing import NoReturn

import click
from click import _textwrap as click_textwrap
from click.core import ParameterSource
from rich.console import Console
from rich.table import Table
from rich.text import Text

from charlm import checkpoint, config, files, memory, runs
from charlm.checkpoint import CheckpointError
from charlm.config import (
    DEVICES,
    PRESETS,
    UNKNOWN,
    ConfigError,
    ModelConfig,
    SampleConfig,
    TrainConfig,
    flag_name,
    parse_duration,
    preset,
)
from charlm.data import CorpusError
from charlm.tokenizer import UnknownCharactersError
from charlm.views.text import safe, shell_quote

USER_ERRORS = (ConfigError, CorpusError, CheckpointError, UnknownCharactersError, files.WriteError)
_AS_PROGRAM = False  # main() runs as the charlm process itself (not called in-process, as tests do)


class UserError(click.ClickException):
    """A one-line error: what was wrong and what to do."""


def err_console() -> Console:
    return Console(stderr=True, highlight=False)


def print_error(message: str) -> None:
    """One line on stderr, printed literally: a path such as 'notes[1].txt' is not Rich markup, and a
    multi-line message from a library is folded onto one line."""
    line = " ".join(part.strip() for part in str(message).splitlines() if part.strip())
    if int(os.environ.get("WORLD_SIZE", 1)) > 1:  # under torchrun: say which process failed
        line = f"rank {os.environ.get('RANK', '?')}: {line}"
    err_console().print(Text.assemble(("error: ", "red"), safe(line)), soft_wrap=True)


class CharlmGroup(click.Group):
    """Turns every error into one line on stderr: Click's usage errors, ours, and unexpected ones."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        global _AS_PROGRAM
        _AS_PROGRAM = args is None  # the arguments come from the command line: this process ends here
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.exceptions.Exit as e:
            sys.exit(e.exit_code)
        except click.exceptions.Abort:
            _ignore_signals()
            err_console().print("aborted")
            sys.exit(130)
        except click.MissingParameter as e:
            if e.param is not None and e.param.name in ("ckpt", "ckpts", "run_dirs"):
                _missing_run(e)
            print_error(e.format_message())
            sys.exit(e.exit_code)
        except click.ClickException as e:
            print_error(e.format_message())
            sys.exit(e.exit_code)
        except USER_ERRORS as e:
            print_error(str(e))
            sys.exit(1)
        except KeyboardInterrupt:
            _ignore_signals()
            err_console().print("interrupted")
            sys.exit(130)
        except Exception as e:  # a bug: still one line, with a way to see the traceback
            if os.environ.get("CHARLM_DEBUG"):
                raise
            if _out_of_memory(e):  # the machine's limit, not a bug: say what to change
                print_error(
                    "out of memory: lower --batch-size (--grad-accum keeps the effective batch), --context, "
                    "--d-model or --layers, or close what else uses the memory"
                )
                sys.exit(1)
            if _peer_lost(e):  # under torchrun: another rank failed first and said why; this one only lost it
                print_error("another process of this run stopped (its error is above); this one stops too")
                sys.exit(1)
            print_error(
                f"unexpected {type(e).__name__}: {e} (run with CHARLM_DEBUG=1 for the traceback, and please report it)"
            )
            sys.exit(1)
        if not standalone_mode:
            return rv
        sys.exit(rv if isinstance(rv, int) else 0)

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
    """A command whose --help lists its options in titled sections and ends with examples.

    sections: title -> parameter names, in order (any option not named goes under "Other options");
    examples: (what it does, the command line) pairs; notes: (title, rows) printed after the options."""

    def __init__(
        self,
        *args,
        sections: dict[str, tuple[str, ...]] | None = None,
        examples: list[tuple[str, str]] | None = None,
        notes=None,
        **kw,
    ):
        super().__init__(*args, **kw)
        self.sections, self.examples, self.notes = sections or {}, examples or [], notes

    def format_options(self, ctx, formatter) -> None:
        records = {p.name: p.get_help_record(ctx) for p in self.get_params(ctx) if isinstance(p, click.Option)}
        records = {name: r for name, r in records.items() if r}
        placed = {name for names in self.sections.values() for name in names}
        sections = [(title, [records[n] for n in names if n in records]) for title, names in self.sections.items()]
        sections.append(
            ("Other options" if self.sections else "Options", [r for n, r in records.items() if n not in placed])
        )
        for title, rows in sections:
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)

    def format_epilog(self, ctx, formatter) -> None:
        for title, rows in self.notes() if self.notes else ():
            with formatter.section(title):
                formatter.write_dl(rows)
        if self.examples:  # verbatim: a command line must not be re-wrapped
            with formatter.section("Examples"):
                for what, line in self.examples:
                    formatter.write(
                        f"{'':>{formatter.current_indent}}# {what}\n{'':>{formatter.current_indent}}{line}\n"
                    )


CharlmGroup.command_class = CharlmCommand
# Click wraps help with textwrap, which breaks at hyphens ("--max-" / "time"): flags must stay whole
# (tests/test_cli_help.py notices if a Click release moves this class)
click_textwrap.TextWrapper.wordsep_re = click_textwrap.TextWrapper.wordsep_simple_re  # split at spaces only
RUN = "checkpoints/tinyshakespeare-transformer-char"  # the run the README's first command leaves, for examples


def _peer_lost(e: Exception) -> bool:
    """A collective failed because another rank's process is gone (gloo: "Connection closed by peer")."""
    return int(os.environ.get("WORLD_SIZE", 1)) > 1 and any(
        words in str(e) for words in ("Connection closed by peer", "Connection reset by peer", "Broken pipe")
    )


def _out_of_memory(e: Exception) -> bool:
    import torch

    return isinstance(e, (MemoryError, torch.OutOfMemoryError)) or "can't allocate memory" in str(e)


def _ignore_signals() -> None:
    """The process is ending: a Ctrl-C or SIGTERM could only cut its last lines or Python's shutdown short
    (a KeyboardInterrupt in an atexit callback prints a traceback), so they are ignored from here on. Not
    when main() was called in-process: the caller keeps its handlers."""
    if _AS_PROGRAM:
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, signal.SIG_IGN)


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


# ---- train --------------------------------------------------------------------------------------


def config_options(cls, defaults: dict | None = None, only: tuple[str, ...] | None = None):
    """Click options generated from a config dataclass's fields (config.flag): one option per field that
    has a flag, with its name, default, help and choices written once, in config.py. `defaults` overrides
    a default for one command (e.g. chat's shorter --max-tokens); `only` picks fields."""
    options = []
    for f in dataclasses.fields(cls):
        name, m = flag_name(f), f.metadata
        if name is None or (only is not None and f.name not in only):
            continue
        decls = [f"--{name}"] + ([f"-{m['short']}"] if m.get("short") else []) + [f.name]
        kw = dict(help=m["help"])
        if m.get("choices"):
            kw["type"] = click.Choice(m["choices"])
        if m.get("from_preset"):
            kw.update(type=type(f.default), default=None, help=kw["help"] + " [default: from --preset]")
        elif m.get("derived"):
            kw.update(type=str if f.name == "max_time" else int, default=None)
        elif f.type in ("bool", bool):
            decls[0] = f"--{name}/--no-{name}"
            kw.update(default=f.default, show_default=True)
        elif f.default_factory is not dataclasses.MISSING:  # a list: a repeatable flag
            kw["multiple"] = True
        elif f.default is None:
            kw.update(type=int, default=None)
        else:
            default = (defaults or {}).get(f.name, f.default)
            kw.update(default=default, show_default=True)
            kw.setdefault("type", type(f.default))
        options.append(click.option(*decls, **kw))

    def decorate(command):
        for option in reversed(options):
            command = option(command)
        return command

    return decorate


DEVICE_HELP = "auto: cuda when PyTorch sees a GPU, else cpu."
device_option = click.option(
    "--device", type=click.Choice(DEVICES), default="auto", show_default=True, help=DEVICE_HELP
)
unknown_option = click.option(
    "--unknown",
    type=click.Choice(UNKNOWN),
    default="error",
    show_default=True,
    help="Characters a char model never saw: stop with an error, drop them, or replace them.",
)


def _check_writable(out: Path) -> None:
    probe = out
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise UserError(f"cannot write to {out}: {probe} is a file, not a directory")
    try:  # really try: os.access says yes to root, and knows nothing of read-only mounts or ACLs
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as e:
        raise UserError(
            f"cannot write to {out}: {probe} is not writable ({e.strerror}); choose another --out"
        ) from None


def _preset_notes():
    """The presets, read from config.PRESET_TABLE: what each one sets, for each model family."""
    use = {
        "tiny": "a laptop CPU and minutes (the default on CPU)",
        "small": "one GPU (the default on CUDA)",
        "medium": "a larger GPU run",
    }

    def sizes(s: dict) -> str:
        heads = f", {s['n_heads']} heads" if "n_heads" in s else ""
        return (
            f"{s['n_layers']} layers × {s['d_model']}{heads}, context {s['context']}, dropout {s['dropout']:g}, "
            f"batch {s['batch_size']}, lr {s['lr']:g}"
        )

    table = config.PRESET_TABLE
    rows = [
        (
            name,
            (
                f"for {use[name]}: transformer {sizes(table['transformer'][name])}; "
                f"lstm/gru {sizes(table['lstm'][name])}"
            ),
        )
        for name in PRESETS
    ]
    return [("Presets (a size flag you give wins over the preset)", rows)]


TRAIN_SECTIONS = {
    "Model": ("preset_name", "kind", "n_layers", "d_model", "n_heads", "context", "dropout", "positions"),
    "Data": ("tokenizer", "vocab_size"),
    "Optimisation": ("batch_size", "grad_accum", "lr", "warmup", "optimizer", "muon_lr", "weight_decay", "precision"),
    "Run": (
        "steps",
        "max_time",
        "eval_interval",
        "eval_iters",
        "sample_tokens",
        "seed",
        "device",
        "compile",
        "out",
        "resume",
        "nproc",
    ),
}


@main.command(
    sections=TRAIN_SECTIONS,
    notes=_preset_notes,
    examples=[
        ("a tiny character-level Transformer, two minutes on a CPU", "charlm train corpora/tinyshakespeare.txt"),
        ("an LSTM on BPE tokens for ten minutes", "charlm train notes.txt --model lstm --tokenizer bpe --max-time 10m"),
        (
            "five more minutes of the first run (--max-time is the total)",
            f"charlm train corpora/tinyshakespeare.txt --out {RUN} --resume --max-time 7m",
        ),
    ],
)
@click.argument("corpus", type=click.Path(path_type=str))
@click.option(
    "--preset",
    "preset_name",
    type=click.Choice(PRESETS),
    default=None,
    help="Model size and batch/lr defaults [default: tiny on CPU, small on CUDA].",
)
@config_options(ModelConfig)
@config_options(TrainConfig)
@click.option(
    "--out", type=click.Path(path_type=Path), help="Run directory [default: checkpoints/<corpus>-<model>-<tokenizer>]."
)
@click.option("--resume", is_flag=True, help="Continue the run in --out from its last checkpoint.")
@click.option("--nproc", type=int, help="Train with N processes (DistributedDataParallel): starts torchrun for you.")
@click.pass_context
def train(ctx, corpus, preset_name, out, resume, nproc, **flags):
    """Train a language model on CORPUS (a UTF-8 text file).

    Several processes: charlm train CORPUS --nproc N, or torchrun --nproc-per-node N -m charlm train CORPUS."""
    from charlm import distributed
    from charlm import train as trainer
    from charlm.views.progress import TrainView

    model_cfg, train_cfg = _configs(preset_name, flags)
    me = distributed.env()
    if resume:
        out = out or runs.latest_run(corpus, model_cfg.kind, train_cfg.tokenizer)
        if me.is_main:  # in use: say so first (what follows reads a run that is being written)
            runs.check_free(out)
        if not (out / "last.pt").exists():
            raise UserError(
                f"--resume: no checkpoint at {out / 'last.pt'}; train one first, or point --out at an existing run"
            )
        model_cfg, train_cfg = runs.resume_configs(
            out,
            checkpoint.read(out / "last.pt"),
            model_cfg,
            train_cfg,
            nproc or me.world_size,
            _given(ctx, preset_name),
        )
    else:
        out = out or runs.default_out(corpus, model_cfg.kind, train_cfg.tokenizer)
        if me.is_main:
            runs.check_free(out)
        _check_unused(out)
        # the tokenizer sets the real vocabulary size; check everything else before any work
        dataclasses.replace(model_cfg, vocab_size=2).validate()
    _check_writable(out)
    memory.check_fits(model_cfg, train_cfg, _device_guess(train_cfg.device), nproc or me.world_size)  # before any work
    if nproc is not None:
        if me.enabled:
            raise UserError("--nproc starts torchrun itself: drop it when running under torchrun")
        if nproc < 1:
            raise UserError(f"--nproc must be at least 1, got {nproc}")
        if nproc > 1:  # everything above was checked once, here; now the same command, N times
            _exec_torchrun(nproc, out, _device_guess(train_cfg.device))

    # every rank trains; only rank 0 shows it (the others would print the same lines again)
    console = Console(
        highlight=False, soft_wrap=True, quiet=not me.is_main
    )  # soft_wrap: no cuts at 80 columns in a pipe
    view = TrainView(console, corpus=corpus)
    # rank 0 holds the run directory until it exits: a second training into it is refused meanwhile
    lock = runs.RunLock(out) if me.is_main else None
    try:
        if lock and not resume:
            _check_unused(out)  # again, now under the lock: another run may have finished in it since
        run = trainer.Trainer(corpus, model_cfg, train_cfg, out, resume=resume, on_event=view)
        if not me.enabled:  # (under torchrun, the launcher's SIGTERM must still stop a rank that hangs)
            _ignore_signals()  # fit() handles them from its first line; once it returns, the process only has to exit
        result = run.fit()
    except trainer.TrainingInterrupted as e:
        view.close()
        name = "interrupted" if e.signum == signal.SIGINT else f"stopped by {signal.Signals(e.signum).name}"
        console.print(
            Text.assemble("\n", (name, "yellow"), f" at step {e.result.step}; saved ", safe(f"{out}/last.pt"))
        )
        # quoted for the shell, and never read as markup: paths may hold spaces, [brackets] or escapes
        console.print(f"resume with: {_resume_command(corpus, out)}", markup=False, highlight=False)
        sys.exit(128 + e.signum)  # the shell's convention: 130 for SIGINT, 143 for SIGTERM
    except trainer.TrainingDiverged as e:
        view.close()
        raise UserError(str(e)) from None
    except files.WriteError as e:
        if out.resolve() in e.path.resolve().parents and (out / "last.pt").exists():
            raise UserError(
                f"{e}; the checkpoints already in it are intact: free some space, then resume with: "
                f"{_resume_command(corpus, out)}"
            ) from None
        raise
    finally:
        view.close()
        distributed.close()
        if lock:
            lock.release()
    view.finish(result)


def _resume_command(corpus: str, out: Path) -> str:
    return f"charlm train {shell_quote(corpus)} --out {shell_quote(out)} --resume"


def _check_unused(out: Path) -> None:
    if (out / "last.pt").exists():
        raise UserError(f"{out} already holds a run: add --resume to continue it, or choose another --out")


def _configs(preset_name: str | None, flags: dict) -> tuple[ModelConfig, TrainConfig]:
    """The configs the flags describe, validated once: a flag typed > the preset > the field's default."""
    try:
        max_time = parse_duration(flags["max_time"]) if flags["max_time"] is not None else None
    except ConfigError as e:
        raise UserError(f"--max-time: {e}") from None
    steps = flags["steps"]
    if steps is None and max_time is None:
        max_time = 120.0
    flags = {**flags, "max_time": max_time, "steps": 1_000_000_000 if steps is None else steps}
    kind = flags["kind"]
    model_preset, train_preset = preset(
        kind, preset_name or ("small" if _device_guess(flags["device"]) == "cuda" else "tiny")
    )
    # `is None`, never `or`: --steps 0 or --lr 0 must be refused, not replaced by a default
    pick = lambda cls, base: {
        f.name: flags[f.name] if flags.get(f.name) is not None else base[f.name]  # noqa: E731
        for f in dataclasses.fields(cls)
        if f.name in base or flag_name(f) and flags.get(f.name) is not None
    }
    return ModelConfig(**pick(ModelConfig, model_preset)), TrainConfig(**pick(TrainConfig, train_preset)).validate()


def _given(ctx: click.Context, preset_name: str | None) -> set[str]:
    """What the user typed, in runs.resume_configs' terms: a --preset stands for every size it holds."""
    typed = {name for name in ctx.params if ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE}
    model_flags = {f.name for f in dataclasses.fields(ModelConfig) if flag_name(f)}  # --vocab-size is TrainConfig's
    given = {("model." + n if n in model_flags else n) for n in typed}
    if preset_name is not None:
        given |= {
            "preset:" + f.name
            for cls in (ModelConfig, TrainConfig)
            for f in dataclasses.fields(cls)
            if f.metadata.get("from_preset")
        }
    return given


def _device_guess(device: str) -> str:
    return "cuda" if device == "cuda" or (device == "auto" and _has_cuda()) else "cpu"


def _exec_torchrun(nproc: int, out: Path, device: str) -> NoReturn:
    """Replace this process by torchrun (PyTorch's launcher) running this same command in nproc
    processes: the same arguments minus --nproc, with the run directory made explicit."""
    import torch

    if device == "cuda" and nproc > torch.cuda.device_count():
        raise UserError(f"--nproc {nproc}: only {torch.cuda.device_count()} GPU(s) visible; use one process per GPU")
    argv = sys.argv[1:]
    if not argv or argv[0] != "train":
        raise UserError("--nproc works from the command line only; run torchrun --nproc-per-node N -m charlm train ...")
    args, skip = [], False
    for arg in argv:
        if skip or arg == "--nproc" or arg.startswith("--nproc="):
            skip = arg == "--nproc"
            continue
        args.append(arg)
    if "--out" not in args and not any(a.startswith("--out=") for a in args):
        args += ["--out", str(out)]
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        "charlm",
        *args,
    ]
    err_console().print(safe(f"launching: {shlex.join(cmd)}", "dim"), soft_wrap=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, cmd)


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


# ---- info ---------------------------------------------------------------------------------------


def _info(path: Path, d: checkpoint.Saved) -> dict:
    m = d.model_config
    return {
        "path": str(path),
        "run": d.run_name,
        "model": m.kind,
        "layers": m.n_layers,
        "d_model": m.d_model,
        "heads": m.n_heads if m.kind == "transformer" else None,
        "context": m.context,
        "positions": m.positions if m.kind == "transformer" else None,
        "params": d.params,
        "tokenizer": d.train_config.tokenizer,
        "vocab_size": m.vocab_size,  # read() checked that the tokenizer has as many
        "steps": d.step,
        "train_seconds": round(d.train_seconds, 2),
        "best_val_loss": d.best_val_loss,
        "best_val_bpc": d.best_val_bpc,
        "corpus": d.corpus.name if d.corpus else None,
        "corpus_sha256": d.corpus.sha256 if d.corpus else None,
        "device": d.device,
    }


@main.command(
    examples=[
        ("the model, its size, training and best score, and its loss curve", f"charlm info {RUN}"),
        ("the same as one JSON object", f"charlm info {RUN}/best.pt --json"),
    ]
)
@click.argument("ckpt", type=click.Path(path_type=str))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def info(ckpt, as_json):
    """Show what a checkpoint (a file or a run directory) holds."""
    path = checkpoint.resolve(ckpt)
    info = _info(path, checkpoint.read(path))  # checked, and no model built: a file's config never allocates
    if as_json:
        click.echo(json.dumps(info))
        return
    # names and paths come from the user's files: Text, never markup
    table = Table(title=safe(info["run"]), show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column(overflow="fold")  # a long path wraps instead of losing its end to "…"
    size = f"{info['layers']} layers × {info['d_model']}"
    if info["heads"]:
        size += f", {info['heads']} heads, {info['positions']} positions"
    table.add_row("model", f"{info['model']} ({size}, context {info['context']})")
    table.add_row("parameters", f"{info['params']:,}" if info["params"] else "?")
    table.add_row("tokenizer", f"{info['tokenizer']}, {info['vocab_size']} tokens")
    table.add_row("trained", safe(f"{info['steps']} steps in {info['train_seconds']:.1f}s on {info['device']}"))
    if info["best_val_loss"] is not None:
        table.add_row("best val", f"{info['best_val_loss']:.4f} nats/token · {info['best_val_bpc']:.3f} bits/char")
    table.add_row("corpus", safe(f"{info['corpus']} (sha256 {str(info['corpus_sha256'])[:12]}…)"))
    table.add_row("file", safe(info["path"]))
    console = Console(highlight=False)
    console.print(table)
    curve = _curves([str(Path(info["path"]).parent)], missing_ok=True)
    if curve and len(next(iter(curve.values()))) > 1:
        console.print(Text("bits/char while training (charlm plot for more):", style="bold"))
        _print_chart(console, curve, y="bpc", x="step", width=min(console.width, 100), height=14)


# ---- runs: runs, plot ---------------------------------------------------------------------------


def _curves(paths: tuple[str, ...] | list[str], missing_ok: bool = False) -> dict[str, list[dict]]:
    """Each run's metrics.jsonl rows, by a label: the directory's name, or the path given where names repeat."""
    dirs = [Path(p) if not Path(p).is_file() else Path(p).parent for p in paths]
    names = [d.resolve().name for d in dirs]
    curves = {}
    for given, d, name in zip(paths, dirs, names):
        if not d.is_dir():
            raise UserError(
                f"no run directory {given}: give a run directory (charlm runs lists them) or a checkpoint in one"
            )
        try:
            points = runs.read_metrics(d)
        except ConfigError:
            if missing_ok:
                continue
            raise
        if not points and missing_ok:
            continue
        if not points:
            raise UserError(f"{given} has no evaluations yet: plot it after its first one")
        curves[name if names.count(name) == 1 else str(given)] = points
    return curves


def _print_chart(console: Console, curves: dict[str, list[dict]], **kw) -> None:
    from charlm.views.runs import loss_chart

    # colour on a terminal only; piped or NO_COLOR: plain characters, the series told apart by their markers
    color = console.is_terminal and not console.no_color
    click.echo(loss_chart(curves, color=color, **kw).rstrip("\n"))


@main.command(
    "runs",
    examples=[
        ("the runs under checkpoints/, newest first", "charlm runs"),
        ("the runs in another folder, as JSON", "charlm runs /data/runs --json"),
    ],
)
@click.argument("directory", required=False, type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON list, one object per run.")
def runs_(directory, as_json):
    """List the runs in DIRECTORY [default: checkpoints]: model, tokenizer, size, steps, time, best score, corpus."""
    from charlm.views.runs import render_runs

    root = directory or runs.RUNS
    if not root.is_dir():
        if directory is None:
            raise UserError(
                f"no {runs.RUNS}/ folder here yet: train a model with charlm train FILE, or give a DIRECTORY"
            )
        raise UserError(f"no directory {directory}: give a folder that holds run directories")
    rows = [runs.describe(run) for run in runs.find_runs(root)]
    if as_json:
        click.echo(json.dumps(rows))
        return
    if not rows:
        err_console().print(Text(f"no runs in {root}: train one with charlm train FILE --out {root}/NAME"))
        return
    render_runs(Console(highlight=False), rows, f"{len(rows)} run{'s' * (len(rows) > 1)} in {root}")


@main.command(
    examples=[
        ("one run's train and val bits/char against steps", f"charlm plot {RUN}"),
        ("two runs overlaid, loss against seconds of training", f"charlm plot {RUN} {RUN}-2 --y loss --x time"),
        ("the numbers behind the chart", f"charlm plot {RUN} --json"),
    ]
)
@click.argument("run_dirs", metavar="RUN...", nargs=-1, required=True, type=click.Path(path_type=str))
@click.option(
    "--y",
    "y",
    type=click.Choice(["bpc", "loss"]),
    default="bpc",
    show_default=True,
    help="Bits per character (comparable across tokenizers), or loss in nats per token.",
)
@click.option(
    "--x",
    "x",
    type=click.Choice(["step", "time"]),
    default="step",
    show_default=True,
    help="Optimizer steps, or seconds of training.",
)
@click.option("--width", type=int, help="Width in characters [default: the terminal's, at most 120].")
@click.option("--height", type=int, default=20, show_default=True, help="Height in lines.")
@click.option("--json", "as_json", is_flag=True, help="Print the evaluations of each run as JSON instead.")
def plot(run_dirs, y, x, width, height, as_json):
    """Loss curves of one run, or several overlaid: train and val, from each run's metrics.jsonl."""
    if width is not None and width < 30:
        raise UserError(f"--width must be at least 30, got {width}")
    if height < 8:
        raise UserError(f"--height must be at least 8, got {height}")
    curves = _curves(run_dirs)
    if as_json:
        click.echo(json.dumps([{"run": name, "evaluations": points} for name, points in curves.items()]))
        return
    console = Console(highlight=False)
    _print_chart(console, curves, y=y, x=x, width=width or min(console.width, 120), height=height)


# ---- generation: sample, chat -------------------------------------------------------------------


def sampling_options(max_tokens: int):
    """The sampling flags shared by sample and chat (from SampleConfig), and how to run the model."""
    extra = [
        click.option("--no-cache", is_flag=True, help="Recompute the whole text for every token (slow: to compare)."),
        device_option,
    ]

    def decorate(f):
        for option in reversed(extra):
            f = option(f)
        return config_options(SampleConfig, defaults={"max_tokens": max_tokens})(f)

    return decorate


def _settings(max_tokens, temperature, top_k, top_p, repetition_penalty, stop, seed):
    from charlm.views.repl import unescape

    return SampleConfig(
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        repetition_penalty=repetition_penalty,
        max_tokens=max_tokens,
        stop=[unescape(s) for s in stop],
        seed=seed,
    ).validate()


def _read_prompt(prompt: str | None, prompt_file: str | None) -> str:
    if prompt is not None and prompt_file is not None:
        raise UserError("give --prompt or --prompt-file, not both")
    if prompt is not None:
        return prompt
    if prompt_file == "-" or (prompt_file is None and not sys.stdin.isatty()):
        return sys.stdin.read()
    if prompt_file is None:
        return ""
    try:
        return Path(prompt_file).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"--prompt-file: no such file {prompt_file}") from None
    except UnicodeDecodeError:
        raise UserError(f"--prompt-file: {prompt_file} is not UTF-8 text") from None
    except OSError as e:
        raise UserError(f"--prompt-file: cannot read {prompt_file} ({e.strerror})") from None


@main.command(
    examples=[
        ("200 tokens after a prompt", f'charlm sample {RUN} -p "ROMEO:" -n 200'),
        (
            "the prompt from a pipe, the text to a file, the same text each time",
            f'echo "To be" | charlm sample {RUN} --seed 1 > out.txt',
        ),
    ]
)
@click.argument("ckpt", type=click.Path(path_type=str))
@click.option("--prompt", "-p", help="Text to continue [default: --prompt-file, else stdin when piped, else none].")
@click.option("--prompt-file", type=str, help="Read the prompt from this file ('-': stdin).")
@sampling_options(max_tokens=500)
@click.option("--num-samples", type=int, default=1, show_default=True, help="Samples, separated by a line '---'.")
@unknown_option
@click.option("--echo/--no-echo", default=True, show_default=True, help="Print the prompt before its continuation.")
@click.option("--stats", is_flag=True, help="One JSON line on stderr: tokens, seconds, tokens_per_s, ttft_ms.")
def sample(
    ckpt,
    prompt,
    prompt_file,
    max_tokens,
    temperature,
    top_k,
    top_p,
    repetition_penalty,
    stop,
    seed,
    no_cache,
    device,
    num_samples,
    unknown,
    echo,
    stats,
):
    """Continue a prompt with CKPT, streaming plain text to stdout (ready for pipes)."""
    from charlm.generate import Streamer
    from charlm.runtime import pick_device
    from charlm.views.repl import StreamPrinter

    settings = _settings(max_tokens, temperature, top_k, top_p, repetition_penalty, stop, seed)
    if num_samples < 1:
        raise UserError(f"--num-samples must be at least 1, got {num_samples}")
    text = _read_prompt(prompt, prompt_file)
    ck = checkpoint.load(ckpt, device=pick_device(device))
    ids = ck.tokenizer.encode(text, unknown=unknown)
    shown = ck.tokenizer.decode(ids)  # the prompt as the model reads it (--unknown may have changed it)
    gen = Streamer(ck.model, ck.tokenizer, use_cache=not no_cache)
    console = Console(highlight=False)
    terminal = console.is_terminal  # a terminal gets safe, styled text; a pipe or file the exact text
    printer = StreamPrinter(console, "")

    def write(piece: str, style: str = "") -> None:
        if not terminal:
            sys.stdout.write(piece)
            sys.stdout.flush()
        elif style:
            printer.flush()
            console.print(safe(piece, style), end="", soft_wrap=True)
        else:
            printer.write(piece)

    runs = []  # (a reader that stops early, as `| head` does, is handled by Click: exit 1, no traceback)
    for i in range(num_samples):
        if i:
            write("---\n", "dim")
        if echo and shown:
            write(shown, "bold")
        run = dataclasses.replace(settings, seed=None if seed is None else seed + i)
        gen.reset()
        last = shown if echo else ""
        try:
            for piece in gen.stream(ids, run):
                write(piece)
                last = piece
        finally:  # Ctrl-C included: what was generated is shown
            printer.flush()
        if last and not last.endswith("\n"):
            write("\n")
        runs.append(gen.stats)
    printer.flush()  # the text's last newline reaches the terminal before the stats line on stderr
    if stats:
        total = sum(r.seconds for r in runs)
        tokens = sum(r.tokens for r in runs)
        line = {
            "tokens": tokens,
            "seconds": round(total, 4),
            "tokens_per_s": round(tokens / total, 1) if total else 0.0,
            "ttft_ms": round(sum(r.ttft_ms for r in runs) / len(runs), 2),
            "prompt_tokens": len(ids),
            "samples": num_samples,
            "cache": not no_cache,
        }
        click.echo(json.dumps(line), err=True)


@main.command(
    examples=[
        ("talk to the run the README's first command trains", f"charlm chat {RUN}"),
        ("each prompt continues the running text, less random", f"charlm chat {RUN} --mode continue -t 0.5"),
    ]
)
@click.argument("ckpt", type=click.Path(path_type=str))
@sampling_options(max_tokens=200)
@click.option(
    "--mode",
    type=click.Choice(["fresh", "continue"]),
    default="fresh",
    show_default=True,
    help="Each prompt starts anew, or continues the running text.",
)
@unknown_option
def chat(ckpt, max_tokens, temperature, top_k, top_p, repetition_penalty, stop, seed, no_cache, device, mode, unknown):
    """Talk to CKPT: a REPL that streams each continuation as it is generated (/help inside)."""
    from charlm.runtime import pick_device
    from charlm.views.repl import Repl

    settings = _settings(max_tokens, temperature, top_k, top_p, repetition_penalty, stop, seed)
    ck = checkpoint.load(ckpt, device=pick_device(device))
    Repl(ck, settings, Console(highlight=False), mode=mode, use_cache=not no_cache, unknown=unknown).run()


# ---- viewers: attn, gates -----------------------------------------------------------------------


def viewer_options(command):
    """The options attn and gates share: what text to look at, and how much of it fits."""
    for option in reversed(
        [
            click.argument("ckpt", type=click.Path(path_type=str)),
            click.option("--prompt", "-p", help="The text to look at [default: --prompt-file, else stdin when piped]."),
            click.option("--prompt-file", type=str, help="Read the text from this file ('-': stdin)."),
            click.option("--layer", type=int, help="Layer (from 0) [default: the last]."),
            click.option("--tokens", type=int, help="How many tokens to show [default: as many as fit]."),
            click.option("--end", type=int, help="Show the tokens before this position [default: the end]."),
            click.option("--width", type=int, help="Width in characters [default: the terminal's]."),
            click.option("--ascii", is_flag=True, help="Plain ASCII shades and labels."),
            unknown_option,
        ]
    ):
        command = option(command)
    return command


def _viewer_input(ckpt: str, prompt: str | None, prompt_file: str | None, unknown: str, width: int | None):
    """(checkpoint, prompt ids, console) shared by attn and gates."""
    if width is not None and width < 20:
        raise UserError(f"--width must be at least 20, got {width}")
    if prompt == "":
        raise UserError("--prompt is empty: give the text to look at")
    prompt = _read_prompt(prompt, prompt_file)
    if not prompt:
        raise UserError("no text to look at: give --prompt TEXT or --prompt-file FILE, or pipe the text in")
    ck = checkpoint.load(ckpt)
    ids = ck.tokenizer.encode(prompt, unknown=unknown)
    if not ids:
        raise UserError("--prompt has no characters the model knows")
    return ck, ids, Console(highlight=False, width=width)


@main.command(
    examples=[
        ("the last layer's attention, mean over heads", f'charlm attn {RUN} -p "To be, or not to be"'),
        ("every layer × head as small maps", f'charlm attn {RUN} -p "To be, or not to be" --overview'),
        ("what the last token looked at", f'charlm attn {RUN} -p "To be, or not to be" --focus -1'),
    ]
)
@viewer_options
@click.option("--head", type=int, help="Head (from 0) [default: the mean over heads].")
@click.option("--mean", is_flag=True, help="The mean over the layer's heads.")
@click.option("--overview", is_flag=True, help="Every layer × head as small maps.")
@click.option("--stats", is_flag=True, help="Entropy and mean distance of every head.")
@click.option(
    "--focus",
    type=str,
    help="What one token looked at: a position (negative: from the end), or text (its last occurrence's last token).",
)
@click.option("--top", type=int, default=10, show_default=True, help="Keys listed by --focus.")
@click.option(
    "--scale",
    type=click.Choice(["row", "abs"]),
    default="row",
    show_default=True,
    help="Shade by each row's largest weight, or absolute (1 = darkest).",
)
def attn(
    ckpt, prompt, prompt_file, layer, head, mean, overview, stats, focus, top, tokens, end, width, scale, ascii, unknown
):
    """Show a transformer's attention on a text (--prompt, --prompt-file or stdin) as terminal heat maps (by default: the last layer,
    mean over heads)."""
    from charlm.views.attention import AttnOptions, render_attention

    if overview and (layer is not None or head is not None or mean):
        raise UserError("--overview shows every head: drop --layer/--head/--mean, or drop --overview")
    ck, ids, console = _viewer_input(ckpt, prompt, prompt_file, unknown, width)
    if not ck.model.has_attention:
        raise UserError(f"{ck.name} is an LSTM/GRU: it has no attention; try 'charlm gates'")
    opts = AttnOptions(
        layer=layer,
        head=head,
        mean=mean,
        overview=overview,
        stats=stats,
        focus=focus,
        top=top,
        tokens=tokens,
        end=end,
        scale=scale,
        ascii=ascii,
        flags=True,
    )
    render_attention(console, ck.model, ck.tokenizer, ids, opts)


@main.command(
    examples=[
        (
            "the 8 units whose gates change most",
            'charlm gates checkpoints/tinyshakespeare-lstm-char -p "To be, or not to be"',
        ),
        (
            "three chosen units of the first layer",
            'charlm gates checkpoints/tinyshakespeare-lstm-char -p "To be" --layer 0 --units 3,17,42',
        ),
    ]
)
@viewer_options
@click.option("--units", type=str, help="How many units (those whose gates change most; default 8), or which: 3,17,42.")
def gates(ckpt, prompt, prompt_file, layer, units, tokens, end, width, ascii, unknown):
    """Show an LSTM's forget/input/output gates (a GRU's update/reset gates) and its cell state over a text (--prompt, --prompt-file or stdin)."""
    from charlm.views.gates import GateOptions, parse_units, render_gates

    ck, ids, console = _viewer_input(ckpt, prompt, prompt_file, unknown, width)
    if ck.model.has_attention:
        raise UserError(f"{ck.name} is a transformer: it has no gates; try 'charlm attn'")
    opts = GateOptions(
        layer=layer, units=parse_units(units) if units else None, tokens=tokens, end=end, ascii=ascii, flags=True
    )
    render_gates(console, ck.model, ck.tokenizer, ids, opts)


# ---- comparison: eval, compare ------------------------------------------------------------------


@main.command(
    "eval",
    short_help="Loss, perplexity and bits per character of CKPT on any text FILE.",
    examples=[
        ("bits per character on the whole corpus", f"charlm eval {RUN} corpora/tinyshakespeare.txt"),
        ("the same as one JSON object", f"charlm eval {RUN} other.txt --json"),
    ],
)
@click.argument("ckpt", type=click.Path(path_type=str))
@click.argument("file", type=click.Path(path_type=str))
@click.option("--stride", type=int, help="Transformer: tokens each window advances [default: context/2].")
@unknown_option
@device_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def eval_(ckpt, file, stride, unknown, device, as_json):
    """Loss, perplexity, bits per character and per byte of CKPT on FILE (any UTF-8 text), over the
    whole file: the Transformer reads it in overlapping windows of its context, an LSTM/GRU in one pass."""
    from charlm.evaluate import evaluate_file
    from charlm.runtime import pick_device
    from charlm.views.eval import EvalProgress, eval_summary, render_eval

    loaded = checkpoint.load(ckpt, device=pick_device(device))
    with EvalProgress(err_console()) as progress:
        result = evaluate_file(loaded.model, loaded.tokenizer, file, stride=stride, unknown=unknown, progress=progress)
    if as_json:
        click.echo(json.dumps(eval_summary(loaded, file, result)))
    else:
        render_eval(Console(highlight=False), loaded, file, result)


@main.command(
    examples=[
        ("two runs continue the same prompt, then a table", f'charlm compare {RUN} {RUN}-2 -p "ROMEO:"'),
        (
            "with each one's bits per character on a text",
            f"charlm compare {RUN} {RUN}-2 --eval corpora/tinyshakespeare.txt",
        ),
        ("a prompt loop: each prompt goes to every model", f"charlm compare {RUN} {RUN}-2 -i"),
    ]
)
@click.argument("ckpts", nargs=-1, required=True, type=click.Path(path_type=str))
@click.option("--prompt", "-p", default="", help="Text every model continues [default: none].")
@config_options(SampleConfig, defaults={"max_tokens": 200})
@unknown_option
@click.option(
    "--eval", "eval_file", type=click.Path(path_type=str), help="Also show each model's bits/char on this text."
)
@click.option("--interactive", "-i", is_flag=True, help="A prompt loop: each prompt goes to every model.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (each model's text and numbers) instead.")
@device_option
def compare(
    ckpts,
    prompt,
    max_tokens,
    temperature,
    top_k,
    top_p,
    repetition_penalty,
    stop,
    seed,
    unknown,
    eval_file,
    interactive,
    as_json,
    device,
):
    """Continue the same prompt with two or more checkpoints, side by side, then compare them in a table."""
    from charlm.comparison import Comparison
    from charlm.runtime import pick_device
    from charlm.views.compare import CompareRepl, CompareView
    from charlm.views.eval import EvalProgress

    if len(ckpts) < 2:
        raise UserError("compare needs at least two checkpoints (files or run directories)")
    if as_json and interactive:
        raise UserError("--json prints one run: drop --interactive or --json")
    settings = _settings(max_tokens, temperature, top_k, top_p, repetition_penalty, stop, seed)
    device = pick_device(device)
    loaded = [checkpoint.load(c, device=device) for c in ckpts]  # a bad one: CheckpointError naming it
    comparison = Comparison(loaded, settings, unknown=unknown)
    view = CompareView(comparison, Console(highlight=False))
    if eval_file:
        bars = err_console()
        comparison.evaluate(eval_file, lambda name: EvalProgress(bars, f"eval {name}"))
        view.notes()  # e.g. a char model that cannot read the file: said once, up front
    if interactive:
        CompareRepl(view).run()
    elif as_json:
        comparison.run(prompt)
        click.echo(json.dumps(comparison.summary()))
    else:
        view.show(prompt)


# ---- lab ----------------------------------------------------------------------------------------


@main.command(
    examples=[
        ("the experiments, one line each", "charlm lab"),
        ("delayed copy: where the LSTM's fixed state runs out and attention does not", "charlm lab copy"),
        ("time per token against the context, with fitted growth exponents", "charlm lab cost --json"),
        ("every head of a trained Transformer, named by what it does", f"charlm lab heads {RUN}"),
    ]
)
@click.argument("name", required=False)
@click.argument("ckpt", required=False, type=click.Path(path_type=str))
@click.option("--quick", is_flag=True, help="Test size: seconds instead of minutes.")
@click.option("--seed", type=int, default=0, show_default=True, help="Same seed, same table.")
@click.option(
    "--seeds",
    type=click.IntRange(1, 100),
    default=1,
    show_default=True,
    help="Train each model with this many seeds (--seed, --seed + 1, ...); the table shows every one.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object: experiment, settings, results, reading.")
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    help="Where the lab's models are saved, as normal runs [default: checkpoints/lab].",
)
@device_option
@click.option(
    "--text",
    "text_file",
    type=click.Path(path_type=str),
    help="ablate: the text scored [default: the run's corpus.txt].",
)
@click.option("--plain", is_flag=True, help="A chart without colours (series told apart by their markers).")
def lab(name, ckpt, quick, seed, seeds, as_json, out, device, text_file, plain):
    """Small controlled experiments on the two memories. `charlm lab` lists them; `charlm lab NAME` runs one.

    \b
    Measured at default size on a 2-core CPU shared with other jobs (load 12-15): wall time, and in
    brackets CPU time, which is about the wall time on an idle core (the lab runs torch on one thread):
      copy 891 s (79 s) · recall 1185 s (116 s) · cost 147 s (22 s) · positions 410 s (30 s)
      heads 38 s (3 s) · ablate 47 s (4 s)
    """
    from contextlib import nullcontext

    from charlm.lab import EXPERIMENTS, LAB_DIR, run_experiment
    from charlm.views.lab import render_copy_views, render_lab, render_list

    console = Console(highlight=False)
    if name is None:
        render_list(console, EXPERIMENTS)
        return
    status = err_console().status(f"lab {name}") if not as_json else nullcontext()
    with status:  # the progress line lives on stderr and goes away when the experiment ends
        result = run_experiment(
            name,
            ckpt=ckpt,
            quick=quick,
            seed=seed,
            seeds=seeds,
            device=device,
            out=out or LAB_DIR,
            text=text_file,
            progress=status.update if not as_json else (lambda message: None),
        )
    if as_json:
        click.echo(json.dumps(result.to_dict()))
    else:
        render_lab(console, result, color=not plain)
        if result.experiment == "copy":  # show why, with the viewers
            d = result.details
            render_copy_views(
                console, d, checkpoint.load(d["transformer_run"]), checkpoint.load(d["lstm_run"]), ascii=plain
            )
