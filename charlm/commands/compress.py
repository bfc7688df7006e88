"""`charlm compress` as functions: compress() writes a smaller run and measures it against the original;
report() measures every method at a few settings (the mechanisms: charlm.compress)."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from charlm import checkpoint
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


class _Session:
    """The original model, the scored text and its reference log-probabilities, and the importances (measured
    once, on the first eighth of the text)."""

    def __init__(self, ckpt: str, opts: CompressOptions):
        self.ck = checkpoint.load(ckpt)
        self.text = scored_text(self.ck, opts.text, opts.tokens)
        self.reference = log_probs(self.ck.model, self.text.rows)
        self.probe = self.text.rows[: max(1, len(self.text.rows) // 8)]
        self._heads = self._units = None
        self.state = {k: v.detach() for k, v in self.ck.model.state_dict().items()}

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
                self._heads = head_importance(self.ck.model, self.probe)
            ranking = shuffled(self._heads.shape) if chance else self._heads
            cfg, state, dropped = drop_heads(cfg, state, ranking, heads)
            what = {"heads_dropped": heads, "dropped": [list(d) for d in dropped]}
        if units:
            if "gates" not in can:
                other = "; use --drop-heads" if "attention" in can else ""
                raise ConfigError(f"--drop-units: {self.ck.path} is a {cfg.kind} model, which has no units{other}")
            if self._units is None:
                self._units = unit_importance(self.ck.model, self.probe)
            ranking = shuffled(self._units.shape) if chance else self._units
            cfg, state, dropped = drop_units(cfg, state, ranking, units)
            what = {"units_dropped": units, "dropped": [list(d) for d in dropped]}
        return cfg, state, what, dropped

    def write(
        self, to: Path, bits: int, heads: int, units: int, name: str, chance: bool = False
    ) -> tuple[Measured, list]:
        """Write the run, load it back through the safe loader as every command does, score it, and write it
        again with its own score."""
        cfg, state, what, dropped = self.pruned(heads, units, chance)
        weights, path = stored(state, bits), to / checkpoint.BEST
        checkpoint.save(build(self.ck, to.name, bits, cfg, weights, what, None), path)
        ck = checkpoint.load(path)
        nats, top1, kl = compare_to(self.reference, log_probs(ck.model, self.text.rows), self.text.rows)
        bpc = bits_per_char(nats, self.text.chars_per_token)
        checkpoint.save(build(self.ck, to.name, bits, cfg, weights, what, (nats, bpc)), path)
        params = config_params(cfg)
        m = Measured(
            name, params, bits_per_weight(*weights, params), path.stat().st_size, bpc, top1, kl, tokens_per_s(ck)
        )
        return m, dropped


def _label(bits: int, heads: int, units: int, chance: bool = False) -> str:
    words = [{32: "float32", 16: "bf16", 8: "int8", 4: "int4"}[bits]]
    if heads:
        words.append(f"-{heads} head{'s' * (heads > 1)}/layer")
    if units:
        words.append(f"-{units} unit{'s' * (units > 1)}/layer")
    return " ".join(words) + (" (random)" if chance else "")


def compress(ckpt: str, opts: CompressOptions) -> Compressed:
    """Write the compressed run to opts.to (its best checkpoint), and measure it and the original on the same text."""
    to = Path(opts.to)
    if any((to / n).exists() for n in (checkpoint.BEST, checkpoint.LAST, checkpoint.OLD_BEST, checkpoint.OLD_LAST)):
        raise ConfigError(f"--to {to} already holds a run: give a new directory")
    s = _Session(ckpt, opts)
    with tempfile.TemporaryDirectory() as tmp:
        original, _ = s.write(Path(tmp), 32, 0, 0, "original")
    result, dropped = s.write(
        to, opts.bits, opts.drop_heads, opts.drop_units, _label(opts.bits, opts.drop_heads, opts.drop_units)
    )
    return Compressed(original, result, to, s.text.source, dropped)


def report(ckpt: str, opts: CompressOptions) -> Report:
    """Every method at a few settings: bf16, int8, int4, then heads (Transformer) or units (LSTM/GRU) dropped
    from 1 (an eighth of the units) up to half; each written, loaded back and measured. Writes nothing that stays."""
    s = _Session(ckpt, opts)
    cfg = s.cfg
    settings = [(32, 0, 0, False), (16, 0, 0, False), (8, 0, 0, False), (4, 0, 0, False)]
    if "prune" not in s.ck.model.capabilities:
        pass  # nothing can be dropped (an ALiBi model's heads; a family without parts to prune)
    elif s.ck.model.PART == "head":
        settings += [(32, k, 0, False) for k in range(1, cfg.n_heads // 2 + 1)]
        settings += [(32, 1, 0, True), (8, 1, 0, False), (4, 1, 0, False)] if cfg.n_heads >= 2 else []
    else:
        H = cfg.hidden_size
        steps = sorted({max(1, H * i // 8) for i in range(1, 5)} - {0})
        settings += [(32, 0, k, False) for k in steps if k < H]
        if steps[0] < H:
            settings += [(32, 0, steps[0], True), (8, 0, steps[0], False), (4, 0, steps[0], False)]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (bits, heads, units, chance) in enumerate(settings):
            where = Path(tmp) / str(i)
            rows.append(s.write(where, bits, heads, units, _label(bits, heads, units, chance), chance)[0])
            os.remove(where / checkpoint.BEST)
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
