"""The command line: thin Click commands that validate input, call one function each and render the
result with Rich. Every user error is one line on stderr and a non-zero exit, never a traceback
(set CHARLM_DEBUG=1 to see one)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click
from click.core import ParameterSource
from rich.console import Console
from rich.table import Table

from charlm import checkpoint
from charlm.checkpoint import CheckpointError
from charlm.config import MODEL_KINDS, POSITIONS, PRESETS, ConfigError, ModelConfig, TrainConfig, parse_duration, preset
from charlm.data import CorpusError
from charlm.tokenizer import UnknownCharactersError

USER_ERRORS = (ConfigError, CorpusError, CheckpointError, UnknownCharactersError)


class UserError(click.ClickException):
    """A one-line error: what was wrong and what to do."""


def err_console() -> Console:
    return Console(stderr=True, highlight=False)


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
            err_console().print(f"[red]error:[/] {e.format_message()}", markup=True, soft_wrap=True)
            sys.exit(e.exit_code)
        except USER_ERRORS as e:
            err_console().print(f"[red]error:[/] {e}", markup=True, soft_wrap=True)
            sys.exit(1)
        except KeyboardInterrupt:
            sys.exit(130)
        except Exception as e:  # a bug: still one line, with a way to see the traceback
            if os.environ.get("CHARLM_DEBUG"):
                raise
            err_console().print(
                f"[red]error:[/] unexpected {type(e).__name__}: {e} (run with CHARLM_DEBUG=1 for the traceback, and please report it)",
                soft_wrap=True,
            )
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
TRAIN_FLAGS = ("tokenizer", "vocab_size", "steps", "batch_size", "lr", "warmup", "weight_decay", "eval_interval",
               "eval_iters", "seed", "device", "compile", "sample_tokens")
# what may change when resuming; everything else would make "continue this run" untrue
RESUMABLE = {"steps", "max_time", "device", "compile", "eval_interval", "eval_iters", "sample_tokens"}


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
    if not os.access(probe, os.W_OK | os.X_OK):
        raise UserError(f"cannot write to {out}: {probe} is not writable; choose another --out")


def _resume_configs(out: Path, given: dict, model_cfg: ModelConfig, train_cfg: TrainConfig):
    """The checkpoint's configs, with the flags given on the command line applied where that is safe."""
    last = out / "last.pt"
    if not last.exists():
        raise UserError(f"--resume: no checkpoint at {last}; train one first, or point --out at an existing run")
    state = checkpoint.load_raw(last)
    old_model = ModelConfig.from_dict(state["model_config"])
    old_train = TrainConfig.from_dict(state["train_config"])
    for flag, field in MODEL_FLAGS.items():
        if flag in given and getattr(model_cfg, field) != getattr(old_model, field):
            raise UserError(
                f"--resume: this run was trained with --{flag.replace('_', '-')} {getattr(old_model, field)}, not "
                f"{getattr(model_cfg, field)}; drop the flag, or start a new run with another --out"
            )
    if "model" in given and model_cfg.kind != old_model.kind:
        raise UserError(f"--resume: this run is a {old_model.kind}, not a {model_cfg.kind}; use another --out for a new run")
    for name in given:
        if name in TRAIN_FLAGS or name == "max_time":
            new, old = getattr(train_cfg, name), getattr(old_train, name)
            if name in RESUMABLE:
                setattr(old_train, name, new)
            elif new != old:
                raise UserError(
                    f"--resume: this run was trained with --{name.replace('_', '-')} {old}, not {new}; "
                    f"only --steps, --max-time, --device, --compile and eval/sample settings may change"
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
@click.option("--batch-size", type=int)
@click.option("--lr", type=float, help="Peak learning rate.")
@click.option("--warmup", type=int, default=100, show_default=True, help="Warmup steps.")
@click.option("--weight-decay", type=float, default=0.1, show_default=True)
@click.option("--eval-interval", type=int, default=250, show_default=True, help="Steps between evaluations.")
@click.option("--eval-iters", type=int, default=20, show_default=True, help="Batches per evaluation.")
@click.option("--sample-tokens", type=int, default=200, show_default=True, help="Length of the samples shown (0: none).")
@click.option("--seed", type=int, default=1337, show_default=True)
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True)
@click.option("--compile/--no-compile", default=False, show_default=True, help="torch.compile the model.")
@click.option("--out", type=click.Path(path_type=Path), help="Run directory [default: checkpoints/<corpus>-<model>-<tokenizer>].")
@click.option("--resume", is_flag=True, help="Continue the run in --out from its last checkpoint.")
@click.pass_context
def train(ctx, corpus, model, tokenizer, vocab_size, preset_name, out, resume, **flags):
    """Train a language model on CORPUS (a UTF-8 text file)."""
    from charlm import train as trainer
    from charlm.views.progress import TrainView, sample_text

    given = {name for name in ctx.params if ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE}
    device_guess = "cuda" if flags["device"] == "cuda" else ("cuda" if flags["device"] == "auto" and _has_cuda() else "cpu")
    model_preset, train_preset = preset(model, preset_name or ("small" if device_guess == "cuda" else "tiny"))
    model_cfg = ModelConfig(kind=model, **model_preset)
    for flag, field in MODEL_FLAGS.items():
        if flags.get(flag) is not None:
            setattr(model_cfg, field, flags[flag])
    max_time = parse_duration(flags["max_time"]) if flags["max_time"] else None
    steps = flags["steps"]
    if steps is None and max_time is None:
        max_time = 120.0
    train_cfg = TrainConfig(
        tokenizer=tokenizer, vocab_size=vocab_size, steps=steps or 1_000_000_000, max_time=max_time,
        batch_size=flags["batch_size"] or train_preset["batch_size"], lr=flags["lr"] or train_preset["lr"],
        warmup=flags["warmup"], weight_decay=flags["weight_decay"], eval_interval=flags["eval_interval"],
        eval_iters=flags["eval_iters"], seed=flags["seed"], device=flags["device"], compile=flags["compile"],
        sample_tokens=flags["sample_tokens"],
    )
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

    console = Console(highlight=False)
    view = TrainView(console, sample_tokens=train_cfg.sample_tokens)
    try:
        run = trainer.Trainer(corpus, model_cfg, train_cfg, out, resume=resume, on_event=view)
        result = run.fit()
    except trainer.TrainingInterrupted as e:
        view.close()
        console.print(f"\n[yellow]interrupted[/] at step {e.result.step}; saved {out}/last.pt")
        console.print(f"resume with: charlm train {corpus} --out {out} --resume", highlight=False)
        sys.exit(130)
    except trainer.TrainingDiverged as e:
        view.close()
        raise UserError(str(e)) from None
    finally:
        view.close()
    final = None
    if train_cfg.sample_tokens:
        final = sample_text(run.model.eval(), run.tokenizer, train_cfg.sample_tokens, seed=train_cfg.seed)
    view.finish(result, final)


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
    table = Table(title=f"{info['run']}", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    size = f"{info['layers']} layers × {info['d_model']}"
    if info["heads"]:
        size += f", {info['heads']} heads, {info['positions']} positions"
    table.add_row("model", f"{info['model']} ({size}, context {info['context']})")
    table.add_row("parameters", f"{info['params']:,}" if info["params"] else "?")
    table.add_row("tokenizer", f"{info['tokenizer']}, {info['vocab_size']} tokens")
    table.add_row("trained", f"{info['steps']} steps in {info['train_seconds']:.1f}s on {info['device']}")
    if info["best_val_loss"] is not None:
        table.add_row("best val", f"{info['best_val_loss']:.4f} nats/token · {info['best_val_bpc']:.3f} bits/char")
    table.add_row("corpus", f"{info['corpus']} (sha256 {str(info['corpus_sha256'])[:12]}…)")
    table.add_row("file", info["path"])
    Console(highlight=False).print(table)


# ---- generation: sample, chat -------------------------------------------------------------------

# ---- viewers: attn, gates -----------------------------------------------------------------------

# ---- comparison: eval, compare ------------------------------------------------------------------
