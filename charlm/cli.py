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
from click.core import ParameterSource
from rich.console import Console
from rich.table import Table
from rich.text import Text

from charlm import checkpoint, files
from charlm.checkpoint import CheckpointError
from charlm import runs
from charlm.config import (DEVICES, PRESETS, UNKNOWN, ConfigError, ModelConfig, SampleConfig, TrainConfig, flag_name,
                           parse_duration, preset)
from charlm.data import CorpusError
from charlm.tokenizer import UnknownCharactersError
from charlm.views.text import safe_text

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
    err_console().print(Text.assemble(("error: ", "red"), safe_text(line)), soft_wrap=True)


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
            print_error(f"unexpected {type(e).__name__}: {e} (run with CHARLM_DEBUG=1 for the traceback, and please report it)")
            sys.exit(1)
        if not standalone_mode:
            return rv
        sys.exit(rv if isinstance(rv, int) else 0)


def _ignore_signals() -> None:
    """The process is ending: a Ctrl-C or SIGTERM could only cut its last lines or Python's shutdown short
    (a KeyboardInterrupt in an atexit callback prints a traceback), so they are ignored from here on. Not
    when main() was called in-process: the caller keeps its handlers."""
    if _AS_PROGRAM:
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, signal.SIG_IGN)


@click.group(cls=CharlmGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="charlm")
def main():
    """Train small character- and BPE-level language models (LSTM, GRU, Transformer) on any text file,
    then chat with them and look inside."""


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
device_option = click.option("--device", type=click.Choice(DEVICES), default="auto", show_default=True, help=DEVICE_HELP)
unknown_option = click.option("--unknown", type=click.Choice(UNKNOWN), default="error", show_default=True,
                              help="Characters a char model never saw: stop with an error, drop them, or replace them.")


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
        raise UserError(f"cannot write to {out}: {probe} is not writable ({e.strerror}); choose another --out") from None


@main.command()
@click.argument("corpus", type=click.Path(path_type=str))
@click.option("--preset", "preset_name", type=click.Choice(PRESETS), default=None,
              help="Model size and batch/lr defaults [default: tiny on CPU, small on CUDA].")
@config_options(ModelConfig)
@config_options(TrainConfig)
@click.option("--out", type=click.Path(path_type=Path), help="Run directory [default: checkpoints/<corpus>-<model>-<tokenizer>].")
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
            raise UserError(f"--resume: no checkpoint at {out / 'last.pt'}; train one first, or point --out at an existing run")
        model_cfg, train_cfg = runs.resume_configs(out, checkpoint.read(out / "last.pt"), model_cfg, train_cfg,
                                                   nproc or me.world_size, _given(ctx, preset_name))
    else:
        out = out or runs.default_out(corpus, model_cfg.kind, train_cfg.tokenizer)
        if me.is_main:
            runs.check_free(out)
        _check_unused(out)
        # the tokenizer sets the real vocabulary size; check everything else before any work
        dataclasses.replace(model_cfg, vocab_size=2).validate()
    _check_writable(out)
    if nproc is not None:
        if me.enabled:
            raise UserError("--nproc starts torchrun itself: drop it when running under torchrun")
        if nproc < 1:
            raise UserError(f"--nproc must be at least 1, got {nproc}")
        if nproc > 1:  # everything above was checked once, here; now the same command, N times
            _exec_torchrun(nproc, out, _device_guess(train_cfg.device))

    # every rank trains; only rank 0 shows it (the others would print the same lines again)
    console = Console(highlight=False, soft_wrap=True, quiet=not me.is_main)  # soft_wrap: no cuts at 80 columns in a pipe
    view = TrainView(console)
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
        console.print(Text.assemble("\n", (name, "yellow"), f" at step {e.result.step}; saved {out}/last.pt"))
        # quoted for the shell, and never read as markup: paths may hold spaces or [brackets]
        console.print(f"resume with: {_resume_command(corpus, out)}", markup=False, highlight=False)
        sys.exit(128 + e.signum)  # the shell's convention: 130 for SIGINT, 143 for SIGTERM
    except trainer.TrainingDiverged as e:
        view.close()
        raise UserError(str(e)) from None
    except files.WriteError as e:
        if out.resolve() in e.path.resolve().parents and (out / "last.pt").exists():
            raise UserError(f"{e}; the checkpoints already in it are intact: free some space, then resume with: "
                            f"{_resume_command(corpus, out)}") from None
        raise
    finally:
        view.close()
        distributed.close()
        if lock:
            lock.release()
    view.finish(result)


def _resume_command(corpus: str, out: Path) -> str:
    return f"charlm train {shlex.quote(corpus)} --out {shlex.quote(str(out))} --resume"


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
    model_preset, train_preset = preset(kind, preset_name or ("small" if _device_guess(flags["device"]) == "cuda" else "tiny"))
    # `is None`, never `or`: --steps 0 or --lr 0 must be refused, not replaced by a default
    pick = lambda cls, base: {f.name: flags[f.name] if flags.get(f.name) is not None else base[f.name]  # noqa: E731
                              for f in dataclasses.fields(cls) if f.name in base or flag_name(f) and flags.get(f.name) is not None}
    return ModelConfig(**pick(ModelConfig, model_preset)), TrainConfig(**pick(TrainConfig, train_preset)).validate()


def _given(ctx: click.Context, preset_name: str | None) -> set[str]:
    """What the user typed, in runs.resume_configs' terms: a --preset stands for every size it holds."""
    typed = {name for name in ctx.params if ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE}
    model_fields = {f.name for f in dataclasses.fields(ModelConfig)}
    given = {("model." + n if n in model_fields else n) for n in typed}
    if preset_name is not None:
        given |= {"preset:" + f.name for cls in (ModelConfig, TrainConfig) for f in dataclasses.fields(cls)
                  if f.metadata.get("from_preset")}
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
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", "-m", "charlm", *args]
    err_console().print(Text(f"launching: {shlex.join(cmd)}", style="dim"), soft_wrap=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, cmd)


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


# ---- info ---------------------------------------------------------------------------------------


def _info(ckpt: checkpoint.Checkpoint) -> dict:
    d, m = ckpt.saved, ckpt.model_config
    return {
        "path": str(ckpt.path),
        "run": ckpt.name,
        "model": m.kind,
        "layers": m.n_layers,
        "d_model": m.d_model,
        "heads": m.n_heads if m.kind == "transformer" else None,
        "context": m.context,
        "positions": m.positions if m.kind == "transformer" else None,
        "params": d.params,
        "tokenizer": ckpt.tokenizer.kind,
        "vocab_size": ckpt.tokenizer.vocab_size,
        "steps": d.step,
        "train_seconds": round(d.train_seconds, 2),
        "best_val_loss": d.best_val_loss,
        "best_val_bpc": d.best_val_bpc,
        "corpus": d.corpus.name if d.corpus else None,
        "corpus_sha256": d.corpus.sha256 if d.corpus else None,
        "device": d.device,
    }


@main.command()
@click.argument("ckpt", type=click.Path(path_type=str))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def info(ckpt, as_json):
    """Show what a checkpoint (a file or a run directory) holds."""
    info = _info(checkpoint.load(ckpt))
    if as_json:
        click.echo(json.dumps(info))
        return
    # names and paths come from the user's files: Text, never markup
    table = Table(title=Text(safe_text(str(info["run"]))), show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column(overflow="fold")  # a long path wraps instead of losing its end to "…"
    size = f"{info['layers']} layers × {info['d_model']}"
    if info["heads"]:
        size += f", {info['heads']} heads, {info['positions']} positions"
    table.add_row("model", f"{info['model']} ({size}, context {info['context']})")
    table.add_row("parameters", f"{info['params']:,}" if info["params"] else "?")
    table.add_row("tokenizer", f"{info['tokenizer']}, {info['vocab_size']} tokens")
    table.add_row("trained", f"{info['steps']} steps in {info['train_seconds']:.1f}s on {info['device']}")
    if info["best_val_loss"] is not None:
        table.add_row("best val", f"{info['best_val_loss']:.4f} nats/token · {info['best_val_bpc']:.3f} bits/char")
    table.add_row("corpus", Text(safe_text(f"{info['corpus']} (sha256 {str(info['corpus_sha256'])[:12]}…)")))
    table.add_row("file", Text(safe_text(info["path"])))
    Console(highlight=False).print(table)


# ---- generation: sample, chat -------------------------------------------------------------------


def sampling_options(max_tokens: int):
    """The sampling flags shared by sample and chat (from SampleConfig), and how to run the model."""
    extra = [click.option("--no-cache", is_flag=True, help="Recompute the whole text for every token (slow: to compare)."),
             device_option]

    def decorate(f):
        for option in reversed(extra):
            f = option(f)
        return config_options(SampleConfig, defaults={"max_tokens": max_tokens})(f)

    return decorate


def _settings(max_tokens, temperature, top_k, top_p, repetition_penalty, stop, seed):
    from charlm.views.repl import unescape

    return SampleConfig(temperature=temperature, top_k=top_k, top_p=top_p, repetition_penalty=repetition_penalty,
                        max_tokens=max_tokens, stop=[unescape(s) for s in stop], seed=seed).validate()


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


@main.command()
@click.argument("ckpt", type=click.Path(path_type=str))
@click.option("--prompt", "-p", help="Text to continue [default: --prompt-file, else stdin when piped, else none].")
@click.option("--prompt-file", type=str, help="Read the prompt from this file ('-': stdin).")
@sampling_options(max_tokens=500)
@click.option("--num-samples", type=int, default=1, show_default=True, help="Samples, separated by a line '---'.")
@unknown_option
@click.option("--echo/--no-echo", default=True, show_default=True, help="Print the prompt before its continuation.")
@click.option("--stats", is_flag=True, help="One JSON line on stderr: tokens, seconds, tokens_per_s, ttft_ms.")
def sample(ckpt, prompt, prompt_file, max_tokens, temperature, top_k, top_p, repetition_penalty, stop, seed, no_cache,
           device, num_samples, unknown, echo, stats):
    """Continue a prompt with CKPT, streaming plain text to stdout (pipe-friendly)."""
    from charlm.generate import Generator
    from charlm.runtime import pick_device
    from charlm.views.repl import StreamPrinter

    settings = _settings(max_tokens, temperature, top_k, top_p, repetition_penalty, stop, seed)
    if num_samples < 1:
        raise UserError(f"--num-samples must be at least 1, got {num_samples}")
    text = _read_prompt(prompt, prompt_file)
    ck = checkpoint.load(ckpt, device=pick_device(device))
    ids = ck.tokenizer.encode(text, unknown=unknown)
    shown = ck.tokenizer.decode(ids)  # the prompt as the model reads it (--unknown may have changed it)
    gen = Generator(ck.model, ck.tokenizer, use_cache=not no_cache)
    console = Console(highlight=False)
    terminal = console.is_terminal  # a terminal gets safe, styled text; a pipe or file the exact text
    printer = StreamPrinter(console, "")

    def write(piece: str, style: str = "") -> None:
        if not terminal:
            sys.stdout.write(piece)
            sys.stdout.flush()
        elif style:
            printer.flush()
            console.print(Text(safe_text(piece), style=style), end="", soft_wrap=True)
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
    if stats:
        total = sum(r.seconds for r in runs)
        tokens = sum(r.tokens for r in runs)
        line = {"tokens": tokens, "seconds": round(total, 4), "tokens_per_s": round(tokens / total, 1) if total else 0.0,
                "ttft_ms": round(sum(r.ttft_ms for r in runs) / len(runs), 2), "prompt_tokens": len(ids),
                "samples": num_samples, "cache": not no_cache}
        click.echo(json.dumps(line), err=True)


@main.command()
@click.argument("ckpt", type=click.Path(path_type=str))
@sampling_options(max_tokens=200)
@click.option("--mode", type=click.Choice(["fresh", "continue"]), default="fresh", show_default=True,
              help="Each prompt starts anew, or continues the running text.")
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
    for option in reversed([
        click.argument("ckpt", type=click.Path(path_type=str)),
        click.option("--prompt", "-p", required=True, help="The text to look at."),
        click.option("--layer", type=int, help="Layer (from 0) [default: the last]."),
        click.option("--tokens", type=int, help="How many tokens to show [default: as many as fit]."),
        click.option("--end", type=int, help="Show the tokens before this position [default: the end]."),
        click.option("--width", type=int, help="Width in characters [default: the terminal's]."),
        click.option("--ascii", is_flag=True, help="Plain ASCII shades and labels."),
        unknown_option,
    ]):
        command = option(command)
    return command


def _viewer_input(ckpt: str, prompt: str, unknown: str, width: int | None):
    """(checkpoint, prompt ids, console) shared by attn and gates."""
    if width is not None and width < 20:
        raise UserError(f"--width must be at least 20, got {width}")
    if not prompt:
        raise UserError("--prompt is empty: give the text to look at")
    ck = checkpoint.load(ckpt)
    ids = ck.tokenizer.encode(prompt, unknown=unknown)
    if not ids:
        raise UserError("--prompt has no characters the model knows")
    return ck, ids, Console(highlight=False, width=width)


@main.command()
@viewer_options
@click.option("--head", type=int, help="Head (from 0) [default: the mean over heads].")
@click.option("--mean", is_flag=True, help="The mean over the layer's heads.")
@click.option("--overview", is_flag=True, help="Every layer × head as small maps.")
@click.option("--stats", is_flag=True, help="Entropy and mean distance of every head.")
@click.option("--focus", type=str, help="One token (a position, negative from the end, or its text): what it looked at.")
@click.option("--top", type=int, default=10, show_default=True, help="Keys listed by --focus.")
@click.option("--scale", type=click.Choice(["row", "abs"]), default="row", show_default=True,
              help="Shade by each row's largest weight, or absolute (1 = darkest).")
def attn(ckpt, prompt, layer, head, mean, overview, stats, focus, top, tokens, end, width, scale, ascii, unknown):
    """Show a transformer's attention on --prompt as terminal heat maps (by default: the last layer,
    mean over heads)."""
    from charlm.views.attention import AttnOptions, render_attention

    if overview and (layer is not None or head is not None or mean):
        raise UserError("--overview shows every head: drop --layer/--head/--mean, or drop --overview")
    ck, ids, console = _viewer_input(ckpt, prompt, unknown, width)
    if not ck.model.has_attention:
        raise UserError(f"{ck.name} is an LSTM/GRU: it has no attention; try 'charlm gates'")
    opts = AttnOptions(layer=layer, head=head, mean=mean, overview=overview, stats=stats, focus=focus,
                       top=top, tokens=tokens, end=end, scale=scale, ascii=ascii)
    render_attention(console, ck.model, ck.tokenizer, ids, opts)


@main.command()
@viewer_options
@click.option("--units", type=str, help="How many units (those whose gates change most; default 8), or which: 3,17,42.")
def gates(ckpt, prompt, layer, units, tokens, end, width, ascii, unknown):
    """Show an LSTM's forget/input/output gates (a GRU's update/reset gates) and its cell state over --prompt."""
    from charlm.views.gates import GateOptions, parse_units, render_gates

    ck, ids, console = _viewer_input(ckpt, prompt, unknown, width)
    if ck.model.has_attention:
        raise UserError(f"{ck.name} is a transformer: it has no gates; try 'charlm attn'")
    opts = GateOptions(layer=layer, units=parse_units(units) if units else None, tokens=tokens, end=end, ascii=ascii)
    render_gates(console, ck.model, ck.tokenizer, ids, opts)


# ---- comparison: eval, compare ------------------------------------------------------------------


@main.command("eval")
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


@main.command()
@click.argument("ckpts", nargs=-1, required=True, type=click.Path(path_type=str))
@click.option("--prompt", "-p", default="", help="Text every model continues [default: none].")
@config_options(SampleConfig, defaults={"max_tokens": 200}, only=("max_tokens", "temperature", "top_k", "top_p", "seed"))
@unknown_option
@click.option("--eval", "eval_file", type=click.Path(path_type=str), help="Also show each model's bits/char on this text.")
@click.option("--interactive", "-i", is_flag=True, help="A prompt loop: each prompt goes to every model.")
@device_option
def compare(ckpts, prompt, max_tokens, temperature, top_k, top_p, seed, unknown, eval_file, interactive, device):
    """Continue the same prompt with two or more checkpoints, side by side, then compare them in a table."""
    from charlm.comparison import Comparison
    from charlm.runtime import pick_device
    from charlm.views.compare import CompareRepl, CompareView
    from charlm.views.eval import EvalProgress

    if len(ckpts) < 2:
        raise UserError("compare needs at least two checkpoints (files or run directories)")
    settings = SampleConfig(temperature=temperature, top_k=top_k, top_p=top_p, max_tokens=max_tokens, seed=seed).validate()
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
    else:
        view.show(prompt)
