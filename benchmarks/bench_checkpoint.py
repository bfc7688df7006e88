"""Checkpoint load time, peak memory and file size: safetensors (best/last.safetensors) against the format
before it (torch.save's best.pt / last.pt, read by storage/safe_pickle.py and torch.load), for the Transformer's tiny
and medium presets, side by side.

    python benchmarks/bench_checkpoint.py              # 7 rounds
    python benchmarks/bench_checkpoint.py --rounds 3

For each preset a model is built, stepped once by its real optimizer (so last holds Adam/Muon moments), and
written both ways with the same contents: last (weights + training state) and best (weights; an older charlm
wrote the training state into best too, so its best.pt is shown as it was). Each measurement is a fresh
process (interleaved round by round: a busy machine hurts every variant alike), median over the rounds:
  load     checkpoint.load(path): every check, then a ready model (what sample/chat/eval do first)
  header   checkpoint.read_header(path): what info and runs do, without torch
  peak     the process's peak resident memory during the call over its resident memory before it (MB; Linux's
           VmHWM, reset before the call), torch already imported: the mapped file's pages count too
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

MEASURE = """
import json, sys, time
import torch
from charlm.storage import checkpoint
def status(key):
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith(key + ":")) / 1024
what, path = sys.argv[1], sys.argv[2]
open("/proc/self/clear_refs", "w").write("5")  # the peak (VmHWM) starts again from here
before = status("VmRSS")
t0 = time.perf_counter()
loaded = (checkpoint.load if what == "load" else checkpoint.read_header)(path)
seconds = time.perf_counter() - t0
print(json.dumps({"s": seconds, "peak_mb": status("VmHWM") - before}))
"""


def write_checkpoints(preset: str, where: Path) -> dict[str, Path]:
    import torch

    from charlm.config import ModelConfig, TrainConfig
    from charlm.models import build_model, count_params
    from charlm.presets import preset as preset_sizes
    from charlm.storage import checkpoint
    from charlm.storage.checkpoint import Corpus, Saved
    from charlm.tokenizer import CharTokenizer
    from charlm.training.optim import make_optimizer

    model_sizes, train_sizes = preset_sizes("transformer", preset)
    chars = [chr(c) for c in range(32, 32 + 65)]
    model_cfg = ModelConfig(kind="transformer", vocab_size=len(chars), **model_sizes)
    train_cfg = TrainConfig(device="cpu", **train_sizes)
    torch.manual_seed(0)
    model = build_model(model_cfg)
    opt = make_optimizer(model, train_cfg, "cpu")
    x = torch.randint(0, len(chars), (2, 16))
    model(x, x)[1].backward()
    opt.step()
    common = dict(
        run_name=preset,
        model_config=model_cfg,
        train_config=train_cfg,
        tokenizer=CharTokenizer(chars).to_json(),
        model=model.state_dict(),
        step=1,
        train_seconds=1.0,
        best_val_loss=2.0,
        best_val_bpc=2.9,
        params=count_params(model),
        corpus=Corpus(name="c.txt", sha256="0" * 64, train_tokens=1000, val_tokens=100, chars_per_token=1.0),
    )
    state = dict(
        optimizer=opt.state_dict(), rng={"data": torch.Generator().get_state(), "torch": torch.get_rng_state()}
    )
    files = {}
    for name, training in (("last", True), ("best", False)):
        saved = Saved(**common, **(state if training else {}))
        files[f"{name}.safetensors"] = where / f"{preset}-{name}.safetensors"
        checkpoint.save(saved, files[f"{name}.safetensors"])
        files[f"{name}.pt"] = where / f"{preset}-{name}.pt"
        old = Saved(**common, **state)  # an older charlm wrote the training state into best.pt too
        torch.save({**old.to_payload(), "version": 2}, files[f"{name}.pt"])
    return files


def measure(what: str, path: Path) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", MEASURE, what, str(path)],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
    )
    return json.loads(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--presets", default="tiny,medium")
    args = ap.parse_args()
    print(f"machine: {platform.processor() or platform.machine()}, python {platform.python_version()}")
    with tempfile.TemporaryDirectory() as tmp:
        for preset in args.presets.split(","):
            files = write_checkpoints(preset, Path(tmp))
            results = {(k, w): [] for k in files for w in ("load", "header")}
            for _ in range(args.rounds):
                for (k, w), got in results.items():
                    got.append(measure(w, files[k]))
            print(f"\n{preset} transformer preset")
            print(f"{'file':<18} {'size MB':>8} {'load ms':>8} {'peak MB':>8} {'header ms':>10} {'peak MB':>8}")
            for k, path in files.items():
                row = [
                    statistics.median(r[x] for r in results[(k, w)])
                    for w in ("load", "header")
                    for x in ("s", "peak_mb")
                ]
                size = path.stat().st_size / 2**20
                print(f"{k:<18} {size:>8.2f} {row[0] * 1e3:>8.1f} {row[1]:>8.1f} {row[2] * 1e3:>10.1f} {row[3]:>8.1f}")


if __name__ == "__main__":
    main()
