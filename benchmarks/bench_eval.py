"""LSTM scoring speed: `charlm eval` of an LSTM, tokens per second, this checkout against another (e.g. the
code before issue 28), side by side. Whole processes, interleaved round by round (a busy machine hurts both
alike), torch's default threads as the CLI runs it; medians over the rounds. Each process times only
charlm.evaluate.evaluate_file (encoding + scoring), after loading the model.

    git archive 63c7d7e charlm | tar -x -C /tmp/old
    python benchmarks/bench_eval.py --compare /tmp/old --rounds 5

The model is the `tiny` LSTM preset's shape (2 layers × 256, char, context 64), trained for 5 steps: its
speed does not depend on its training. The texts: corpora/heldout-sonnets.txt (3,078 characters, the
issue's example) and the last 30,000 characters of corpora/tinyshakespeare.txt.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from charlm.runtime import cpu_name

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "corpora" / "tinyshakespeare.txt"

TIME_ONE = """
import json, sys, time
from charlm.storage import checkpoint
from charlm.evaluate import evaluate_file
ck = checkpoint.load(sys.argv[1], device="cpu")
t0 = time.perf_counter()
r = evaluate_file(ck.model, ck.tokenizer, sys.argv[2])
print(json.dumps({"tokens": r.tokens, "seconds": time.perf_counter() - t0, "bpc": r.bits_per_char}))
"""


def train_run(where: Path) -> Path:
    run = where / "lstm"
    subprocess.run(
        [sys.executable, "-m", "charlm", "train", str(CORPUS), "--model", "lstm", "--out", str(run), "--steps", "5",
         "--sample-tokens", "0", "--eval-iters", "1", "--device", "cpu"],
        check=True, stdout=subprocess.DEVNULL, env={**os.environ, "CHARLM_CACHE": str(where / "cache"),
                                                    "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    return run


def score(run: Path, text: Path, pythonpath: str, cwd: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": pythonpath, "CHARLM_CACHE": str(cwd / "cache")}
    out = subprocess.run([sys.executable, "-c", TIME_ONE, str(run), str(text)], env=env, cwd=cwd,
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    return json.loads(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--compare", help="another checkout's charlm/ (its parent folder), run side by side")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        run = train_run(tmp)
        long_text = tmp / "shakespeare-tail.txt"
        long_text.write_text(CORPUS.read_text(encoding="utf-8")[-30_000:], encoding="utf-8")
        texts = {"heldout-sonnets.txt": ROOT / "corpora" / "heldout-sonnets.txt", "30k chars": long_text}
        sides = {"this": str(ROOT)} | ({"compare": args.compare} if args.compare else {})
        rates: dict[tuple[str, str], list[float]] = {}
        bpc: dict[tuple[str, str], float] = {}
        loads = []
        for _ in range(args.rounds):
            for name, text in texts.items():
                for side, path in sides.items():
                    loads.append(os.getloadavg()[0])
                    r = score(run, text, path, tmp)
                    rates.setdefault((name, side), []).append(r["tokens"] / r["seconds"])
                    bpc[(name, side)] = r["bpc"]
        print(f"# {cpu_name()}, {os.cpu_count()} cores, load average {min(loads):.1f}-{max(loads):.1f}, "
              f"{args.rounds} rounds")  # fmt: skip
        head = (
            "| text | " + " | ".join(f"{s} (median tokens/s)" for s in sides) + (" | ratio |" if args.compare else "")
        )
        print(head + "\n|---|" + "---:|" * (len(sides) + bool(args.compare)))
        for name in texts:
            medians = [statistics.median(rates[(name, s)]) for s in sides]
            ratio = f" {medians[0] / medians[1]:.1f}× |" if args.compare else ""
            print(f"| {name} | " + " | ".join(f"{m:,.0f}" for m in medians) + f" |{ratio}")
        for name in texts:  # the same score from both: the chunking cannot change it
            print(f"bits/char on {name}: " + ", ".join(f"{s} {bpc[(name, s)]:.6f}" for s in sides))


if __name__ == "__main__":
    main()
