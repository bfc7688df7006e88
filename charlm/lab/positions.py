"""positions: the same Transformer with each kind of position information (config.POSITIONS), each trained
to its plateau on one copy task, then asked to copy lines longer than any it saw and to read text in
windows longer than its context.

The task: N distinct symbols, a separator, the same N again ("q3Xb|q3Xb"), N drawn from `lengths` for
every line, so that no fixed offset finds the symbol to copy; the symbols are distinct so that copying
by content (find the current symbol, read the one after it) is exact. Every character is a training
target, each training window starts at a line, and the context holds the longest line.

Every encoding gets the same model (3 layers: with 2, NoPE stalled far from copying), PyTorch's own init,
optimizer (Muon), learning rate, cosine schedule and budget of steps: one recipe, tried for all of them
alike, not tuned per encoding. The in-context score is measured every `every` steps, so the summary says
when each encoding reached its plateau, not only where it ended.

Scored, with the perfect copier, the order-blind shortcut and guessing beside every figure:
  copy N=…    bits per copied symbol on fresh lines of N symbols, each line alone from the window's
              start: perfect 0; the shortcut knows which symbols are left but not their order (log2 of
              how many are left); guessing is log2 of the alphabet. N past the training lengths needs a
              context past the training context: the model is rebuilt longer with the same weights
              (RoPE's angles, ALiBi's biases and the sinusoidal table are computed for any position; a
              learned table has no rows there: n/a).
  text W      bits per character of fresh text (lines of the training lengths) in windows of W tokens,
              each from a line's start, and its gap to the perfect copier on the same windows (which pays
              for the first half of each line and where it ends, nothing for the copy, and itself moves
              with W): the reading quotes the gap; W past the context asks for positions beyond it with
              distances already seen.
"""

from __future__ import annotations

import math
import random
import statistics
import string
from pathlib import Path

import numpy as np
import torch

from charlm.config import POSITIONS, ModelConfig
from charlm.data import bits_per_char
from charlm.lab.result import Chart, Clock, LabResult, positions_label, record, seeds_of
from charlm.lab.scoring import scored
from charlm.lab.tasks import Example, TaskText
from charlm.lab.training import PYTORCH_INIT, lab_train_config, lab_trainer
from charlm.models import build_model
from charlm.models.inspect import nats as inspect_nats

SYMBOLS = string.ascii_letters + string.digits  # 62: a line of up to 62 distinct ones
SEP = "|"
ALPHABET = SYMBOLS + SEP

DEFAULTS = dict(
    lengths=(1, 15),  # N, every value from the first to the second: the longest line fills the context
    context=32,
    longer=(20, 24, 31, 47, 62),  # N past the training lengths (up to 2N + 2 = 126 tokens: windows of 4x)
    windows=(1, 2, 4),  # text windows, in contexts
    steps=1200,
    every=100,
    d_model=64,
    layers=3,  # NoPE needs the third: with two it sat at 0.6-0.7 bits a copied symbol after 2,000 steps
    heads=4,
    batch_size=32,
    optimizer="muon",
    lr=1e-2,
    train_chars=500_000,
    eval_examples=300,
    eval_chars=20_000,
)
QUICK = dict(
    lengths=(1, 7), context=16, longer=(10, 15, 31), steps=600, every=100, d_model=48, train_chars=150_000,
    eval_examples=140, eval_chars=8_000,
)  # fmt: skip
PLATEAU = 0.1  # bits per copied symbol within which an encoding counts as copying (the perfect copier: 0)


CHART = Chart(
    "length", "bits", "positions", "symbols to copy (N)", "bits per copied symbol"
)  # how its records are drawn


# ---- the task -----------------------------------------------------------------------------------------


def line(rng: random.Random, n: int) -> Example:
    s = "".join(rng.sample(SYMBOLS, n))
    return Example(f"{s}{SEP}{s}", list(range(n + 1, 2 * n + 1)))  # targets: the copied half


def examples(n: int, count: int, seed: int) -> list[Example]:
    rng = random.Random(seed)
    return [line(rng, n) for _ in range(count)]


def corpus(lengths: tuple[int, int], chars: int, seed: int) -> TaskText:
    """About `chars` characters of lines, N uniform in lengths; the first line is the alphabet (so the char
    tokenizer knows every symbol). Every character after it is a target; windows start at a line."""
    rng = random.Random(seed)
    lines, starts, n = [ALPHABET], [], len(ALPHABET)
    while n < chars:
        starts.append(n)
        lines.append(line(rng, rng.randint(*lengths)).text)
        n += 1 + len(lines[-1])
    text = "\n".join(lines) + "\n"
    mask = np.ones(len(text), dtype=bool)
    mask[: len(ALPHABET) + 1] = False
    return TaskText(text, np.asarray(starts, dtype=np.int64), mask)


def perfect_bits(text: str, lengths: tuple[int, int]) -> np.ndarray:
    """Bits the perfect copier pays for each character of `text` (lines of N uniform in lengths, each
    after a newline), given everything before it in its line: a new symbol costs log2 of those not yet
    used, times the chance that the line goes on; the separator, the chance that it ends there; the copy
    and the newline after it, nothing."""
    lo, hi = lengths
    out = np.zeros(len(text))
    first, *lines = text.split("\n")  # the alphabet, then the lines
    i = len(first) + 1
    for ln in lines:
        n = ln.find(SEP)  # -1 for the empty string after the last newline
        for k in range(n + 1):  # k symbols so far; the next character is at i + k
            stop = 1.0 / (hi - k + 1) if k >= lo else 0.0  # P(N = k | N >= k), N uniform in lo..hi
            out[i + k] = -math.log2(stop) if k == n else -math.log2((1 - stop) / (len(SYMBOLS) - k))
        i += len(ln) + 1
    return out


def order_blind_bits(n: int) -> float:
    """Per copied symbol, the shortcut that knows which symbols are left but not their order."""
    return math.log2(math.factorial(n)) / n


# ---- scoring ------------------------------------------------------------------------------------------


def widened(model, context: int):
    """The same weights in a model built for a longer context; None when the positions cannot stretch."""
    if context <= model.cfg.context:
        return model
    if model.cfg.positions == "learned":
        return None
    wide = build_model(ModelConfig.from_dict({**model.cfg.to_dict(), "context": context}))
    wide.load_state_dict(model.state_dict())  # position buffers are not saved: rebuilt for the new length
    return wide.eval()


def copied_bits(model, tokenizer, lines: list[Example]) -> tuple[float, float]:
    """(bits per copied symbol, share of them right by argmax) on lines each alone from a window's start."""
    accuracy, nats = scored(model, tokenizer, lines)
    return bits_per_char(nats), accuracy


@torch.no_grad()
def window_bits(model, ids: np.ndarray, floor: np.ndarray, starts: np.ndarray, window: int) -> tuple[float, float]:
    """(the model's, the perfect copier's) bits per character over windows of `window` tokens, each from a
    line's start (the newline before it), one after another; every target scored with only the tokens of
    its own window before it."""
    offsets, at = [], 0
    for s in starts:
        if s >= at and s + window + 1 <= len(ids):
            offsets.append(int(s))
            at = s + window
    rows = torch.from_numpy(np.stack([ids[s : s + window + 1] for s in offsets]).astype(np.int64))
    logits, _ = model(rows[:, :-1])
    perfect = np.concatenate([floor[s + 1 : s + window + 1] for s in offsets]).mean()
    return bits_per_char(inspect_nats(logits, rows)), float(perfect)  # one character a token


# ---- the experiment -----------------------------------------------------------------------------------


def model_config(s: dict, positions: str, vocab_size: int) -> ModelConfig:
    return ModelConfig(
        kind="transformer",
        vocab_size=vocab_size,
        n_layers=s["layers"],
        d_model=s["d_model"],
        n_heads=s["heads"],
        context=s["context"],
        positions=positions,
        tied=False,  # a head of its own (tied, a symbol's own embedding pulls each answer toward itself)
    )


def run(out: Path, seed: int = 0, seeds: int = 1, device: str = "cpu", progress=print, **settings) -> LabResult:
    s = {**DEFAULTS, **settings}
    lo, hi = s["lengths"]
    if 2 * hi + 2 > s["context"] + 1:
        raise ValueError(
            f"the longest line ({2 * hi + 1} characters and its newline) does not fit context {s['context']}"
        )
    clock = Clock()
    raws, runs, params = [], [], {}
    for seed_ in seeds_of(seed, seeds):
        raw = measure_seed(out, seed_, device, progress, s, runs, params)
        raws.append(raw)
    return result(raws, {**s, "device": device, "params": params}, runs, clock())


def measure_seed(out: Path, seed: int, device: str, progress, s: dict, runs: list, params: dict) -> dict:
    """One seed: every encoding trained and scored. {"seed", "curves": {positions: in-context bits at each
    evaluation}, "scores": {positions: {what: [bits, right] or [bits, perfect] or None}}, "seconds"}."""
    lo, hi = s["lengths"]
    C = s["context"]
    data = corpus((lo, hi), s["train_chars"], seed)
    fresh = corpus((lo, hi), s["eval_chars"], seed + 20_000)
    floor = perfect_bits(fresh.text, (lo, hi))
    per = max(1, s["eval_examples"] // (hi - lo + 1))
    held = [e for n in range(lo, hi + 1) for e in examples(n, per, seed + 10_000 + n)]
    raw = {"seed": seed, "curves": {}, "scores": {}, "seconds": {}}
    clock = Clock()
    for k, pos in enumerate(POSITIONS, 1):
        name = f"positions-{pos}-s{seed}"
        t0 = clock()
        cfg = model_config(s, pos, len(ALPHABET) + 1)
        train_cfg = lab_train_config(
            s["steps"], seed, device, s["batch_size"], s["lr"], s["optimizer"], eval_interval=s["every"]
        )
        trainer = lab_trainer(data, out / name, cfg, train_cfg, PYTORCH_INIT)
        params[pos] = trainer.params
        curve = []
        for step in range(s["every"], s["steps"] + 1, s["every"]):
            progress(f"training {name} ({k}/{len(POSITIONS)}, seed {seed}): step {step} of {s['steps']}")
            trainer.fit(until=step)
            trainer.model.eval()
            curve.append(round(copied_bits(trainer.model, trainer.tokenizer, held)[0], 4))
            trainer.model.train()
        model, tok = trainer.model.eval(), trainer.tokenizer
        runs.append(str(out / name))
        got = {f"N {lo}-{hi}": copied_bits(model, tok, held)}
        wide = widened(model, 4 * C)
        for n in s["longer"]:
            lines = examples(n, max(20, per), seed + 10_000 + n)
            got[f"N {n}"] = None if wide is None else copied_bits(wide, tok, lines)
        ids = np.asarray(tok.encode(fresh.text), dtype=np.int64)
        for m in s["windows"]:
            at = widened(model, m * C)
            got[f"text {m * C}"] = None if at is None else window_bits(at, ids, floor, fresh.starts, m * C)
        raw["curves"][pos], raw["scores"][pos] = curve, got
        raw["seconds"][pos] = round(clock() - t0, 1)
    return raw


def result(raws: list[dict], s: dict, runs: list[str], seconds: float) -> LabResult:
    """The table, summary and reading of one or more seeds' measure_seed (in seed order); details["raw"]
    keeps them, so that seeds measured apart combine into one result (result(a + b, ...))."""
    records, summary = _records(raws, s), _summary(raws, s)
    settings = {
        **s,
        "lengths": list(s["lengths"]),
        "longer": list(s["longer"]),
        "windows": list(s["windows"]),
        "seeds": [r["seed"] for r in raws],
        "variants": list(POSITIONS),
    }
    return LabResult(
        "positions",
        settings,
        records,
        reading(records, summary, s),
        CHART,
        runs=runs,
        seconds=seconds,
        details={"summary": summary, "raw": raws},
    )


def _copy(what: str) -> str:
    return "copy N=" + what.removeprefix("N ")  # "copy N=1-15", "copy N=20"


def _mean_blind(lo: int, hi: int) -> float:
    """order_blind_bits over lines of N uniform in lo..hi, per copied symbol."""
    return sum(math.log2(math.factorial(n)) for n in range(lo, hi + 1)) / sum(range(lo, hi + 1))


def _spread(values: list[float]) -> dict:
    out = {"bits": statistics.fmean(values)}
    if len(values) > 1:
        out["per_seed"] = [round(v, 3) for v in values]
    return out


def _worst(r: dict) -> float:
    return max(r.get("per_seed") or [r["bits"]])


def _records(raws: list[dict], s: dict) -> list[dict]:
    lo, hi = s["lengths"]
    C = s["context"]
    guess = math.log2(len(SYMBOLS))
    mean_blind = _mean_blind(lo, hi)
    out = []
    for pos in POSITIONS:
        rows = [(f"N {lo}-{hi}", hi, mean_blind)] + [(f"N {n}", n, order_blind_bits(n)) for n in s["longer"]]
        for what, n, blind in rows:
            got = [r["scores"][pos][what] for r in raws]
            if got[0] is None:
                out.append(record(positions=pos, scored=_copy(what), length=n, bits=None))
                continue
            out.append(
                record(
                    positions=pos,
                    scored=_copy(what),
                    length=n,
                    **_spread([b for b, _ in got]),
                    right=statistics.fmean(a for _, a in got),
                    perfect=0.0,
                    shortcut=blind,
                    guessing=guess,
                )
            )
        for m in s["windows"]:
            got = [r["scores"][pos][f"text {m * C}"] for r in raws]
            if got[0] is None:
                out.append(record(positions=pos, scored=f"text {m * C}", bits=None))
                continue
            out.append(
                record(
                    positions=pos,
                    scored=f"text {m * C}",
                    **_spread([b for b, _ in got]),
                    perfect=statistics.fmean(p for _, p in got),
                    # what the model pays beyond the perfect copier on the same windows: raw bits/char mix in
                    # the windows' make-up (the perfect copier itself moves with the window)
                    gap=statistics.fmean(b - p for b, p in got),
                    guessing=math.log2(len(ALPHABET) + 1),
                )
            )
    return out


def _summary(raws: list[dict], s: dict) -> list[dict]:
    """Per encoding: every seed's first evaluation step at which the in-context score came within PLATEAU of
    the perfect copier (None: never), and the seconds a seed took to train and score it (wall time)."""
    out = []
    for pos in POSITIONS:
        reached = [
            next((s["every"] * (i + 1) for i, b in enumerate(r["curves"][pos]) if b <= PLATEAU), None) for r in raws
        ]
        out.append(
            record(
                positions=pos,
                plateau_step=reached,
                train_seconds=statistics.fmean(r["seconds"][pos] for r in raws),  # --json only: not in the table
            )
        )
    return out


WHY = {  # one sentence each: the mechanism the numbers beside it point to
    "rope": "its scores depend on the distance between two tokens, and a longer line puts the symbol to copy "
    "farther back than any distance it learned to read",
    "alibi": "its penalty grows with distance, so keys farther back than any it saw weigh little and what is near "
    "reads as in training",
    "nope": "without positions it reads order by counting tokens through the causal mask, and a longer line or "
    "window asks for counts it never made",
    "learned": "its table has a row for each position of the context and none beyond",
    "sinusoidal": "it adds a vector for each absolute position, and those past the context are inputs it never saw",
}


def reading(records: list[dict], summary: list[dict], s: dict) -> str:
    lo, hi = s["lengths"]
    at = {(r["positions"], r["scored"]): r for r in records}
    K = len(next(iter(summary))["plateau_step"])
    every = f"in {K} of {K} seeds" if K > 1 else "(one seed)"
    first = f"copy N={lo}-{hi}"
    guess = math.log2(len(SYMBOLS))
    parts = [
        f"Each encoding trained {s['steps']} steps (batch {s['batch_size']}, {s['optimizer'].capitalize()} at "
        f"{s['lr']:g} with a cosine decay, the same settings for all) on lines of N = {lo}-{hi} distinct "
        f"symbols copied after a separator; per copied symbol the perfect copier scores 0 bits, the order-blind "
        f"shortcut {_mean_blind(lo, hi):.2f}, guessing {guess:.2f}."
    ]
    plateau = ", ".join(
        f"{r['positions']} {max(r['plateau_step'])}" if None not in r["plateau_step"] else f"{r['positions']} never"
        for r in summary
    )
    final = ", ".join(
        f"{p} {at[(p, first)]['bits']:.3f}" + (f" (worst {_worst(at[(p, first)]):.3f})" if K > 1 else "")
        for p in POSITIONS
    )
    parts.append(
        f"Steps until {'every seed' if K > 1 else 'it'} first came within {PLATEAU} bits of the perfect copier "
        f"on N = {lo}-{hi} (scored every {s['every']} steps): {plateau}; at the end, {every}: {final}."
    )
    missing = [p for p in POSITIONS if _worst(at[(p, first)]) > PLATEAU]
    if missing:
        parts.append(
            f"{', '.join(map(positions_label, missing))} did not end on the plateau in every seed with this budget: "
            "its figures beyond the training lengths say less."
        )
    for p in POSITIONS:
        parts.append(_extrapolation(p, at, s))
    return " ".join(parts)


def _extrapolation(p: str, at: dict, s: dict) -> str:
    C, hi = s["context"], s["lengths"][1]
    if at[(p, f"copy N={s['longer'][0]}")]["bits"] is None:
        return f"{positions_label(p)} cannot run past {C} tokens: {WHY[p]}."
    far = hi  # the longest N copied within PLATEAU in every seed, every shorter one tried too
    for n in s["longer"]:
        if _worst(at[(p, f"copy N={n}")]) > PLATEAU:
            break
        far = n
    copy = ", ".join(f"{at[(p, f'copy N={n}')]['bits']:.2f} at N={n}" for n in s["longer"])
    text = ", ".join(f"{at[(p, f'text {m * C}')]['gap']:+.2f} at {m * C}" for m in s["windows"])
    how = (
        f"copies lines up to N={far} within {PLATEAU} bits"
        if far > hi
        else f"copies no longer line within {PLATEAU} bits"
    )
    return f"{positions_label(p)} {how} ({copy} bits per copied symbol); on text, beyond the perfect copier on the same windows, {text} tokens bits/char: {WHY[p]}."
