"""Large corpora: encode time, peak memory and cache hits for tinyshakespeare repeated 10× and 100×.

    python benchmarks/bench_corpus.py                          # char 10×, 100×; BPE 10×, 100× (~10 min on 2 cores)
    python benchmarks/bench_corpus.py --cases char:10 bpe:10   # a quick look
    python benchmarks/bench_corpus.py --cases char:100 bpe:100 --compare /work/main . --repeats 3
                                        # first runs of two checkouts, alternating: medians and ratios
    python benchmarks/bench_corpus.py --bpe-sample              # compression of BPE merges learnt from a sample

Each case builds the corpus in --dir (tinyshakespeare.txt repeated N times; 100× is 112 MB), then runs
three fresh subprocesses, one after another, so each peak RSS (resource.getrusage ru_maxrss) is that
step's alone:
  first run   charlm.data.prepare() with an empty cache: train the tokenizer, encode, write the cache
  rerun       prepare() again: the cache hit (hash the file, load the tokenizer, find the .npy)
  train       a charlm Trainer on the cached, memory-mapped tokens: 20 steps of a tiny Transformer
              (its RSS counts the mapped pages of the token file it touched: page cache, bounded by
              the file size, which the kernel can reclaim; "file-backed" shows how much)
"import" is the RSS of a process that has only imported torch and charlm: the floor under every row.
The encode rate comes from the progress callback (the time between its first and last call); "cores" is
the CPU time of the first run over its wall time (2.0 = both cores busy throughout).
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
        parts = {
            line.split(":")[0]: int(line.split()[1]) / 1024 for line in f if line.startswith(("RssAnon", "RssFile"))
        }
    return {"anon_mb": parts["RssAnon"], "file_mb": parts["RssFile"]}


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)  # all threads, Rust's included
    return r.ru_utime + r.ru_stime


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


# ---- the child processes -------------------------------------------------------------------------


def child(step: str, corpus: str, kind: str, vocab: int) -> dict:
    import torch

    from charlm import data
    from charlm.config import ModelConfig, TrainConfig
    from charlm.training.trainer import Trainer

    torch.set_num_threads(1)  # the shared 2-core machine; encoding is numpy / Rust anyway
    floor = rss_mb()
    out: dict = {"import_mb": floor}
    if step in ("first", "rerun"):
        marks: list[tuple[float, int]] = []
        cpu0, t0 = cpu_seconds(), time.perf_counter()
        tok, tokens_path, _ = data.prepare(
            corpus, kind, vocab, progress=lambda done, total: marks.append((time.perf_counter(), done))
        )
        out["seconds"] = time.perf_counter() - t0
        out["cores"] = (cpu_seconds() - cpu0) / out["seconds"]
        out["tokens"] = len(data.load_tokens(tokens_path))
        if len(marks) > 2:  # bytes encoded after the first callback, over the time they took
            (t_first, d_first), (t_last, d_last) = marks[0], marks[-1]
            out["encode_mb_s"] = (d_last - d_first) / 1e6 / (t_last - t_first)
            out["tokenizer_seconds"] = t_first - t0 - d_first / 1e6 / out["encode_mb_s"]
    else:
        model_cfg = ModelConfig(kind="transformer", n_layers=2, d_model=64, n_heads=2, context=64)
        cfg = TrainConfig(
            tokenizer=kind,
            bpe_vocab=vocab,
            steps=20,
            batch_size=16,
            eval_interval=20,
            eval_iters=2,
            sample_tokens=0,
            device="cpu",
            warmup=5,
        )
        t0 = time.perf_counter()
        run = Trainer(corpus, model_cfg, cfg, Path(os.environ["CHARLM_CACHE"]) / "run")
        out["setup_seconds"] = time.perf_counter() - t0
        run.fit()
        out["seconds"] = time.perf_counter() - t0
        out.update(rss_parts_mb())
    out["peak_mb"] = peak_mb()
    return out


def run_child(step: str, corpus: Path, kind: str, vocab: int, cache: Path, code: Path | None = None) -> dict:
    env = {**os.environ, "CHARLM_CACHE": str(cache), "OMP_NUM_THREADS": "1", "RAYON_NUM_THREADS": "2"}
    if code:  # import charlm from that checkout
        env["PYTHONPATH"] = str(code.resolve())
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


def median(xs: list[float]) -> float:
    xs = sorted(xs)
    return (xs[(len(xs) - 1) // 2] + xs[len(xs) // 2]) / 2


def compare(cases: list[str], codes: list[Path], repeats: int, vocab: int, where: Path) -> None:
    """First runs (empty cache) of each checkout in turn, `repeats` rounds, so a busy spell hits both alike."""
    rows = []
    for case in cases:
        kind, times = case.split(":")
        corpus = build(int(times), where)
        runs: dict[Path, list[dict]] = {code: [] for code in codes}
        for i in range(repeats):
            for code in codes:
                cache = where / "cache-compare"
                shutil.rmtree(cache, ignore_errors=True)
                load = os.getloadavg()[0]
                runs[code].append({**run_child("first", corpus, kind, vocab, cache, code), "load": load})
                print(json.dumps({"case": case, "code": str(code), "round": i, **runs[code][-1]}), flush=True)
                shutil.rmtree(cache, ignore_errors=True)
        rows.append((f"{kind} {times}×", runs))
    base = codes[0]
    # on a shared machine the CPU time (all threads) is steadier than the wall time
    print(
        f"\n| corpus | checkout | first run (s), median | runs (s) | vs {base} | CPU (s), median | vs {base} "
        "| peak RSS (MB), median | cores | load avg |"
    )
    print("|---|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for case, runs in rows:
        for code, rs in runs.items():
            t = median([r["seconds"] for r in rs])
            ratio = median([r["seconds"] for r in runs[base]]) / t
            cpu = median([r["cores"] * r["seconds"] for r in rs])
            cpu_ratio = median([r["cores"] * r["seconds"] for r in runs[base]]) / cpu
            each = ", ".join(f"{r['seconds']:.1f}" for r in rs)
            print(
                f"| {case} | {code} | {t:.1f} | {each} | {ratio:.2f}× | {cpu:.1f} | {cpu_ratio:.2f}× "
                f"| {median([r['peak_mb'] for r in rs]):.0f} | {median([r['cores'] for r in rs]):.2f} "
                f"| {min(r['load'] for r in rs):.1f}–{max(r['load'] for r in rs):.1f} |"
            )


def bpe_sample(vocabs: list[int], fraction: float, where: Path) -> None:
    """Merges learnt from all of tinyshakespeare's first 90% vs from a sample_corpus() of `fraction` of it
    (16 MB of a 110 MB corpus is 0.145): chars per token on its last 10% and on held-out sonnets."""
    from charlm import data
    from charlm.tokenizer import BPETokenizer

    text = "".join(data.iter_corpus(SOURCE))
    train, val = text[: int(len(text) * 0.9)], text[int(len(text) * 0.9) :]
    sonnets = "".join(data.iter_corpus(ROOT / "corpora" / "heldout-sonnets.txt"))
    path = where / "tinyshakespeare-train90.txt"
    path.write_text(train, encoding="utf-8")
    max_bytes = int(path.stat().st_size * fraction)
    print(f"\nsample: {max_bytes:,} of {path.stat().st_size:,} bytes in 64 windows")
    print("| vocab | trained on | chars/token, last 10% | chars/token, sonnets | train (s) |")
    print("|---:|---|---:|---:|---:|")
    for vocab in vocabs:
        for name, chunks in (
            ("all", lambda: data.iter_corpus(path)),
            ("sample", lambda: data.sample_corpus(path, max_bytes)),
        ):
            t0 = time.perf_counter()
            tok = BPETokenizer.train(chunks(), vocab)
            secs = time.perf_counter() - t0
            cpt = [len(t) / len(tok.encode_array(t)) for t in (val, sonnets)]
            print(f"| {vocab} | {name} | {cpt[0]:.3f} | {cpt[1]:.3f} | {secs:.1f} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", nargs="+", default=["char:10", "char:100", "bpe:10", "bpe:100"], help="kind:times")
    ap.add_argument("--vocab", type=int, default=1024, help="BPE vocabulary size")
    ap.add_argument("--reruns", type=int, default=3, help="cache-hit runs per case (median shown)")
    ap.add_argument("--dir", type=Path, default=Path("/tmp/charlm-bench-corpus"))
    ap.add_argument("--compare", nargs="+", type=Path, metavar="CHECKOUT", help="time first runs of these checkouts")
    ap.add_argument("--repeats", type=int, default=3, help="rounds of --compare")
    ap.add_argument("--bpe-sample", action="store_true", help="compare BPE merges from a sample with merges from all")
    ap.add_argument("--child", nargs=4, metavar=("STEP", "CORPUS", "KIND", "VOCAB"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        step, corpus, kind, vocab = args.child
        print(json.dumps(child(step, corpus, kind, int(vocab))))
        return

    args.dir.mkdir(parents=True, exist_ok=True)
    print(f"# {platform.node()} · {os.cpu_count()} cores · python {platform.python_version()}", flush=True)
    if args.bpe_sample:
        bpe_sample([256 + 256, 1024, 2048, 4096], 16 / 110, args.dir)
        return
    if args.compare:
        compare(args.cases, args.compare, args.repeats, args.vocab, args.dir)
        return
    rows = []
    for case in args.cases:
        kind, times = case.split(":")
        corpus = build(int(times), args.dir)
        cache = args.dir / f"cache-{kind}-x{times}"
        shutil.rmtree(cache, ignore_errors=True)
        first = run_child("first", corpus, kind, args.vocab, cache)
        reruns = sorted(run_child("rerun", corpus, kind, args.vocab, cache)["seconds"] for _ in range(args.reruns))
        train = run_child("train", corpus, kind, args.vocab, cache)
        row = {
            "case": f"{kind} {times}×",
            "mb": corpus.stat().st_size / 1e6,
            "first": first,
            "rerun_median_s": reruns[len(reruns) // 2],
            "reruns_s": reruns,
            "train": train,
            "cache_mb": sum(p.stat().st_size for p in (cache / "tokens").glob("*.npy")) / 1e6,
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
        shutil.rmtree(cache, ignore_errors=True)

    print(
        "\n| corpus | MB | tokens | first run (s) | of which tokenizer (s) | encode MB/s | peak RSS first run (MB) "
        "| rerun, cache hit (s) | peak RSS train (MB) | of which file-backed (MB) | token cache (MB) | import RSS (MB) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        f, t = r["first"], r["train"]
        print(
            f"| {r['case']} | {r['mb']:.0f} | {f['tokens']:,} | {f['seconds']:.1f} | {f.get('tokenizer_seconds', 0):.1f} "
            f"| {f.get('encode_mb_s', 0):.1f} | {f['peak_mb']:.0f} | {r['rerun_median_s']:.2f} | {t['peak_mb']:.0f} "
            f"| {t['file_mb']:.0f} | {r['cache_mb']:.0f} | {f['import_mb']:.0f} |"
        )


if __name__ == "__main__":
    main()
