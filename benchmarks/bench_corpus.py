"""Large corpora: encode time, peak memory and cache hits for tinyshakespeare repeated 10× and 100×.

    python benchmarks/bench_corpus.py                          # char 10×, 100×; BPE 10×, 100× (~10 min on 2 cores)
    python benchmarks/bench_corpus.py --cases char:10 bpe:10   # a quick look

Each case builds the corpus in --dir (tinyshakespeare.txt repeated N times; 100× is 112 MB), then runs
three fresh subprocesses, one after another, so each peak RSS (resource.getrusage ru_maxrss) is that
step's alone:
  first run   charlm.data.prepare() with an empty cache: train the tokenizer, encode, write the cache
  rerun       prepare() again: the cache hit (hash the file, load the tokenizer, find the .npy)
  train       a charlm Trainer on the cached, memory-mapped tokens: 20 steps of a tiny Transformer
              (its RSS counts the mapped pages of the token file it touched: page cache, bounded by
              the file size, which the kernel can reclaim; "file-backed" shows how much)
"import" is the RSS of a process that has only imported torch and charlm: the floor under every row.
The encode rate comes from the progress callback (the time between its first and last call).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "corpora" / "tinyshakespeare.txt"


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def rss_parts_mb() -> dict:
    """Resident memory now, split: anonymous (the process's own) and file-backed (mapped pages of files,
    here mostly the memory-mapped token cache: page cache the kernel can drop at any time)."""
    with open("/proc/self/status") as f:
        parts = {line.split(":")[0]: int(line.split()[1]) / 1024 for line in f if line.startswith(("RssAnon", "RssFile"))}
    return {"anon_mb": parts["RssAnon"], "file_mb": parts["RssFile"]}


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


# ---- the child processes -------------------------------------------------------------------------


def child(step: str, corpus: str, kind: str, vocab: int) -> dict:
    import torch

    from charlm import data
    from charlm.config import ModelConfig, TrainConfig
    from charlm.train import Trainer

    torch.set_num_threads(1)  # the shared 2-core machine; encoding is numpy / Rust anyway
    floor = rss_mb()
    out: dict = {"import_mb": floor}
    if step in ("first", "rerun"):
        marks: list[tuple[float, int]] = []
        t0 = time.perf_counter()
        tok, tokens_path, _ = data.prepare(corpus, kind, vocab, progress=lambda done, total: marks.append((time.perf_counter(), done)))
        out["seconds"] = time.perf_counter() - t0
        out["tokens"] = len(data.load_tokens(tokens_path))
        if len(marks) > 2:  # bytes encoded after the first callback, over the time they took
            (t_first, d_first), (t_last, d_last) = marks[0], marks[-1]
            out["encode_mb_s"] = (d_last - d_first) / 1e6 / (t_last - t_first)
            out["tokenizer_seconds"] = t_first - t0 - d_first / 1e6 / out["encode_mb_s"]
    else:
        model_cfg = ModelConfig(kind="transformer", n_layers=2, d_model=64, n_heads=2, context=64)
        cfg = TrainConfig(tokenizer=kind, vocab_size=vocab, steps=20, batch_size=16, eval_interval=20, eval_iters=2,
                          sample_tokens=0, device="cpu", warmup=5)
        t0 = time.perf_counter()
        run = Trainer(corpus, model_cfg, cfg, Path(os.environ["CHARLM_CACHE"]) / "run")
        out["setup_seconds"] = time.perf_counter() - t0
        run.fit()
        out["seconds"] = time.perf_counter() - t0
        out.update(rss_parts_mb())
    out["peak_mb"] = peak_mb()
    return out


def run_child(step: str, corpus: Path, kind: str, vocab: int, cache: Path) -> dict:
    env = {**os.environ, "CHARLM_CACHE": str(cache), "OMP_NUM_THREADS": "1", "RAYON_NUM_THREADS": "2"}
    cmd = [sys.executable, __file__, "--child", step, str(corpus), kind, str(vocab)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---- the parent ----------------------------------------------------------------------------------


def build(times: int, where: Path) -> Path:
    path = where / f"tinyshakespeare-x{times}.txt"
    if not path.exists() or path.stat().st_size != SOURCE.stat().st_size * times:
        text = SOURCE.read_bytes()
        with open(path, "wb") as f:
            for _ in range(times):
                f.write(text)
    return path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", nargs="+", default=["char:10", "char:100", "bpe:10", "bpe:100"], help="kind:times")
    ap.add_argument("--vocab", type=int, default=1024, help="BPE vocabulary size")
    ap.add_argument("--reruns", type=int, default=3, help="cache-hit runs per case (median shown)")
    ap.add_argument("--dir", type=Path, default=Path("/tmp/charlm-bench-corpus"))
    ap.add_argument("--child", nargs=4, metavar=("STEP", "CORPUS", "KIND", "VOCAB"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        step, corpus, kind, vocab = args.child
        print(json.dumps(child(step, corpus, kind, int(vocab))))
        return

    args.dir.mkdir(parents=True, exist_ok=True)
    print(f"# {platform.node()} · {os.cpu_count()} cores · python {platform.python_version()}", flush=True)
    rows = []
    for case in args.cases:
        kind, times = case.split(":")
        corpus = build(int(times), args.dir)
        cache = args.dir / f"cache-{kind}-x{times}"
        shutil.rmtree(cache, ignore_errors=True)
        first = run_child("first", corpus, kind, args.vocab, cache)
        reruns = sorted(run_child("rerun", corpus, kind, args.vocab, cache)["seconds"] for _ in range(args.reruns))
        train = run_child("train", corpus, kind, args.vocab, cache)
        row = {"case": f"{kind} {times}×", "mb": corpus.stat().st_size / 1e6, "first": first,
               "rerun_median_s": reruns[len(reruns) // 2], "reruns_s": reruns, "train": train,
               "cache_mb": sum(p.stat().st_size for p in (cache / "tokens").glob("*.npy")) / 1e6}
        rows.append(row)
        print(json.dumps(row), flush=True)
        shutil.rmtree(cache, ignore_errors=True)

    print("\n| corpus | MB | tokens | first run (s) | of which tokenizer (s) | encode MB/s | peak RSS first run (MB) "
          "| rerun, cache hit (s) | peak RSS train (MB) | of which file-backed (MB) | token cache (MB) | import RSS (MB) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        f, t = r["first"], r["train"]
        print(f"| {r['case']} | {r['mb']:.0f} | {f['tokens']:,} | {f['seconds']:.1f} | {f.get('tokenizer_seconds', 0):.1f} "
              f"| {f.get('encode_mb_s', 0):.1f} | {f['peak_mb']:.0f} | {r['rerun_median_s']:.2f} | {t['peak_mb']:.0f} "
              f"| {t['file_mb']:.0f} | {r['cache_mb']:.0f} | {f['import_mb']:.0f} |")


if __name__ == "__main__":
    main()
