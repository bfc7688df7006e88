"""Compression and distillation, measured (issue 30; results in benchmarks/RESULTS.md, "Compression").

    python benchmarks/bench_compress.py load RUN
        # load time through checkpoint.load: the run, and int8/int4 copies of it (best of 5 each)
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

from charlm import checkpoint
from charlm.commands.compress import compress
from charlm.compress import compare_to, load_seconds, log_probs, scored_text
from charlm.config import CompressOptions
from charlm.data import Batches, bits_per_char, encode_corpus, load_tokens

STUDENT = ["--layers", "2", "--d-model", "64"]


def load(run: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        rows = [("float32 (the run)", checkpoint.resolve(run))]
        for bits in (8, 4):
            compress(run, CompressOptions(to=f"{tmp}/{bits}", bits=bits, tokens=1024))
            rows.append((f"int{bits}", Path(f"{tmp}/{bits}/best.pt")))
        print("| file | bytes | load (best of 5) |\n|---|---:|---:|")
        for name, path in rows:
            print(f"| {name} | {path.stat().st_size:,} | {load_seconds(path, 5) * 1000:.0f} ms |")


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
            if not (run / "best.pt").exists():
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
    else:
        budget = ["--steps", str(args.steps)] if args.steps else ["--max-time", args.max_time]
        distill(args.teacher, args.corpus, args.seeds, budget, args.out, args.extra)


if __name__ == "__main__":
    main()
