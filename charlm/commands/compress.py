"""`charlm compress` as functions: compress() writes a smaller run and measures it against the original;
report() measures every method at a few settings (the mechanisms: charlm.compress)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from charlm import files
from charlm.compress import (
    Measured,
    bits_per_weight,
    build,
    compare_to,
    drop_heads,
    drop_units,
    head_importance,
    log_probs,
    scored_text,
    stored,
    tokens_per_s,
    unit_importance,
)
from charlm.config import ModelConfig
from charlm.data import bits_per_char
from charlm.errors import ConfigError
from charlm.models import config_params
from charlm.options import CompressOptions
from charlm.storage import checkpoint
from charlm.storage.runs import RunLock, check_writable
from charlm.training.stopping import RunSignals, SetupInterrupted, stop_signals

# ---- the commands ----------------------------------------------------------------------------------------


@dataclass
class Compressed:
    original: Measured
    result: Measured
    path: Path
    source: str
    dropped: list  # (layer, head or unit) taken out


@dataclass
class Report:
    rows: list[Measured]
    source: str
    tokens: int
    reading: list[str]
    ckpt: str

    def to_dict(self) -> dict:
        return {
            "ckpt": self.ckpt,
            "text": self.source,
            "tokens": self.tokens,
            "rows": [r.to_dict() for r in self.rows],
            "reading": self.reading,
        }


MIN_TOKENS = 64  # fewer scored tokens measure nothing: one token "recommended" int4 with a head dropped

Progress = Callable[[str, int, int], None]  # (what is under way, phases done, phases in all)


def _quiet(what: str, done: int, total: int) -> None:
    pass


class _Session:
    """The original model, the scored text and its reference log-probabilities, and the importances (measured
    once, on the first eighth of the text). Each slow phase is announced to progress(what, done, total)."""

    def __init__(self, ckpt: str, opts: CompressOptions, progress: Progress, phases: int):
        self.progress, self.done, self.total = progress, 0, phases
        self.step(f"loading {ckpt}")
        self.ck = checkpoint.load(ckpt)
        self.text = scored_text(self.ck, opts.text, opts.tokens)
        scored = int(self.text.rows[:, 1:].numel())
        if scored < MIN_TOKENS:
            raise ConfigError(
                f"the text to score ({self.text.source}) gives {scored} token{'s' * (scored != 1)} to score: at least "
                f"{MIN_TOKENS} are needed to measure anything; give a longer one with --text FILE"
            )
        self.step(f"scoring the original on {scored:,} tokens")
        self.reference = log_probs(self.ck.model, self.text.rows)
        self.probe = self.text.rows[: max(1, len(self.text.rows) // 8)]
        self._heads = self._units = None
        self.state = {k: v.detach() for k, v in self.ck.model.state_dict().items()}

    def step(self, what: str) -> None:
        """Announce the next phase."""
        self.progress(what, self.done, self.total)
        self.done += 1

    @property
    def cfg(self) -> ModelConfig:
        return self.ck.model_config

    def pruned(self, heads: int, units: int, chance: bool = False) -> tuple[ModelConfig, dict, dict, list]:
        """The model without `heads` heads or `units` units of each layer: the least important, or (chance) a
        random choice, the baseline that says what measuring importance buys."""
        cfg, state, dropped, what = self.cfg, self.state, [], {}
        shuffled = np.random.default_rng(0).random
        can = self.ck.model.capabilities
        if heads:
            if "attention" not in can:
                other = "; use --drop-units" if "gates" in can else ""
                raise ConfigError(f"--drop-heads: {self.ck.path} is a {cfg.kind} model, which has no heads{other}")
            if self._heads is None:
                self.step(f"measuring the importance of {cfg.n_layers * cfg.n_heads} heads")
                self._heads = head_importance(self.ck.model, self.probe)
            ranking = shuffled(self._heads.shape) if chance else self._heads
            cfg, state, dropped = drop_heads(cfg, state, ranking, heads)
            what = {"heads_dropped": heads, "dropped": [list(d) for d in dropped]}
        if units:
            if "gates" not in can:
                other = "; use --drop-heads" if "attention" in can else ""
                raise ConfigError(f"--drop-units: {self.ck.path} is a {cfg.kind} model, which has no units{other}")
            if self._units is None:
                self.step(f"measuring the importance of {cfg.n_layers * cfg.hidden_size} units")
                self._units = unit_importance(self.ck.model, self.probe)
            ranking = shuffled(self._units.shape) if chance else self._units
            cfg, state, dropped = drop_units(cfg, state, ranking, units)
            what = {"units_dropped": units, "dropped": [list(d) for d in dropped]}
        return cfg, state, what, dropped

    def write(
        self, to: Path, bits: int, heads: int, units: int, name: str, chance: bool = False
    ) -> tuple[Measured, list]:
        """Write the run into to/best.safetensors, load it back through the safe loader as every command does, score it,
        and write it again with its own score (`to` is a scratch directory: compress() moves the scored file
        into place in one rename, so no unscored best.safetensors is ever where a command would open it)."""
        cfg, state, what, dropped = self.pruned(heads, units, chance)
        self.step(f"{name}: writing, loading back and scoring")
        weights, path = stored(state, bits), to / checkpoint.BEST
        record = _record(self.ck, bits, what)
        checkpoint.save(build(self.ck, to.name, bits, cfg, weights, what, None, record), path)
        ck = checkpoint.load(path)
        nats, top1, kl = compare_to(self.reference, log_probs(ck.model, self.text.rows), self.text.rows)
        bpc = bits_per_char(nats, self.text.chars_per_token)
        checkpoint.save(build(self.ck, to.name, bits, cfg, weights, what, (nats, bpc), record), path)
        params = config_params(cfg)
        m = Measured(
            name, params, bits_per_weight(*weights, params), path.stat().st_size, bpc, top1, kl, tokens_per_s(ck)
        )
        return m, dropped


def _record(ck, bits: int, what: dict) -> dict:
    """The `compressed` record: the steps that made the run, the source's own first (checkpoint.compression_steps
    reads an older single-step record as one step)."""
    step = {"from": str(ck.path), "bits": bits, **what}
    return {"steps": [*checkpoint.compression_steps(ck.saved.compressed), step]}


def _label(bits: int, heads: int, units: int, chance: bool = False) -> str:
    words = [{32: "float32", 16: "bf16", 8: "int8", 4: "int4"}[bits]]
    if heads:
        words.append(f"-{heads} head{'s' * (heads > 1)}/layer")
    if units:
        words.append(f"-{units} unit{'s' * (units > 1)}/layer")
    return " ".join(words) + (" (random)" if chance else "")


def default_to(ckpt: str, opts: CompressOptions) -> Path:
    """Where a compressed run goes without --to: beside the run, named after it and what was done
    (checkpoints/tt-int4, tt-int8-drop1h, tt-drop8u), numbered when that name is taken (never over a run)."""
    run = checkpoint.resolve(ckpt).parent
    run = run if run.name else run.resolve()  # (a checkpoint in the current directory: name the directory)
    parts = [{32: "", 16: "bf16", 8: "int8", 4: "int4"}[opts.bits]]
    parts += [
        f"drop{opts.drop_heads}h" if opts.drop_heads else "",
        f"drop{opts.drop_units}u" if opts.drop_units else "",
    ]
    base = run.with_name(f"{run.name}-{'-'.join(p for p in parts if p) or 'float32'}")
    out, n = base, 2
    while os.path.lexists(out):
        out, n = base.with_name(f"{base.name}-{n}"), n + 1
    return out


def _check_target(to: Path) -> None:
    """--to must be a directory that holds no run, or nothing yet: never a link (a run would be written
    wherever it points), a file, a FIFO or a device."""
    why = files.not_regular(to)
    if why == "a symbolic link":
        raise ConfigError(f"--to {to} is a symbolic link: give the directory itself, or a new one")
    if why not in (None, "a directory") or why is None and os.path.lexists(to):
        raise ConfigError(f"--to {to} is {why or 'a file'}, not a directory: give a new directory")
    if (to / checkpoint.BEST).exists() or (to / checkpoint.LAST).exists():
        raise ConfigError(f"--to {to} already holds a run: give a new directory")


SCRATCH = ".compress-"  # the scratch directories inside --to, named so: one a killed compress left is removed


def _remove_scratch(to: Path) -> None:
    for left in to.glob(SCRATCH + "*"):
        if left.is_dir() and not left.is_symlink():
            shutil.rmtree(left, ignore_errors=True)


def compress(ckpt: str, opts: CompressOptions, progress: Progress = _quiet) -> Compressed:
    """Write the compressed run to opts.to (default: default_to) as its best.safetensors, and measure it and the original
    on the same text. The run directory is held with the run lock train takes (a second compress, or a training,
    into it is refused). Everything is written into a scratch directory inside it and the scored best.safetensors moved
    into place in one rename: Ctrl-C, SIGTERM, SIGHUP or a full disk leave the directory as it was (or not
    there), with no temp file; SetupInterrupted says which signal stopped it."""
    to = Path(opts.to) if opts.to is not None else default_to(ckpt, opts)
    _check_target(to)
    check_writable(to)
    signals = RunSignals(*stop_signals())
    with signals:  # a signal is an exception here: the finally blocks below clean up
        lock = RunLock(to, "charlm command")
        try:
            _check_target(to)  # again, under the lock: another compress may have finished in it since
            _remove_scratch(to)  # a killed compress's (the lock says none is running)
            s = _Session(ckpt, opts, progress, phases=4 + bool(opts.drop_heads or opts.drop_units))
            with tempfile.TemporaryDirectory(dir=to, prefix=SCRATCH) as tmp:
                original, _ = s.write(Path(tmp) / "original", 32, 0, 0, "original")
                label = _label(opts.bits, opts.drop_heads, opts.drop_units)
                result, dropped = s.write(Path(tmp) / to.name, opts.bits, opts.drop_heads, opts.drop_units, label)
                _check_signals(signals)
                with signals.deferring(), signals.holding():  # from here a signal waits: the run is whole
                    os.replace(Path(tmp) / to.name / checkpoint.BEST, to / checkpoint.BEST)
        except files.WriteError as e:  # (named after a scratch file: say where the run was going)
            why = "no space left on device" if e.full else f"cannot write {e.path.name} ({e})"
            raise files.WriteError(f"{why} writing {to}: nothing was written there", to, e.full) from None
        except OSError as e:
            raise files.write_error(to / checkpoint.BEST, e) from None
        finally:  # (a signal may come between the scratch directory's mkdir and its context manager)
            _remove_scratch(to)
            lock.release()
    return Compressed(original, result, to, s.text.source, dropped)


def report(ckpt: str, opts: CompressOptions, progress: Progress = _quiet) -> Report:
    """Every method at a few settings: bf16, int8, int4, then heads (Transformer) or units (LSTM/GRU) dropped
    from 1 (an eighth of the units) up to half; each written, loaded back and measured. Writes nothing that stays
    (a signal stops it as compress's does: its scratch directory goes with it)."""
    signals = RunSignals(*stop_signals())
    with signals:
        rep = _report(ckpt, opts, progress)
        _check_signals(signals)
    return rep


def _check_signals(signals: RunSignals) -> None:
    """SetupInterrupted if a signal came: its exception may have been swallowed on its way up (by a library's
    `except Exception` around an import it tries), and the work carried on."""
    if signals.requested:
        raise SetupInterrupted(signals.signum)


def _settings(cfg: ModelConfig, model) -> list[tuple[int, int, int, bool]]:
    settings = [(32, 0, 0, False), (16, 0, 0, False), (8, 0, 0, False), (4, 0, 0, False)]
    if "prune" not in model.capabilities:
        pass  # nothing can be dropped (an ALiBi model's heads; a family without parts to prune)
    elif model.PART == "head":
        settings += [(32, k, 0, False) for k in range(1, cfg.n_heads // 2 + 1)]
        settings += [(32, 1, 0, True), (8, 1, 0, False), (4, 1, 0, False)] if cfg.n_heads >= 2 else []
    else:
        H = cfg.hidden_size
        steps = sorted({max(1, H * i // 8) for i in range(1, 5)} - {0})
        settings += [(32, 0, k, False) for k in steps if k < H]
        if steps[0] < H:
            settings += [(32, 0, steps[0], True), (8, 0, steps[0], False), (4, 0, steps[0], False)]
    return settings


def _report(ckpt: str, opts: CompressOptions, progress: Progress) -> Report:
    s = _Session(ckpt, opts, progress, phases=0)  # (0: not known until the model is loaded)
    settings = _settings(s.cfg, s.ck.model)
    s.total = s.done + len(settings) + any(h or u for _, h, u, _ in settings)
    rows = []
    with tempfile.TemporaryDirectory(prefix="charlm" + SCRATCH) as tmp:
        for i, (bits, heads, units, chance) in enumerate(settings):
            where = Path(tmp) / str(i)
            rows.append(s.write(where, bits, heads, units, _label(bits, heads, units, chance), chance)[0])
            os.remove(where / checkpoint.BEST)
    s.progress("done", s.total, s.total)
    return Report(rows, s.text.source, int(s.text.rows[:, 1:].numel()), reading(rows), str(s.ck.path))


def reading(rows: list[Measured]) -> list[str]:
    """What the table says, computed from its numbers: the smallest file within 0.01 and within 0.10 bits/char
    of the original, and where quality falls off (the first setting, largest first, more than 0.10 worse)."""
    base = rows[0]
    out = []
    for within in (0.01, 0.10):
        fits = [r for r in rows if r.bpc - base.bpc <= within]
        best = min(fits, key=lambda r: r.file_bytes)
        out.append(
            f"smallest within +{within:.2f} bits/char: {best.name}, {best.file_bytes / base.file_bytes:.0%} of the "
            f"float32 file ({best.bpc - base.bpc:+.3f} bits/char, top-1 agreement {best.top1:.1%})"
        )
    for r in rows:  # what measuring importance bought over a random choice of the same size
        if r.name.endswith(" (random)"):
            measured = next(m for m in rows if m.name == r.name.removesuffix(" (random)"))
            out.append(
                f"{measured.name}: {measured.bpc - base.bpc:+.3f} bits/char by measured importance, "
                f"{r.bpc - base.bpc:+.3f} at random"
            )
    worse = [r for r in rows if r.bpc - base.bpc > 0.10]
    if worse:
        names = ", ".join(f"{r.name} ({r.bpc - base.bpc:+.2f})" for r in worse)
        out.append(f"more than +0.10 bits/char: {names}")
    else:
        out.append("no setting costs more than +0.10 bits/char")
    return out
