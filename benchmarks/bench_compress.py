"""Compression and distillation, measured (issue 30; results in benchmarks/HISTORY.md, "Compression").

    python benchmarks/bench_compress.py load RUN
        # load time through checkpoint.load and tokens/s: the run, and int8/int4/pruned copies of it
    python benchmarks/bench_compress.py rankings LSTM_RUN
        # which units to drop: compress's ranking against random, the gradient estimate, single-unit knockouts
    python benchmarks/bench_compress.py distill TEACHER CORPUS --seeds 3 --max-time 60s --out DIR
    python benchmarks/bench_compress.py distill TEACHER CORPUS --seeds 3 --steps 300 --out DIR2  # equal steps
        # the same student (--layers 2 --d-model 64) with and without the teacher, at the same wall time,
        # each seed's pair trained back to back (a busy CPU then slows both alike), every student scored on the
        # same validation tokens; beside them chance, the best shortcut (unigram) and the teacher

The --report table itself is `charlm compress RUN --report` (run with OMP_NUM_THREADS=1 on a shared CPU).
Every training run here is a normal `charlm train` process at one thread.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from charlm.commands.compress import compress
from charlm.compress import compare_to, load_seconds, log_probs, scored_text, tokens_per_s
from charlm.data import Batches, bits_per_char, encode_corpus, load_tokens
from charlm.options import CompressOptions
from charlm.storage import checkpoint

STUDENT = ["--layers", "2", "--d-model", "64"]


def load(run: str) -> None:
    """Load time and generation speed of the run and its int8, int4 and one-head-a-layer-fewer copies; the
    speeds measured round-robin (5 rounds of 200 tokens at one thread, the best of each) so that a busy CPU
    slows them alike."""
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        rows = [("float32 (the run)", checkpoint.resolve(run))]
        for name, bits, heads in (("int8", 8, 0), ("int4", 4, 0), ("float32 -1 head/layer", 32, 1)):
            compress(run, CompressOptions(to=f"{tmp}/{name}", bits=bits, drop_heads=heads, tokens=1024))
            rows.append((name, Path(f"{tmp}/{name}") / checkpoint.BEST))
        loaded = [checkpoint.load(path) for _, path in rows]
        speed = [0.0] * len(rows)
        for _ in range(5):
            for i, ck in enumerate(loaded):
                speed[i] = max(speed[i], tokens_per_s(ck, repeats=1))
        print("| file | bytes | load (best of 5) | tokens/s, 1 thread (best of 5, round-robin) |")
        print("|---|---:|---:|---:|")
        for (name, path), tps in zip(rows, speed):
            print(f"| {name} | {path.stat().st_size:,} | {load_seconds(path, 5) * 1000:.0f} ms | {tps:,.0f} |")


def rankings(run: str, tokens: int) -> None:
    """Which units to drop: compress's ranking against a random choice, the gradient estimate and single-unit
    knockouts (the loss with each unit's gate rows zeroed, on 8 windows), each at 1/8, 1/4 and 1/2 of a layer."""
    from charlm.compress import _gate_rows, drop_units, unit_importance
    from charlm.models import build_model

    torch.set_num_threads(1)
    ck = checkpoint.load(run)
    text = scored_text(ck, None, tokens)
    probe, m, cfg = text.rows[: len(text.rows) // 8], ck.model, ck.model_config
    state = {k: v.detach().clone() for k, v in m.state_dict().items()}
    with torch.no_grad():
        base = float(m(probe[:8, :-1], probe[:8, 1:])[1])
        knocked = np.zeros((cfg.n_layers, cfg.hidden_size))
        for layer in range(cfg.n_layers):
            params = [getattr(m.rnn, f"{k}_l{layer}") for k in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]
            for u in range(cfg.hidden_size):
                rows = _gate_rows(cfg, [u])
                kept = [p[rows].clone() for p in params]
                for p in params:
                    p[rows] = 0
                knocked[layer, u] = float(m(probe[:8, :-1], probe[:8, 1:])[1]) - base
                for p, v in zip(params, kept):
                    p[rows] = v
    full = compare_to(log_probs(m, text.rows), log_probs(m, text.rows), text.rows)[0]
    # the gradient estimate, as compress measured it before (|dL/dm| for a factor m on the unit's gate rows)
    gates = {"lstm": 4, "gru": 3}[cfg.kind]
    m.zero_grad(set_to_none=True)
    with torch.enable_grad():
        m(probe[:, :-1], probe[:, 1:])[1].backward()
    grad = np.stack(
        [
            sum(
                (p.detach() * p.grad).reshape(gates * cfg.hidden_size, -1).sum(1)
                for p in (getattr(m.rnn, f"{k}_l{layer}") for k in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"))
            )
            .reshape(gates, cfg.hidden_size)
            .sum(0)
            .abs()
            .numpy()
            for layer in range(cfg.n_layers)
        ]
    )
    ranks = {
        "random (seed 0)": np.random.default_rng(0).random(knocked.shape),
        "gradient estimate": grad,
        "single-unit knockout": knocked,
        "output RMS × outgoing weights (compress)": unit_importance(m, probe),
    }
    ks = [cfg.hidden_size // 8, cfg.hidden_size // 4, cfg.hidden_size // 2]
    print(f"{run}: {text.rows[:, 1:].numel():,} tokens of {text.source}; units dropped from each layer")
    print("| ranking | " + " | ".join(f"-{k} units" for k in ks) + " |\n|---|" + "---:|" * len(ks))
    for name, rank in ranks.items():
        cells = []
        for k in ks:
            c, st, _ = drop_units(cfg, state, rank, k)
            small = build_model(c)
            small.load_state_dict(st)
            nats = compare_to(log_probs(m, text.rows), log_probs(small.eval(), text.rows), text.rows)[0]
            cells.append(
                f"{bits_per_char(nats, text.chars_per_token) - bits_per_char(full, text.chars_per_token):+.3f}"
            )
        print(f"| {name} | " + " | ".join(cells) + " |")


def train(corpus: str, out: Path, seed: int, budget: list[str], teacher: str | None, extra: list[str]) -> None:
    cmd = [sys.executable, "-m", "charlm", "train", corpus, *STUDENT, "--seed", str(seed), *budget]
    cmd += ["--out", str(out), "--sample-tokens", "0", *extra, *(["--teacher", teacher] if teacher else [])]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)


def distill(teacher: str, corpus: str, seeds: int, budget: list[str], out: Path, extra: list[str]) -> None:
    torch.set_num_threads(1)
    t = checkpoint.load(teacher)
    text = scored_text(t, None, 32768)
    t_nats, _, _ = compare_to(log_probs(t.model, text.rows), log_probs(t.model, text.rows), text.rows)
    # the best shortcut: each token's frequency in the training part (add-one), the best guess without context
    c = t.saved.corpus
    train_ids = Batches(
        load_tokens(encode_corpus(c.path, t.tokenizer, sha256=c.sha256)), 64, t.train_config.val_fraction
    ).train
    counts = np.bincount(np.asarray(train_ids), minlength=t.model_config.vocab_size) + 1
    p = counts / counts.sum()
    unigram = -float(np.log(p[text.rows[:, 1:].reshape(-1).numpy()]).mean())
    rows = {"without teacher": [], "with teacher": []}
    for seed in range(seeds):
        for name, with_teacher in (("without teacher", False), ("with teacher", True)):
            run = out / f"{'with' if with_teacher else 'without'}-{seed}"
            if not (run / checkpoint.BEST).exists():
                train(corpus, run, 1000 + seed, budget, teacher if with_teacher else None, extra)
            ck = checkpoint.load(run)
            nats, top1, kl = compare_to(log_probs(t.model, text.rows), log_probs(ck.model, text.rows), text.rows)
            rows[name].append((bits_per_char(nats, text.chars_per_token), ck.saved.step, top1))
    c = text.chars_per_token
    print(
        f"students: {' '.join(STUDENT + extra)}, {' '.join(budget)} each, seeds 1000..{999 + seeds}; teacher {teacher}"
    )
    print(f"scored on {text.rows[:, 1:].numel():,} tokens of {text.source}\n")
    print("| student | bits/char per seed | mean | steps per seed | top-1 agreement with the teacher |")
    print("|---|---|---:|---|---|")
    for name, got in rows.items():
        bpc = [b for b, _, _ in got]
        print(
            f"| {name} | {', '.join(f'{b:.3f}' for b in bpc)} | {statistics.mean(bpc):.3f} | "
            f"{', '.join(str(s) for _, s, _ in got)} | {', '.join(f'{a:.1%}' for _, _, a in got)} |"
        )
    vocab = t.model_config.vocab_size
    print(f"\nchance (uniform over {vocab} tokens): {bits_per_char(math.log(vocab), c):.3f} bits/char; ", end="")
    print(f"unigram shortcut: {bits_per_char(unigram, c):.3f}; teacher: {bits_per_char(t_nats, c):.3f}")
    diffs = [w[0] - wo[0] for w, wo in zip(rows["with teacher"], rows["without teacher"])]
    print(f"with − without, per seed: {', '.join(f'{d:+.3f}' for d in diffs)} bits/char")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    a = sub.add_parser("load")
    a.add_argument("run")
    r = sub.add_parser("rankings")
    r.add_argument("run")
    r.add_argument("--tokens", type=int, default=32768)
    d = sub.add_parser("distill")
    d.add_argument("teacher")
    d.add_argument("corpus")
    d.add_argument("--seeds", type=int, default=3)
    d.add_argument("--max-time", default="60s")
    d.add_argument("--steps", type=int, help="the same steps for every student instead of the same time")
    d.add_argument("--out", type=Path, required=True)
    d.add_argument("--extra", nargs="*", default=[], help="more flags for every student (e.g. --distill-weight 0.8)")
    args = ap.parse_args()
    if args.what == "load":
        load(args.run)
    elif args.what == "rankings":
        rankings(args.run, args.tokens)
    else:
        budget = ["--steps", str(args.steps)] if args.steps else ["--max-time", args.max_time]
        distill(args.teacher, args.corpus, args.seeds, budget, args.out, args.extra)


if __name__ == "__main__":
    main()
