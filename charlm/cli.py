"""The command line: thin Click commands that validate input, call one function each and render the
result with Rich. Every user error is one line on stderr and a non-zero exit, never a traceback
(set CHARLM_DEBUG=1 to see one)."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import sys
import tempfile
from pathlib import Path
from typing import NoReturn

import click
from click.core import ParameterSource
from rich.console import Console
from rich.table import Table
from rich.text import Text

from charlm import checkpoint
from charlm.checkpoint import CheckpointError
from charlm.config import MODEL_KINDS, OPTIMIZERS, POSITIONS, PRECISIONS, PRESETS, ConfigError, ModelConfig, TrainConfig, parse_duration, preset
from charlm.data import CorpusError
from charlm.tokenizer import UnknownCharactersError
from charlm.views.text import safe_text

USER_ERRORS = (ConfigError, CorpusError, CheckpointError, UnknownCharactersError)


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
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.exceptions.Exit as e:
            sys.exit(e.exit_code)
        except click.exceptions.Abort:
            err_console().print("aborted")
            sys.exit(130)
        except click.ClickException as e:
            print_error(e.format_message())
            sys.exit(e.exit_code)
        except USER_ERRORS as e:
            print_error(str(e))
            sys.exit(1)
        except KeyboardInterrupt:
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


@click.group(cls=CharlmGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="charlm")
def main():
    """Train small character- and BPE-level language models (LSTM, GRU, Transformer) on any text file,
    then chat with them and look inside."""


# ---- train --------------------------------------------------------------------------------------

MODEL_FLAGS = {"layers": "n_layers", "d_model": "d_model", "heads": "n_heads", "context": "context",
               "dropout": "dropout", "positions": "positions"}
TRAIN_FLAGS = ("tokenizer", "vocab_size", "steps", "batch_size", "grad_accum", "lr", "optimizer", "muon_lr", "warmup", "weight_decay", "eval_interval",
               "eval_iters", "seed", "device", "precision", "compile", "sample_tokens")
# what may change when resuming; everything else would make "continue this run" untrue
RESUMABLE = {"steps", "max_time", "device", "precision", "compile", "eval_interval", "eval_iters", "sample_tokens"}


def _default_out(corpus: str, kind: str, tokenizer: str) -> Path:
    """checkpoints/<corpus>-<model>-<tokenizer>, numbered when that name is taken."""
    base = Path("checkpoints") / f"{Path(corpus).stem or 'corpus'}-{kind}-{tokenizer}"
    out, n = base, 2
    while (out / "last.pt").exists():
        out, n = base.with_name(f"{base.name}-{n}"), n + 1
    return out


def _latest_run(corpus: str, kind: str, tokenizer: str) -> Path:
    base = f"{Path(corpus).stem or 'corpus'}-{kind}-{tokenizer}"
    runs = [p for p in Path("checkpoints").glob(f"{base}*") if (p / "last.pt").exists()]
    if not runs:
        raise UserError(f"--resume found no run checkpoints/{base}*/last.pt: name the run with --out DIR")
    return max(runs, key=lambda p: (p / "last.pt").stat().st_mtime)


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


def _resume_configs(out: Path, given: dict, model_cfg: ModelConfig, train_cfg: TrainConfig):
    """The checkpoint's configs, with the flags given on the command line applied where that is safe."""
    last = out / "last.pt"
    if not last.exists():
        raise UserError(f"--resume: no checkpoint at {last}; train one first, or point --out at an existing run")
    state = checkpoint.load_raw(last)
    old_model = ModelConfig.from_dict(state["model_config"])
    old_train = TrainConfig.from_dict(state["train_config"])
    # a --preset given now stands for all of its sizes, as if each had been typed
    implied = set(MODEL_FLAGS) | {"batch_size", "lr"} if "preset_name" in given else set()
    for flag, field in MODEL_FLAGS.items():
        if (flag in given or flag in implied) and getattr(model_cfg, field) != getattr(old_model, field):
            source = "" if flag in given else " (from --preset)"
            raise UserError(
                f"--resume: this run was trained with --{flag.replace('_', '-')} {getattr(old_model, field)}, not "
                f"{getattr(model_cfg, field)}{source}; drop the flag, or start a new run with another --out"
            )
    if "model" in given and model_cfg.kind != old_model.kind:
        raise UserError(f"--resume: this run is a {old_model.kind}, not a {model_cfg.kind}; use another --out for a new run")
    for name in given | (implied & {"batch_size", "lr"}):
        if name in TRAIN_FLAGS or name == "max_time":
            new, old = getattr(train_cfg, name), getattr(old_train, name)
            if name in RESUMABLE:
                setattr(old_train, name, new)
            elif new != old:
                raise UserError(
                    f"--resume: this run was trained with --{name.replace('_', '-')} {old}, not {new}; "
                    f"only --steps, --max-time, --device, --precision, --compile and eval/sample settings may change"
                )
    if given & {"steps", "max_time"}:  # a new budget replaces the old one: --steps alone means no time limit
        old_train.steps, old_train.max_time = train_cfg.steps, train_cfg.max_time
    if state["step"] >= old_train.steps:
        raise UserError(f"--resume: {out} is already at step {state['step']}; give a larger --steps to train on")
    if old_train.max_time and state["train_seconds"] >= old_train.max_time:
        raise UserError(
            f"--resume: {out} has already trained for {state['train_seconds']:.0f}s; "
            "give a larger --max-time (the total) or --steps to train on"
        )
    return old_model, old_train


@main.command()
@click.argument("corpus", type=click.Path(path_type=str))
@click.option("--model", type=click.Choice(MODEL_KINDS), default="transformer", show_default=True, help="Model family.")
@click.option("--tokenizer", type=click.Choice(["char", "bpe"]), default="char", show_default=True)
@click.option("--vocab-size", type=int, default=1024, show_default=True, help="BPE vocabulary size.")
@click.option("--preset", "preset_name", type=click.Choice(PRESETS), default=None,
              help="Model size and batch/lr defaults [default: tiny on CPU, small on CUDA].")
@click.option("--layers", type=int, help="Number of layers.")
@click.option("--d-model", type=int, help="Transformer width; LSTM/GRU hidden size.")
@click.option("--heads", type=int, help="Attention heads (transformer).")
@click.option("--context", type=int, help="Context length in tokens.")
@click.option("--dropout", type=float)
@click.option("--positions", type=click.Choice(POSITIONS), default="rope", show_default=True, help="Transformer positions.")
@click.option("--steps", type=int, help="Total optimizer steps [default: as many as --max-time allows].")
@click.option("--max-time", type=str, help="Time budget, e.g. 90s, 10m, 1h [default: 2m unless --steps].")
@click.option("--batch-size", type=int, help="Sequences per micro-batch and process.")
@click.option("--grad-accum", type=int, default=1, show_default=True,
              help="Micro-batches per optimizer step: effective batch = batch size × grad accum × processes.")
@click.option("--lr", type=float, help="Peak learning rate.")
@click.option("--optimizer", type=click.Choice(OPTIMIZERS), default="muon", show_default=True,
              help="muon: Muon for hidden matrices + AdamW for the rest; adamw: AdamW for all.")
@click.option("--muon-lr", type=float, default=0.02, show_default=True, help="Muon's peak learning rate.")
@click.option("--warmup", type=int, default=100, show_default=True, help="Warmup steps.")
@click.option("--weight-decay", type=float, default=0.1, show_default=True)
@click.option("--eval-interval", type=int, default=250, show_default=True, help="Steps between evaluations.")
@click.option("--eval-iters", type=int, default=20, show_default=True, help="Batches per evaluation.")
@click.option("--sample-tokens", type=int, default=200, show_default=True, help="Length of the samples shown (0: none).")
@click.option("--seed", type=int, default=1337, show_default=True)
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True)
@click.option("--precision", type=click.Choice(PRECISIONS), default="auto", show_default=True,
              help="Autocast dtype: auto uses bf16 on GPUs and on CPUs with native bf16, else fp32.")
@click.option("--compile/--no-compile", default=False, show_default=True, help="torch.compile the model.")
@click.option("--out", type=click.Path(path_type=Path), help="Run directory [default: checkpoints/<corpus>-<model>-<tokenizer>].")
@click.option("--resume", is_flag=True, help="Continue the run in --out from its last checkpoint.")
@click.option("--nproc", type=int, help="Train with N processes (DistributedDataParallel): starts torchrun for you.")
@click.pass_context
def train(ctx, corpus, model, tokenizer, vocab_size, preset_name, out, resume, nproc, **flags):
    """Train a language model on CORPUS (a UTF-8 text file).

    Several processes: charlm train CORPUS --nproc N, or torchrun --nproc-per-node N -m charlm train CORPUS."""
    from charlm import distributed
    from charlm import train as trainer
    from charlm.views.progress import TrainView, sample_text

    given = {name for name in ctx.params if ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE}
    device_guess = "cuda" if flags["device"] == "cuda" else ("cuda" if flags["device"] == "auto" and _has_cuda() else "cpu")
    model_preset, train_preset = preset(model, preset_name or ("small" if device_guess == "cuda" else "tiny"))
    model_cfg = ModelConfig(kind=model, **model_preset)
    for flag, field in MODEL_FLAGS.items():
        if flags.get(flag) is not None:
            setattr(model_cfg, field, flags[flag])
    try:
        max_time = parse_duration(flags["max_time"]) if flags["max_time"] is not None else None
    except ConfigError as e:
        raise UserError(f"--max-time: {e}") from None
    steps = flags["steps"]
    if steps is None and max_time is None:
        max_time = 120.0
    # `is None`, never `or`: --steps 0 or --lr 0 must be refused, not replaced by a default
    train_cfg = TrainConfig(
        tokenizer=tokenizer, vocab_size=vocab_size, steps=1_000_000_000 if steps is None else steps, max_time=max_time,
        batch_size=_given(flags["batch_size"], train_preset["batch_size"]), grad_accum=flags["grad_accum"],
        lr=_given(flags["lr"], train_preset["lr"]),
        optimizer=flags["optimizer"], muon_lr=flags["muon_lr"], warmup=flags["warmup"], weight_decay=flags["weight_decay"], eval_interval=flags["eval_interval"],
        eval_iters=flags["eval_iters"], seed=flags["seed"], device=flags["device"], precision=flags["precision"], compile=flags["compile"],
        sample_tokens=flags["sample_tokens"],
    )
    train_cfg.validate()  # the flags as given, before a checkpoint is even looked at
    if resume:
        out = out or _latest_run(corpus, model, tokenizer)
        model_cfg, train_cfg = _resume_configs(out, given, model_cfg, train_cfg)
    else:
        out = out or _default_out(corpus, model, tokenizer)
        if (out / "last.pt").exists():
            raise UserError(f"{out} already holds a run: add --resume to continue it, or choose another --out")
        model_cfg.vocab_size = 2  # the tokenizer sets the real size; check everything else before any work
        model_cfg.validate()
    train_cfg.validate()
    _check_writable(out)
    if nproc is not None:
        if distributed.env().enabled:
            raise UserError("--nproc starts torchrun itself: drop it when running under torchrun")
        if nproc < 1:
            raise UserError(f"--nproc must be at least 1, got {nproc}")
        if nproc > 1:  # everything above was checked once, here; now the same command, N times
            _exec_torchrun(nproc, out, resume, device_guess)

    # every rank trains; only rank 0 shows it (the others would print the same lines again)
    me = distributed.env()
    console = Console(highlight=False, soft_wrap=True, quiet=not me.is_main)  # soft_wrap: no cuts at 80 columns in a pipe
    view = TrainView(console, sample_tokens=train_cfg.sample_tokens if me.is_main else 0)
    try:
        run = trainer.Trainer(corpus, model_cfg, train_cfg, out, resume=resume, on_event=view)
        result = run.fit()
    except trainer.TrainingInterrupted as e:
        view.close()
        console.print(Text.assemble("\n", ("interrupted", "yellow"), f" at step {e.result.step}; saved {out}/last.pt"))
        # quoted for the shell, and never read as markup: paths may hold spaces or [brackets]
        console.print(f"resume with: charlm train {shlex.quote(corpus)} --out {shlex.quote(str(out))} --resume",
                      markup=False, highlight=False)
        sys.exit(130)
    except trainer.TrainingDiverged as e:
        view.close()
        raise UserError(str(e)) from None
    finally:
        view.close()
        distributed.close()
    final = None
    if train_cfg.sample_tokens and me.is_main:
        final = sample_text(run.model.eval(), run.tokenizer, train_cfg.sample_tokens, seed=train_cfg.seed)
    view.finish(result, final)


def _exec_torchrun(nproc: int, out: Path, resume: bool, device: str) -> NoReturn:
    """Replace this process by torchrun (PyTorch's launcher) running this same command in nproc
    processes: the same arguments minus --nproc, with the run directory made explicit."""
    import torch

    if device == "cuda" and nproc > torch.cuda.device_count():
        raise UserError(f"--nproc {nproc}: only {torch.cuda.device_count()} GPU(s) visible; use one process per GPU")
    if resume:
        trained_on = checkpoint.load_raw(out / "last.pt").get("distributed", {}).get("world_size", 1)
        if trained_on != nproc:
            raise UserError(f"--resume: {out} was trained with {trained_on} process(es), not {nproc}; resume it with --nproc {trained_on}")
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


def _given(value, default):
    return default if value is None else value


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


# ---- info ---------------------------------------------------------------------------------------


def _info(ckpt: checkpoint.Checkpoint) -> dict:
    d, m = ckpt.data, ckpt.model_config
    corpus = d.get("corpus", {})
    return {
        "path": str(ckpt.path),
        "run": ckpt.name,
        "model": m.kind,
        "layers": m.n_layers,
        "d_model": m.d_model,
        "heads": m.n_heads if m.kind == "transformer" else None,
        "context": m.context,
        "positions": m.positions if m.kind == "transformer" else None,
        "params": d.get("params"),
        "tokenizer": ckpt.tokenizer.kind,
        "vocab_size": ckpt.tokenizer.vocab_size,
        "steps": d["step"],
        "train_seconds": round(d["train_seconds"], 2),
        "best_val_loss": d["best_val_loss"] if d["best_val_loss"] != float("inf") else None,
        "best_val_bpc": d["best_val_bpc"] if d["best_val_bpc"] != float("inf") else None,
        "corpus": corpus.get("name"),
        "corpus_sha256": corpus.get("sha256"),
        "device": d.get("device"),
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
    """The sampling flags shared by sample and chat."""
    options = [
        click.option("--max-tokens", "-n", type=int, default=max_tokens, show_default=True, help="New tokens to generate."),
        click.option("--temperature", "-t", type=float, default=0.8, show_default=True, help="0: greedy."),
        click.option("--top-k", type=int, default=0, show_default=True, help="Keep the k most likely tokens (0: off)."),
        click.option("--top-p", type=float, default=1.0, show_default=True, help="Nucleus: keep tokens up to this probability (1: off)."),
        click.option("--repetition-penalty", type=float, default=1.0, show_default=True, help=">1 discourages repeating tokens."),
        click.option("--stop", multiple=True, help=r"Stop at this text (cut off); repeatable; \n and \t are escapes."),
        click.option("--seed", type=int, help="Same seed, same text [default: random]."),
        click.option("--no-cache", is_flag=True, help="Recompute the whole text for every token (slow: to compare)."),
        click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="cpu", show_default=True),
    ]

    def decorate(f):
        for option in reversed(options):
            f = option(f)
        return f

    return decorate


def _settings(max_tokens, temperature, top_k, top_p, repetition_penalty, stop, seed):
    from charlm.generate import SampleConfig
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
@click.option("--unknown", type=click.Choice(["error", "drop", "replace"]), default="error", show_default=True,
              help="Prompt characters a char model never saw.")
@click.option("--echo/--no-echo", default=True, show_default=True, help="Print the prompt before its continuation.")
@click.option("--stats", is_flag=True, help="One JSON line on stderr: tokens, seconds, tokens_per_s, ttft_ms.")
def sample(ckpt, prompt, prompt_file, max_tokens, temperature, top_k, top_p, repetition_penalty, stop, seed, no_cache,
           device, num_samples, unknown, echo, stats):
    """Continue a prompt with CKPT, streaming plain text to stdout (pipe-friendly)."""
    from charlm.generate import Generator
    from charlm.train import pick_device
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
@click.option("--unknown", type=click.Choice(["drop", "replace", "error"]), default="drop", show_default=True,
              help="Prompt characters a char model never saw: warn and drop them, replace them, or refuse the prompt.")
def chat(ckpt, max_tokens, temperature, top_k, top_p, repetition_penalty, stop, seed, no_cache, device, mode, unknown):
    """Talk to CKPT: a REPL that streams each continuation as it is generated (/help inside)."""
    from charlm.train import pick_device
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
        click.option("--unknown", type=click.Choice(["error", "drop", "replace"]), default="error", show_default=True,
                     help="Characters the model never saw (char models)."),
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
@click.option("--unknown", type=click.Choice(["error", "drop"]), default="error", show_default=True,
              help="Characters a char model never saw: stop with an error, or leave them out of the score.")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def eval_(ckpt, file, stride, unknown, device, as_json):
    """Loss, perplexity, bits per character and per byte of CKPT on FILE (any UTF-8 text), over the
    whole file: the Transformer reads it in overlapping windows of its context, an LSTM/GRU in one pass."""
    from charlm.evaluate import evaluate_file
    from charlm.train import pick_device
    from charlm.views.compare import EvalProgress, eval_summary, render_eval

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
@click.option("--max-tokens", "-n", type=int, default=200, show_default=True, help="New tokens per model.")
@click.option("--temperature", "-t", type=float, default=0.8, show_default=True, help="0: greedy.")
@click.option("--top-k", type=int, default=0, show_default=True, help="0: off.")
@click.option("--top-p", type=float, default=1.0, show_default=True, help="1: off.")
@click.option("--seed", type=int, help="The same seed for every model [default: a random one, shown].")
@click.option("--unknown", type=click.Choice(["error", "drop", "replace"]), default="error", show_default=True,
              help="Prompt characters a char model never saw: note it and skip that model, drop them, or replace them.")
@click.option("--eval", "eval_file", type=click.Path(path_type=str), help="Also show each model's bits/char on this text.")
@click.option("--interactive", "-i", is_flag=True, help="A prompt loop: each prompt goes to every model.")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="cpu", show_default=True)
def compare(ckpts, prompt, max_tokens, temperature, top_k, top_p, seed, unknown, eval_file, interactive, device):
    """Continue the same prompt with two or more checkpoints, side by side, then compare them in a table."""
    from charlm.generate import SampleConfig
    from charlm.train import pick_device
    from charlm.views.compare import Comparison, repl

    if len(ckpts) < 2:
        raise UserError("compare needs at least two checkpoints (files or run directories)")
    settings = SampleConfig(temperature=temperature, top_k=top_k, top_p=top_p, max_tokens=max_tokens, seed=seed).validate()
    device = pick_device(device)
    loaded = [checkpoint.load(c, device=device) for c in ckpts]  # a bad one: CheckpointError naming it
    comparison = Comparison(loaded, settings, Console(highlight=False), unknown=unknown)
    if eval_file:
        comparison.evaluate(eval_file, err_console())
        comparison.notes()  # e.g. a char model that cannot read the file: said once, up front
    if interactive:
        repl(comparison)
    else:
        comparison.show(prompt)


# ---- lab ----------------------------------------------------------------------------------------


@main.command()
@click.argument("name", required=False)
@click.argument("ckpt", required=False, type=click.Path(path_type=str))
@click.option("--quick", is_flag=True, help="Test size: seconds instead of minutes.")
@click.option("--seed", type=int, default=0, show_default=True, help="Same seed, same table.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object: experiment, settings, results, reading.")
@click.option("--out", type=click.Path(path_type=Path),
              help="Where the lab's models are saved, as normal runs [default: checkpoints/lab].")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="cpu", show_default=True,
              help="Where the lab trains.")
@click.option("--text", "text_file", type=click.Path(path_type=str),
              help="ablate: the text scored [default: the run's corpus.txt].")
@click.option("--plain", is_flag=True, help="A chart without colours (series told apart by their markers).")
def lab(name, ckpt, quick, seed, as_json, out, device, text_file, plain):
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
        result = run_experiment(name, ckpt=ckpt, quick=quick, seed=seed, device=device, out=out or LAB_DIR, text=text_file,
                                progress=status.update if not as_json else (lambda message: None))
    if as_json:
        click.echo(json.dumps(result.to_dict()))
    else:
        render_lab(console, result, color=not plain)
        if result.experiment == "copy":  # show why, with the viewers
            d = result.details
            render_copy_views(console, d, checkpoint.load(d["transformer_run"]), checkpoint.load(d["lstm_run"]), ascii=plain)
