"""Start-up: how long a command takes from the shell's Enter to its exit, against `python -c "import torch"`,
the floor for anything that runs a model. Whole processes, interleaved round by round (a noisy machine
hurts every variant alike), medians over the rounds.

    python benchmarks/bench_startup.py                      # this checkout, 7 rounds
    python benchmarks/bench_startup.py --compare /tmp/old   # side by side with another checkout's charlm/
    python benchmarks/bench_startup.py --importtime         # and where `charlm sample` spends its imports

A tiny run is trained once (a few seconds) for the commands that need one. --compare DIR runs the same
commands with PYTHONPATH=DIR (e.g. `git archive a2397db charlm | tar -x -C /tmp/old`).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "corpora" / "tinyshakespeare.txt"


def commands(run: Path) -> dict[str, list[str]]:
    charlm = [sys.executable, "-m", "charlm"]
    return {
        "python -c 'import torch'": [sys.executable, "-c", "import torch"],
        "charlm --help": [*charlm, "--help"],
        "charlm train --help": [*charlm, "train", "--help"],
        "charlm train (a bad flag)": [*charlm, "train", str(CORPUS), "--lr", "-1"],
        "charlm runs": [*charlm, "runs", str(run.parent)],
        "charlm info RUN": [*charlm, "info", str(run)],
        "charlm plot RUN": [*charlm, "plot", str(run)],
        "charlm sample RUN -p The -n 20": [*charlm, "sample", str(run), "-p", "The", "-n", "20", "--seed", "1"],
        "charlm attn RUN -p 'To be'": [*charlm, "attn", str(run), "-p", "To be", "--width", "80"],
    }


def seconds(cmd: list[str], pythonpath: str, cwd: Path) -> float:
    """One run of cmd with PYTHONPATH's charlm, from a folder that holds none (`python -m` looks in its
    current folder first)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": pythonpath}
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - t0


def train_run(where: Path) -> Path:
    run = where / "runs" / "tiny"
    small = CORPUS.read_text(encoding="utf-8")[:200_000]
    (where / "small.txt").write_text(small, encoding="utf-8")
    subprocess.run(
        [sys.executable, "-m", "charlm", "train", str(where / "small.txt"), "--out", str(run), "--steps", "20",
         "--layers", "2", "--d-model", "64", "--heads", "2", "--context", "64", "--sample-tokens", "0",
         "--device", "cpu"],
        check=True, stdout=subprocess.DEVNULL, env={**os.environ, "CHARLM_CACHE": str(where / "cache")},
    )  # fmt: skip
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--compare", help="another checkout whose charlm/ runs the same commands, side by side")
    ap.add_argument("--importtime", action="store_true", help="the ten slowest imports of charlm sample")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run = train_run(Path(tmp))
        sides = {"this": str(ROOT)} | ({"compare": args.compare} if args.compare else {})
        times: dict[tuple[str, str], list[float]] = {}
        for _ in range(args.rounds):
            for name, cmd in commands(run).items():
                for side, path in sides.items():
                    times.setdefault((name, side), []).append(seconds(cmd, path, Path(tmp)))
        print(f"# {platform.processor() or platform.machine()}, load {os.getloadavg()[0]:.1f}, {args.rounds} rounds")
        head = "| command | " + " | ".join(f"{s} (median s)" for s in sides) + (" | ratio |" if args.compare else "")
        print(head + "\n|---|" + "---:|" * (len(sides) + bool(args.compare)))
        for name in commands(run):
            medians = [statistics.median(times[(name, s)]) for s in sides]
            ratio = f" {medians[1] / medians[0]:.1f}× |" if args.compare else ""
            print(f"| `{name}` | " + " | ".join(f"{m:.2f}" for m in medians) + f" |{ratio}")
        if args.importtime:
            cmd = [sys.executable, "-X", "importtime", *commands(run)["charlm sample RUN -p The -n 20"][1:]]
            env = {**os.environ, "PYTHONPATH": str(ROOT)}
            err = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp, env=env).stderr.splitlines()
            rows = [line.split("|") for line in err if line.startswith("import time:") and "|" in line]
            rows = [r for r in rows if r[1].strip().isdigit()]  # not the header line
            top = sorted(rows, key=lambda r: -int(r[1]))[:10]
            print("\n| cumulative µs | module |\n|---:|---|")
            for r in top:
                print(f"| {int(r[1]):,} | `{r[2].strip()}` |")


if __name__ == "__main__":
    main()
