"""Training quality and speed under a fixed wall-clock budget, with charlm's own trainer.

    python benchmarks/bench_train.py                 # reference recipe vs the tiny preset, 115 s each
    python benchmarks/bench_train.py --budget 60 --repeat 3 --only tiny
    python benchmarks/bench_train.py --lstm-speed    # LSTM 2x256, batch 64, context 64: chars/s

The reference is the well-known nanoGPT CPU recipe (GPT, 4 layers, 4 heads, width 128, context 64,
batch 12, AdamW lr 1e-3 -> 1e-4 cosine, 100 warmup, 2000 steps, dropout 0), run with charlm's model
code. Runs alternate (reference, tiny, reference, tiny, ...) so machine noise hits both alike.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import torch

from charlm.config import ModelConfig, TrainConfig, preset
from charlm.data import Batches, load_tokens, prepare
from charlm.models import build_model
from charlm.train import Evaluated, Stepped, Trainer, autocast_dtype, make_optimizer

CORPUS = Path(__file__).resolve().parent.parent / "corpora" / "tinyshakespeare.txt"


def reference(budget: float) -> tuple[ModelConfig, TrainConfig]:
    model = ModelConfig(kind="transformer", n_layers=4, n_heads=4, d_model=128, context=64, dropout=0.0,
                        positions="learned")
    train = TrainConfig(batch_size=12, lr=1e-3, min_lr_ratio=0.1, warmup=100, steps=2000, optimizer="adamw",
                        max_time=budget, eval_interval=10**9, eval_iters=100, sample_tokens=0, device="cpu")
    return model, train


def tiny(kind: str, budget: float) -> tuple[ModelConfig, TrainConfig]:
    m, t = preset(kind, "tiny")
    model = ModelConfig(kind=kind, **m)
    train = TrainConfig(max_time=budget, steps=10**9, eval_interval=10**9, eval_iters=100, sample_tokens=0,
                        device="cpu", **t)
    return model, train


def train_once(name: str, model_cfg: ModelConfig, train_cfg: TrainConfig) -> dict:
    steps, tokens_per_s = [], []
    final = {}

    def on_event(e):
        if isinstance(e, Stepped):
            steps.append(e.step)
            tokens_per_s.append(e.tokens_per_s)
        elif isinstance(e, Evaluated):
            final.update(val_loss=e.val_loss, val_bpc=e.val_bpc)

    with tempfile.TemporaryDirectory() as out:
        result = Trainer(CORPUS, model_cfg, train_cfg, out, on_event=on_event).fit()
    return {
        "name": name,
        "steps": result.step,
        "seconds": round(result.train_seconds, 1),
        "tokens_per_s": round(statistics.median(tokens_per_s)),
        "val_loss": round(final["val_loss"], 4),
        "val_bpc": round(final["val_bpc"], 4),
    }


def lstm_speed(precision: str, steps: int = 30) -> dict:
    """Training throughput (chars/s) of a 2-layer 256-wide LSTM at batch 64, context 64."""
    tok, path, _ = prepare(CORPUS, "char", None)
    batches = Batches(load_tokens(path), context=64)
    cfg = ModelConfig(kind="lstm", vocab_size=tok.vocab_size, n_layers=2, d_model=256, context=64)
    model = build_model(cfg)
    opt = make_optimizer(model, TrainConfig(optimizer="adamw"), "cpu")
    gen = torch.Generator().manual_seed(0)
    dtype = autocast_dtype("cpu", precision)  # as the trainer does
    autocast = torch.autocast("cpu", dtype=dtype) if dtype else nullcontext()
    times = []
    for i in range(steps + 5):
        t0 = time.perf_counter()
        x, y = batches.get_batch("train", 64, gen)
        with autocast:
            _, loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if i >= 5:  # skip warm-up steps
            times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    return {"name": f"lstm 2x256 b64 t64 {precision}", "autocast": str(dtype), "ms_per_step": round(med * 1000, 1), "chars_per_s": round(64 * 64 / med)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=float, default=115.0, help="seconds of training per run")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--only", choices=["reference", "tiny", "lstm"], help="run one variant only")
    ap.add_argument("--lstm-speed", action="store_true")
    args = ap.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads", flush=True)
    if args.lstm_speed:
        for _ in range(args.repeat):  # alternate, so noise hits both alike
            for precision in ("fp32", "auto"):
                print(json.dumps(lstm_speed(precision)), flush=True)
        return
    variants = {
        "reference": lambda: reference(args.budget),
        "tiny": lambda: tiny("transformer", args.budget),
        "lstm": lambda: tiny("lstm", args.budget),
    }
    names = [args.only] if args.only else ["reference", "tiny"]
    results = {n: [] for n in names}
    for _ in range(args.repeat):
        for n in names:
            r = train_once(n, *variants[n]())
            results[n].append(r)
            print(json.dumps(r), flush=True)
    for n, rs in results.items():
        print(f"{n}: median val loss {statistics.median(r['val_loss'] for r in rs):.4f}, "
              f"median tokens/s {statistics.median(r['tokens_per_s'] for r in rs):.0f} over {len(rs)} run(s)")


if __name__ == "__main__":
    main()
