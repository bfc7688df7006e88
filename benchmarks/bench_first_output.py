"""First visible output: seconds from launching a command in a terminal (a pseudo-terminal, 80 × 24) to the
first character it draws, and to its exit, for chat, sample, compare, eval and attn; this checkout against
another side by side (e.g. the code before issue 28), interleaved round by round, medians over the rounds.

    git archive 63c7d7e charlm | tar -x -C /tmp/old
    python benchmarks/bench_first_output.py --compare /tmp/old --rounds 5

Tiny runs (2 layers × 64, a Transformer and an LSTM) are trained once, for 20 steps. --cold-numba gives every run
of this checkout an empty numba cache (NUMBA_CACHE_DIR), as on a machine's first generation, when the compiled
decode step (models/compiled_decode.py) compiles on a background thread while the numpy step serves.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pexpect

from charlm.runtime import cpu_name

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "corpora" / "tinyshakespeare.txt"


def train(where: Path, kind: str) -> Path:
    run = where / kind
    subprocess.run(
        [sys.executable, "-m", "charlm", "train", str(where / "small.txt"), "--model", kind, "--out", str(run),
         "--steps", "20", "--layers", "2", "--d-model", "64", "--heads", "2", "--context", "64",
         "--sample-tokens", "0", "--eval-iters", "1", "--device", "cpu"],
        check=True, stdout=subprocess.DEVNULL, env={**os.environ, "CHARLM_CACHE": str(where / "cache"),
                                                    "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    return run


def commands(tf: Path, lstm: Path) -> dict[str, list[str]]:
    heldout = str(ROOT / "corpora" / "heldout-sonnets.txt")
    return {
        "--version": ["--version"],  # the floor: Python, Click and charlm's command line, no model
        "chat": ["chat", str(tf)],
        "sample": ["sample", str(tf), "-p", "ROMEO:", "-n", "20", "--seed", "1"],
        "compare": ["compare", str(tf), str(lstm), "-p", "ROMEO:", "-n", "20", "--seed", "1"],
        "eval (LSTM)": ["eval", str(lstm), heldout],
        "attn": ["attn", str(tf), "-p", "To be, or not to be"],
    }


def timed(args: list[str], pythonpath: str, cwd: Path, cold_numba: bool = False) -> tuple[float, float]:
    """(seconds to the first character drawn, seconds to the exit) of `charlm ARGS` in a terminal."""
    env = {**os.environ, "PYTHONPATH": pythonpath, "CHARLM_CACHE": str(cwd / "cache"), "TERM": "xterm-256color"}
    if cold_numba:
        env["NUMBA_CACHE_DIR"] = tempfile.mkdtemp(dir=cwd)
    t0 = time.perf_counter()
    child = pexpect.spawn(sys.executable, ["-m", "charlm", *args], env=env, cwd=str(cwd), dimensions=(24, 80),
                          encoding="utf-8", timeout=120)  # fmt: skip
    child.expect(r"[^\s\x1b\[\]?;0-9a-zA-Z]|[a-zA-Z]{2}")  # a drawn character, not an escape sequence
    first = time.perf_counter() - t0
    if args[0] == "chat":
        child.expect_exact(">>> ")
        child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    return first, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--compare", help="another checkout's charlm/ (its parent folder), run side by side")
    ap.add_argument("--cold-numba", action="store_true", help="an empty numba cache for every run of this checkout")
    ap.add_argument("--only", nargs="+", help="only these commands (e.g. sample chat)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "small.txt").write_text(CORPUS.read_text(encoding="utf-8")[:100_000], encoding="utf-8")
        cmds = commands(train(tmp, "transformer"), train(tmp, "lstm"))
        cmds = {k: v for k, v in cmds.items() if not args.only or k.split()[0] in args.only}
        sides = {"this": str(ROOT)} | ({"compare": args.compare} if args.compare else {})
        times: dict[tuple[str, str], list[tuple[float, float]]] = {}
        loads = []
        for _ in range(args.rounds):
            for name, cmd in cmds.items():
                for side, path in sides.items():
                    loads.append(os.getloadavg()[0])
                    times.setdefault((name, side), []).append(timed(cmd, path, tmp, args.cold_numba and side == "this"))
        print(f"# {cpu_name()}, {os.cpu_count()} cores, load average {min(loads):.1f}-{max(loads):.1f}, "
              f"{args.rounds} rounds, medians in seconds")  # fmt: skip
        print("| command | " + " | ".join(f"{s}: first output | {s}: done" for s in sides) + " |")
        print("|---|" + "---:|---:|" * len(sides))
        for name in cmds:
            cells = []
            for side in sides:
                firsts, dones = zip(*times[(name, side)])
                cells += [f"{statistics.median(firsts):.2f}", f"{statistics.median(dones):.2f}"]
            print(f"| `charlm {name}` | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
