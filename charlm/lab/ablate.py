"""ablate CKPT: what each part of a trained model is worth, in bits/char lost on a text when it is taken out.

Every part goes through the family's knock_out (models/inspect.py), so `charlm explore` measures the same:
an attention family's heads one at a time (the head's output held at 0: it then adds nothing), ranked by the
damage; a gated family's gates held at 0 or at 1 at every step ("what if the forget gate were always open"),
where it has gates, and units of a layer's hidden state zeroed (the busiest, and as many at random).
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from charlm.data import bits_per_char, filler, model_input, trained_positions
from charlm.errors import ConfigError
from charlm.evaluate import validation_part
from charlm.lab import tasks
from charlm.lab.result import Chart, Clock, LabResult, record
from charlm.lab.training import load_run
from charlm.models import Part, lacks
from charlm.models.inspect import each_part, knocked, knockouts, nats

DEFAULTS = dict(max_chars=8192, rows=16, units=8)
QUICK = dict(max_chars=1024, rows=4, units=4)


@dataclass
class Scored:
    """The text an ablation scores: its tokens, where they come from, and for a lab run the positions its task
    determines (mask), where its examples begin (starts) and what its model reads (reads: the filler in place of
    each target where it was trained so, data.model_input): scored as the run was trained, nothing else."""

    ids: list[int]
    source: str
    mask: np.ndarray | None = None
    starts: list[int] | None = None
    reads: list[int] | None = None  # None: ids
    note: str | None = None  # what the reading must say of how it was scored (an older recall run)


OLD = (  # a recall run saved before charlm kept its filler (data.READS): nothing says what its model read
    "This recall run was saved before charlm kept what its model reads, so it is scored reading each answer where "
    "it was trained on a filler: train it again to score it as it was trained."
)
CHART = Chart("rank", "damage", None, "rank (most damaging first)", "bits/char lost")  # how its records are drawn


def _ids(ck, text: str | None, max_chars: int) -> Scored:
    """The tokens to score and where they come from: --text FILE; else the run's own corpus.txt (lab runs
    keep theirs, with the task's targets); else the validation part of the corpus the checkpoint names, when
    that file is still where the trainer read it and its sha256 still matches (the trainer's own split)."""
    if text:
        return Scored(_encode(ck, Path(text), max_chars), text)
    kept = ck.path.parent / "corpus.txt"
    if kept.is_file():
        ids = _encode(ck, kept, max_chars)
        mask = trained_positions(kept, ids, ck.tokenizer)  # a lab run's
        if mask is not None:
            (newline,) = ck.tokenizer.encode("\n")  # an example starts after one (not after a padding newline)
            starts = [i for i in range(len(ids) - 1) if ids[i] == newline != ids[i + 1]]
            if starts:
                fill = filler(kept, ck.tokenizer)
                old = fill is None and ck.tokenizer.decode(ids[: starts[0]]) == tasks.alphabet("recall")
                reads = model_input(ids, mask, fill)
                return Scored(
                    ids, f"{kept} (the characters its task determines)", mask, starts, reads, OLD if old else None
                )
        return Scored(ids, str(kept))
    val, why = validation_part(ck)
    if why is None:
        corpus = ck.saved.corpus
        n = max(2, int(max_chars / corpus.chars_per_token))
        return Scored([int(i) for i in val[:n]], f"{corpus.path} (its validation part)")
    if why.startswith("its checkpoint "):  # and no corpus.txt beside it
        why = "it has no corpus.txt (only lab runs keep theirs) and " + why.removeprefix("its checkpoint ")
    raise ConfigError(f"no text to score {ck.path.parent}: {why}; give a text with --text FILE")


def _encode(ck, path: Path, max_chars: int) -> list[int]:
    if not path.exists():
        raise ConfigError(f"no text to score: {path} does not exist; give one with --text FILE")
    if not path.is_file():  # a device (/dev/zero never ends), a FIFO, a directory
        raise ConfigError(f"--text: {path} is not a regular file; give the path of a text file")
    try:
        with open(path, "rb") as f:  # only what is scored: at most 4 bytes a character
            body = codecs.getincrementaldecoder("utf-8")().decode(f.read(4 * max_chars))
        body = body.replace("\r\n", "\n").replace("\r", "\n")  # as read_text did
    except UnicodeDecodeError:
        raise ConfigError(f"--text: {path} is not UTF-8 text") from None
    except OSError as e:
        raise ConfigError(f"--text: cannot read {path}: {e.strerror}") from None
    return ck.tokenizer.encode(body[:max_chars], unknown="drop")


def _rows(text: Scored, rows: int, context: int) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """The text cut into `rows` windows of equal length (at most context + 1 tokens each), which of their
    targets are scored (None: all), and what the model reads of them (the same windows of text.reads). A lab
    run's windows begin where its examples do, as in training."""
    ids = text.ids
    reads = ids if text.reads is None else text.reads
    if text.mask is not None:
        T = context + 1
        starts = [i for i in text.starts if i + T <= len(ids)][:rows]
        if starts:
            x = torch.tensor(np.stack([ids[i : i + T] for i in starts]))
            keep = torch.from_numpy(np.stack([text.mask[i + 1 : i + T] for i in starts]))
            if keep.any():
                return x, keep, torch.tensor(np.stack([reads[i : i + T] for i in starts]))
    T = min(context + 1, len(ids) // rows)
    if T < 2:
        raise ConfigError(f"the text is too short to score: {len(ids)} tokens for {rows} windows")
    x = torch.tensor(np.asarray(ids[: rows * T]).reshape(rows, T))
    return x, None, x


@torch.no_grad()
def run(ckpt: str, seed: int = 0, text: str | None = None, progress=print, **settings) -> LabResult:
    s = {**DEFAULTS, **settings}
    clock = Clock()
    ck = load_run(ckpt)
    scored = _ids(ck, text, s["max_chars"])
    model, cfg = ck.model, ck.model_config
    if "knock_out" not in model.capabilities:
        raise ConfigError(f"lab ablate: {lacks(model, 'knock_out')}")
    units = model.PART == "unit"
    # a unit family reads each window from a fresh state, as the transformer reads its context: the same windows
    x, keep, read = _rows(scored, s["rows"], cfg.context if not units or scored.mask is not None else 256)
    targets = x[:, 1:] if keep is None else x[:, 1:][keep]
    chars = len(ck.tokenizer.decode(targets.reshape(-1).tolist()))
    tokens = targets.numel()

    def bpc(value: float) -> float:
        return bits_per_char(value * tokens, chars=chars)

    base = bpc(nats(model(read[:, :-1])[0], x, keep))
    records = []

    def add(part: Part, label: str, value: float, lost: float, **more) -> None:
        records.append(
            record(layer=part.layer, part=label, value=value, bits_per_char=bpc(lost), damage=bpc(lost) - base, **more)
        )

    if not units:
        for part, lost in knockouts(model, x, keep, each_part(model), reads=read):
            add(part, f"head {part.which[0]}", 0.0, lost)
    else:
        gen = np.random.default_rng(seed)
        n = model.parts(cfg)
        traces = model.trace(read[:, :-1]) if "gates" in model.capabilities else None
        for layer in range(cfg.n_layers):
            progress(f"ablating layer {layer} of {cfg.n_layers}")
            for name in traces[layer].gates if traces else ():
                for value in (0.0, 1.0):
                    with knocked(model, part := Part(layer, "gate", gate=name, value=value)):
                        add(part, name, value, nats(model(read[:, :-1])[0], x, keep))
            chosen = {f"{s['units']} random units": [int(u) for u in gen.choice(n, min(s["units"], n), replace=False)]}
            if traces:  # the units whose output varies most (what the gate viewer shows first)
                spread = traces[layer].h.reshape(-1, n).std(dim=0).numpy()
                chosen[f"{s['units']} busiest units"] = [
                    int(u) for u in np.argsort(-spread, kind="stable")[: s["units"]]
                ]
            for label, picked in sorted(chosen.items()):
                ((part, lost),) = knockouts(model, x, keep, [Part(layer, model.PART, tuple(picked))], reads=read)
                add(part, label, 0.0, lost, units=list(picked))
    records.sort(key=lambda r: -r["damage"])
    for rank, r in enumerate(records, 1):
        r["rank"] = rank
    settings_out = {
        **s,
        "checkpoint": str(ck.path),
        "text": scored.source,
        "model": cfg.kind,
        "tokens": tokens,
        "baseline_bits_per_char": round(base, 4),
        "seed": seed,
    }
    return LabResult(
        "ablate",
        settings_out,
        records,
        " ".join(filter(None, [reading(records, base, cfg.kind), scored.note])),
        CHART,
        seconds=clock(),
    )


def _name(r: dict) -> str:
    if r["part"].startswith("head"):
        return f"L{r['layer']}H{r['part'].split()[1]}"
    return f"L{r['layer']} {r['part']}={r['value']:g}"


def reading(records: list[dict], base: float, kind: str) -> str:
    top = records[0]
    least = records[-1]
    parts = [f"Intact, the {kind.upper() if kind != 'transformer' else 'Transformer'} scores {base:.3f} bits/char."]
    if top["part"].startswith("head "):
        harmless = [r for r in records if abs(r["damage"]) < 0.01]
        parts.append(
            f"Knocking out {_name(top)} hurts most (+{top['damage']:.3f}), {_name(least)} least "
            f"({least['damage']:+.3f}); {len(harmless)} of {len(records)} heads cost under 0.01 bits/char "
            "when removed alone."
        )
        if len(records) > 1:
            second = records[1]["damage"]
            parts.append(
                f"{_name(top)} matters most by far: removing it costs {top['damage'] / max(second, 1e-9):.1f}× "
                "what the next head costs."
                if top["damage"] > 2 * second
                else "No single head dominates: the damage is spread over several heads."
            )
        return " ".join(parts)
    parts.append(
        f"The worst single change is {_name(top)} (+{top['damage']:.3f} bits/char); "
        f"the mildest {_name(least)} ({least['damage']:+.3f})."
    )
    forget = {(r["layer"], r["value"]): r["damage"] for r in records if r["part"] in ("forget", "update")}
    if forget:
        gate = next(r["part"] for r in records if r["part"] in ("forget", "update"))
        open_, shut = (
            [v for (l, val), v in forget.items() if val == 1.0],
            [v for (l, val), v in forget.items() if val == 0.0],
        )
        parts.append(
            f"Holding the {gate} gate at 1 (never forget) costs {np.mean(open_):+.3f} on average over the layers, "
            f"at 0 (forget every step) {np.mean(shut):+.3f}: "
            + (
                "losing the memory hurts more than never clearing it."
                if np.mean(shut) > np.mean(open_)
                else "never clearing the memory hurts more than losing it."
            )
        )
    busy = [r["damage"] for r in records if "busiest" in r["part"]]
    calm = [r["damage"] for r in records if "random" in r["part"]]
    if busy and calm:
        gap = np.mean(busy) - np.mean(calm)
        parts.append(
            f"Zeroing the busiest units costs {np.mean(busy):+.3f}, as many random ones {np.mean(calm):+.3f}"
            + (
                ": the units the gate viewer shows first matter clearly more."
                if gap > 0.25
                else ": the busiest units matter little more than random ones."
                if gap > 0
                else ": the busiest units are no more important than random ones."
            )
        )
    return " ".join(parts)
