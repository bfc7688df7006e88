"""Quality per CPU-minute: charlm's `tiny` preset against nanoGPT's CPU recipe, in the recipe's own wall time.

    python benchmarks/bench_train.py --repeat 3          # the protocol of benchmarks/RESULTS.md
    python benchmarks/bench_train.py --ref-iters 100     # a quick check of the machinery (short runs)
    python benchmarks/bench_train.py --only tiny --tokens 400000 --set batch_size=32   # an idea, at a fixed token count
    python benchmarks/bench_train.py --lstm-speed        # LSTM 2x256, batch 64, context 64: chars/s
    python benchmarks/bench_train.py --speed --variant "" --variant "context=128"   # tokens/s vs the recipe's
    python benchmarks/bench_train.py --only tiny --variant "context=128 tokens=1500000" --variant ...  # interleaved

Screening an idea without a quiet machine: its loss at the token count it would reach in the budget (--only
tiny --variant "... tokens=N": quality per token does not depend on the load) and its speed relative to the
recipe's, both interleaved with the others (--speed: short runs, side by side, medians; ratios survive load
better than absolute figures). The budget in tokens is the recipe's 2001 x 768 tokens x that speed ratio.

The protocol, one pair of runs at a time (reference, then charlm), with seed 1337 + the pair's index:
- the reference is nanoGPT's recipe as published (benchmarks/nanogpt_reference.py), trained on the first
  90% of tinyshakespeare (charlm's char tokenizer and train/val split); its training time (the 2001
  iterations, setup excluded) is measured;
- charlm's `tiny` preset (charlm's own Trainer, no evaluations while training) gets exactly that time
  as its budget (--max-time);
- both are scored by the same code, charlm.evaluate (what `charlm eval` runs), over the WHOLE last 10%:
  windows of each model's context, stride context/2, every character scored once;
- the loss-vs-time curve: snapshots at 1/4, 1/2 and 3/4 of the reference's iterations, and charlm's
  at the same seconds, scored the same way.
Pairs alternate so machine noise hits both alike; the load average is recorded before each run.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import nanogpt_reference as nanogpt

from charlm.config import ModelConfig, TrainConfig
from charlm.data import Batches, load_tokens, prepare
from charlm.evaluate import evaluate_ids
from charlm.models import build_model
from charlm.presets import MODEL_KEYS, preset
from charlm.runtime import autocast_dtype
from charlm.training.events import Stepped
from charlm.training.optim import make_optimizer
from charlm.training.trainer import Trainer

CORPUS = Path(__file__).resolve().parent.parent / "corpora" / "tinyshakespeare.txt"
CURVE = (0.25, 0.5, 0.75)  # curve points, as fractions of the reference's iterations
SKIP = 3  # --speed: steps left out of the steady speed
RECIPE_TOKENS = (nanogpt.RECIPE["max_iters"] + 1) * nanogpt.RECIPE["batch_size"] * nanogpt.RECIPE["block_size"]


def load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def score(model, tokenizer, val: np.ndarray) -> float:
    """Loss (nats/char) over the whole validation text: charlm eval's windows (stride context/2)."""
    model.eval()
    return round(evaluate_ids(model, tokenizer, val).loss, 4)


def reference(tokenizer, batches: Batches, seed: int, iters: int, curve: bool = True) -> dict:
    # as published for 2000 iterations; a shorter check keeps the warmup at a tenth of its iterations
    recipe = dict(
        nanogpt.RECIPE,
        seed=seed,
        max_iters=iters,
        lr_decay_iters=iters,
        warmup_iters=min(nanogpt.RECIPE["warmup_iters"], iters // 10),
    )
    points = {round(f * iters) for f in CURVE} if curve else set()
    snaps = []

    def on_iter(i, seconds, model):
        if i in points:
            snaps.append((i, seconds, copy.deepcopy(model.state_dict())))

    loadavg = load()
    model, seconds = nanogpt.train(np.asarray(batches.train), tokenizer.vocab_size, recipe, on_iter)
    curve = []
    for i, t, state in snaps:
        snap = nanogpt.GPT(model.config)
        snap.load_state_dict(state)
        curve.append((round(t, 1), i, score(nanogpt.Scored(snap), tokenizer, batches.val)))
    steps = iters + 1
    return {
        "name": "reference",
        "seed": seed,
        "load": loadavg,
        "steps": steps,
        "seconds": round(seconds, 1),
        "tokens_per_s": round(steps * recipe["batch_size"] * recipe["block_size"] / seconds),
        "val_loss": score(nanogpt.Scored(model), tokenizer, batches.val),
        "curve": curve,
    }


def charlm(
    tokenizer,
    batches: Batches,
    seed: int,
    budget: float | None,
    tokens: int | None = None,
    times: tuple = (),
    overrides: dict | None = None,
    scored: bool = True,
) -> dict:
    """The tiny preset for `budget` seconds (or exactly `tokens` tokens), snapshots at `times` seconds."""
    settings = {k: v for part in (*preset("transformer", "tiny"), overrides or {}) for k, v in part.items()}
    model_cfg = ModelConfig(kind="transformer", **{k: v for k, v in settings.items() if k in MODEL_KEYS})
    t = {k: v for k, v in settings.items() if k not in MODEL_KEYS}
    steps = -(-tokens // (t["batch_size"] * model_cfg.context)) if tokens else 10**9
    train_cfg = TrainConfig(
        max_time=None if tokens else budget,
        steps=steps,
        eval_interval=10**9,
        eval_iters=1,
        sample_tokens=0,
        device="cpu",
        seed=seed,
        **t,
    )
    pending, snaps, trainer, stamps = sorted(times), [], None, []

    def on_event(e):
        if isinstance(e, Stepped):
            stamps.append(e.elapsed)
        if isinstance(e, Stepped) and pending and e.elapsed >= pending[0]:
            pending.pop(0)
            snaps.append((e.elapsed, e.step, copy.deepcopy(trainer.model.state_dict())))

    loadavg = load()
    with tempfile.TemporaryDirectory() as out:
        trainer = Trainer(CORPUS, model_cfg, train_cfg, out, on_event=on_event)
        result = trainer.fit()
    curve = []
    for elapsed, step, state in snaps:
        snap = build_model(trainer.model_cfg)
        snap.load_state_dict(state)
        curve.append((round(elapsed, 1), step, score(snap, tokenizer, batches.val)))
    ctx = model_cfg.context
    run = {
        "name": "tiny" + "".join(f" {k}={v}" for k, v in (overrides or {}).items()),
        "seed": seed,
        "load": loadavg,
        "steps": result.step,
        "seconds": round(result.train_seconds, 1),
        "tokens_per_s": round(result.step * train_cfg.batch_size * ctx / result.train_seconds),
        "val_loss": score(trainer.model, tokenizer, batches.val) if scored else None,
        "curve": curve,
    }
    if len(stamps) > SKIP + 1:  # the speed after the first steps (allocations, first-touch of the data)
        run["steady_tokens_per_s"] = round(
            (len(stamps) - 1 - SKIP) * train_cfg.batch_size * ctx / (stamps[-1] - stamps[SKIP])
        )
    return run


def reference_speed(tokenizer, batches: Batches, iters: int) -> dict:
    """The recipe's steady tokens/s over `iters` iterations (the first SKIP left out), not scored."""
    stamps = []
    loadavg = load()
    recipe = dict(nanogpt.RECIPE, max_iters=iters - 1, lr_decay_iters=iters - 1, warmup_iters=1)
    nanogpt.train(np.asarray(batches.train), tokenizer.vocab_size, recipe, lambda i, t, m: stamps.append(t))
    tokens = (len(stamps) - 1 - SKIP) * recipe["batch_size"] * recipe["block_size"]
    return {"name": "reference", "load": loadavg, "steady_tokens_per_s": round(tokens / (stamps[-1] - stamps[SKIP]))}


def parse_variant(text: str) -> tuple[dict, int | None]:
    """'context=128 batch_size=32 tokens=1500000' -> ({"context": 128, "batch_size": 32}, 1500000)"""
    overrides = parse_set(text.split())
    return overrides, overrides.pop("tokens", None)


def speed(tokenizer, batches: Batches, variants: list[str], rounds: int, seconds: float) -> None:
    """Steady tokens/s of the recipe and of each variant, interleaved round by round; each run ~`seconds`
    long (its step count from the first round's speed). Prints each run, then the medians and the ratio of
    each to the recipe's (and the tokens each would see in the recipe's 2001 iterations' time)."""
    runs, steps = [], {}
    for r in range(rounds):
        ref_iters = steps.get("reference", 20)
        ref = reference_speed(tokenizer, batches, ref_iters)
        steps["reference"] = max(SKIP + 5, round(seconds * ref["steady_tokens_per_s"] / 768))
        runs.append(dict(ref, round=r))
        print(json.dumps(runs[-1]), flush=True)
        for v in variants:
            overrides, _ = parse_variant(v)
            settings = {k: val for part in (*preset("transformer", "tiny"), overrides) for k, val in part.items()}
            per_step = settings["batch_size"] * settings["context"]
            run = charlm(tokenizer, batches, 1337, None, steps.get(v, 8) * per_step, overrides=overrides, scored=False)
            steps[v] = max(SKIP + 5, round(seconds * run["steady_tokens_per_s"] / per_step))
            run = dict(run, name=v or "tiny", round=r)
            del run["curve"], run["val_loss"]
            runs.append(run)
            print(json.dumps(run), flush=True)
    by = {}
    for run in runs:
        if run["round"] > 0 or rounds == 1:  # the first round sets the step counts (and warms up)
            by.setdefault(run["name"], []).append(run["steady_tokens_per_s"])
    ref = statistics.median(by["reference"])
    for name, speeds in by.items():
        m = statistics.median(speeds)
        print(
            f"{name}: median {m:.0f} tokens/s over {len(speeds)} runs ({', '.join(map(str, speeds))}), "
            f"{m / ref:.3f}x the recipe's: {RECIPE_TOKENS * m / ref:,.0f} tokens in the recipe's time"
        )


def lstm_speed(precision: str, steps: int = 30) -> dict:
    """Training throughput (chars/s) of a 2-layer 256-wide LSTM at batch 64, context 64."""
    tok, path, _ = prepare(CORPUS, "char", None)
    batches = Batches(load_tokens(path), context=64)
    cfg = ModelConfig(kind="lstm", vocab_size=tok.vocab_size, n_layers=2, d_model=256, context=64)
    model = build_model(cfg)
    opt = make_optimizer(model, TrainConfig(optimizer="adamw"), "cpu")
    gen = torch.Generator().manual_seed(0)
    dtype = autocast_dtype("cpu", precision)  # as the trainer does
    autocast = torch.autocast("cpu", dtype=dtype) if dtype else nullcontext()
    times = []
    for i in range(steps + 5):
        t0 = time.perf_counter()
        x, y = batches.get_batch("train", 64, gen)
        with autocast:
            _, loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if i >= 5:  # skip warm-up steps
            times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    return {
        "name": f"lstm 2x256 b64 t64 {precision}",
        "autocast": str(dtype),
        "ms_per_step": round(med * 1000, 1),
        "chars_per_s": round(64 * 64 / med),
    }


def parse_set(items: list[str]) -> dict:
    """--set batch_size=32 --set compile=true -> {"batch_size": 32, "compile": True}"""
    out = {}
    for item in items:
        key, _, value = item.partition("=")
        try:
            out[key] = json.loads(value)
        except ValueError:  # a plain word: precision=bf16, positions=learned
            out[key] = value
    return out


def summary(runs: list[dict]) -> None:
    by = {}
    for r in runs:
        by.setdefault(r["name"], []).append(r)
    med = {
        n: {k: statistics.median(r[k] for r in rs) for k in ("val_loss", "tokens_per_s", "seconds", "steps")}
        for n, rs in by.items()
    }
    for n, m in med.items():
        print(
            f"{n}: median val loss {m['val_loss']:.4f}, {m['tokens_per_s']:.0f} tokens/s, {m['steps']:.0f} steps "
            f"in {m['seconds']:.1f} s over {len(by[n])} run(s)",
            flush=True,
        )
    if "reference" in med and len(med) > 1:
        ref = med["reference"]
        for n, m in med.items():
            if n != "reference":
                print(
                    f"{n} / reference: val loss {m['val_loss'] / ref['val_loss']:.3f}x "
                    f"({m['val_loss'] - ref['val_loss']:+.4f} nats/char), tokens/s {m['tokens_per_s'] / ref['tokens_per_s']:.2f}x"
                )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3, help="pairs of runs (reference, then charlm)")
    ap.add_argument(
        "--ref-iters",
        type=int,
        default=nanogpt.RECIPE["max_iters"],
        help="the reference's max_iters and lr_decay_iters (2000 as published; less for a quick check)",
    )
    ap.add_argument("--only", choices=["tiny"], help="charlm only, for --budget seconds or --tokens tokens")
    ap.add_argument("--budget", type=float, help="with --only tiny: seconds of training per run")
    ap.add_argument(
        "--tokens", type=int, help="with --only tiny: train exactly this many tokens (an idea's gain per token)"
    )
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a setting of the tiny preset (ModelConfig/TrainConfig field names)",
    )
    ap.add_argument(
        "--curve-pairs",
        type=int,
        help="score the loss-vs-time snapshots of the first N pairs only (each costs 6 evaluations)",
    )
    ap.add_argument("--first-seed", type=int, default=1337, help="the seed of the first pair (then +1 each)")
    ap.add_argument("--threads", type=int, help="torch threads for both (default: torch's own choice)")
    ap.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="'KEY=VALUE ...'",
        help="with --only tiny or --speed: a set of overrides (tokens=N: its own token count), run interleaved",
    )
    ap.add_argument("--speed", action="store_true", help="steady tokens/s of the recipe and each --variant")
    ap.add_argument("--speed-seconds", type=float, default=8.0, help="--speed: seconds per run")
    ap.add_argument("--lstm-speed", action="store_true")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs, "
        f"native bf16: {torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()}",
        flush=True,
    )
    if args.lstm_speed:
        for _ in range(args.repeat):  # alternate, so noise hits both alike
            for precision in ("fp32", "auto"):
                print(json.dumps(lstm_speed(precision)), flush=True)
        return
    tokenizer, path, _ = prepare(CORPUS, "char", None)
    batches = Batches(load_tokens(path), context=64)  # the split does not depend on the context
    if args.speed:
        speed(tokenizer, batches, args.variant or [""], args.repeat, args.speed_seconds)
        return
    overrides, runs = parse_set(args.set), []
    for i in range(args.repeat):
        seed = args.first_seed + i
        if args.only and args.variant:  # each variant in turn, one seed per round
            for v in args.variant:
                extra, tokens = parse_variant(v)
                run = charlm(tokenizer, batches, seed, args.budget, tokens or args.tokens, overrides=overrides | extra)
                runs.append(dict(run, name=v or "tiny"))
                print(json.dumps(runs[-1]), flush=True)
            continue
        if args.only:
            runs.append(charlm(tokenizer, batches, seed, args.budget, args.tokens, overrides=overrides))
        else:
            ref = reference(tokenizer, batches, seed, args.ref_iters, args.curve_pairs is None or i < args.curve_pairs)
            print(json.dumps(ref), flush=True)
            runs.append(ref)
            runs.append(
                charlm(
                    tokenizer, batches, seed, ref["seconds"], times=[t for t, _, _ in ref["curve"]], overrides=overrides
                )
            )
        print(json.dumps(runs[-1]), flush=True)
    summary(runs)


if __name__ == "__main__":
    main()
