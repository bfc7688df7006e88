"""Training throughput with 1 and 2 processes (torchrun, DDP over gloo) on the CPU.

    python benchmarks/bench_distributed.py               # 3 repeats, ~6 minutes on a 2-core CPU
    python benchmarks/bench_distributed.py --repeats 1   # a quick look

Each variant is a real `charlm train` (through `python -m torch.distributed.run` for 2 processes) of
the tiny preset Transformer on tinyshakespeare for --steps optimizer steps, evaluated only at the end.
Tokens/s = steps × effective batch × context / the run's train_seconds (from its checkpoint: the
training loop's own clock, so process start-up and the final evaluation are not counted). Variants run
interleaved, repeat after repeat, so a noisy shared machine hurts them alike; medians are shown.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "corpora" / "tinyshakespeare.txt"

# name: (processes, threads per process, batch per process)
VARIANTS = {
    "1 process × 1 thread, batch 32": (1, 1, 32),
    "1 process × 2 threads, batch 32": (1, 2, 32),
    "2 processes × 1 thread, batch 16 each (effective 32)": (2, 1, 16),
    "2 processes × 1 thread, batch 32 each (effective 64)": (2, 1, 32),
}


def run(nproc: int, threads: int, batch: int, steps: int, work: Path) -> float:
    from charlm.storage import checkpoint

    out = work / f"run-{nproc}-{threads}-{batch}"
    shutil.rmtree(out, ignore_errors=True)
    args = [
        "-m",
        "charlm",
        "train",
        str(CORPUS),
        "--preset",
        "tiny",
        "--device",
        "cpu",
        "--steps",
        str(steps),
        "--batch-size",
        str(batch),
        "--eval-interval",
        str(steps),
        "--eval-iters",
        "1",
        "--sample-tokens",
        "0",
        "--out",
        str(out),
    ]
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"] if nproc > 1 else []
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "CHARLM_CACHE": str(work / "cache")}
    subprocess.run([sys.executable, *launcher, *args], env=env, check=True, capture_output=True, cwd=work)
    saved = checkpoint.read_header(out / checkpoint.LAST)  # (it called checkpoint.load_raw, long gone)
    return steps * batch * nproc * saved.model_config.context / saved.train_seconds


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=60)
    args = ap.parse_args()
    results: dict[str, list[float]] = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for name, (nproc, threads, batch) in VARIANTS.items():
                results[name].append(run(nproc, threads, batch, args.steps, Path(tmp)))
                print(f"repeat {r + 1}: {name}: {results[name][-1]:,.0f} tok/s", flush=True)
    base = statistics.median(results[next(iter(VARIANTS))])
    print(f"\n# {platform.node()} · {os.cpu_count()} cores · {args.steps} steps · median of {args.repeats}")
    print("| variant | tokens/s (median) | runs | vs 1 process × 1 thread |")
    print("|---|---:|---|---:|")
    for name, values in results.items():
        m = statistics.median(values)
        print(f"| {name} | {m:,.0f} | {', '.join(f'{v:,.0f}' for v in values)} | {m / base:.2f}× |")


if __name__ == "__main__":
    main()
