"""`charlm lab positions` at default size, several seeds as separate processes (one torch thread each, as the
lab runs), each process's CPU seconds measured by the kernel (user + system), then the seeds combined into one
table and reading (positions.result) as `charlm lab positions --seeds K --plain` would print it.

    python benchmarks/lab_positions.py --seeds 3 --out /tmp/positions [--quick]

Writes OUT/seed-S.json for each seed and OUT/combined.txt, and prints the combined output and the CPU seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--first", type=int, default=0)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    procs = {}
    for seed in range(a.first, a.first + a.seeds):
        cmd = [sys.executable, "-m", "charlm", "lab", "positions", "--json", "--device", "cpu", "--seed", str(seed)]
        cmd += ["--out", str(a.out / "runs")] + (["--quick"] if a.quick else [])
        out = open(a.out / f"seed-{seed}.json", "w")
        procs[subprocess.Popen(cmd, stdout=out).pid] = (seed, out)
    cpu = {}
    while procs:
        pid, status, usage = os.wait4(-1, 0)
        seed, out = procs.pop(pid)
        out.close()
        if status != 0:
            sys.exit(f"seed {seed} failed (status {status})")
        cpu[seed] = usage.ru_utime + usage.ru_stime
    print_combined(a.out, sorted(cpu), cpu)


def print_combined(out: Path, seeds: list[int], cpu: dict) -> None:
    from rich.console import Console

    from charlm.lab import positions
    from charlm.views.lab import render_lab

    parts = [json.loads((out / f"seed-{seed}.json").read_text()) for seed in seeds]
    raws = [raw for p in parts for raw in p["details"]["raw"]]
    s = {k: tuple(v) if isinstance(v, list) and k in ("lengths", "longer", "windows") else v
         for k, v in parts[0]["settings"].items()}  # fmt: skip
    runs = [os.path.relpath(run, out) for p in parts for run in p["runs"]]  # as --out DIR shows them
    # "in all": the seeds' CPU seconds where measured (their wall seconds count the wait for a busy CPU)
    result = positions.result(raws, s, runs, sum(cpu.values()) or sum(p["seconds"] for p in parts))
    console = Console(width=110, record=True, soft_wrap=False)
    render_lab(console, result, color=False)
    console.print(
        "CPU seconds a seed (user + system): " + ", ".join(f"seed {k} {cpu[k]:.0f}" for k in seeds if k in cpu)
    )
    (out / "combined.txt").write_text(console.export_text())
    (out / "combined.json").write_text(json.dumps(result.to_dict(), indent=1))


if __name__ == "__main__":
    main()
