"""CUDA: training tokens/s and MFU of the `small` preset (bf16 autocast, with and without --compile),
cached generation tokens/s, and the CLI under torchrun on one GPU.

    python benchmarks/bench_cuda.py                       # everything, a few minutes on one H100
    python benchmarks/bench_cuda.py --parts train --steps 300 --repeats 3
    python benchmarks/bench_cuda.py --device cpu --steps 20 --parts train generate   # the machinery, on a CPU

Training: charlm's own Trainer on tinyshakespeare (no evaluations, no samples), variants interleaved,
`repeats` rounds. tokens/s is counted between the end of step `warmup` (compilation and cuDNN/cuBLAS
autotuning done) and the last step, wall clock. MFU = achieved FLOP/s ÷ the GPU's dense bf16 peak, with
FLOP per token = 6 × parameters + 12 × layers × d_model × context (the estimate of nanoGPT and the PaLM
paper: forward and backward, attention scores included). The peak is the datasheet's (H100 SXM:
989 TFLOP/s) and, beside it, a bf16 8192³ matmul measured in the same run.

Generation: Streamer (the code behind `charlm sample` and `chat`) with its KV cache, 500 new tokens after a
prompt of half the context, temperature 0.8, top-k 200; medians over the repeats.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from charlm.config import ModelConfig, TrainConfig
from charlm.generate import SampleConfig, Streamer
from charlm.models import build_model, count_params
from charlm.presets import preset
from charlm.storage import checkpoint
from charlm.tokenizer import CharTokenizer
from charlm.training.events import Stepped
from charlm.training.trainer import Trainer

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "corpora" / "tinyshakespeare.txt"
DATASHEET_BF16 = {"H100": 989e12, "H200": 989e12, "A100": 312e12}  # dense, SXM


def datasheet_peak() -> float | None:
    name = torch.cuda.get_device_name() if torch.cuda.is_available() else ""
    return next((v for k, v in DATASHEET_BF16.items() if k in name), None)


def measured_peak(device: str) -> float | None:
    """bf16 8192³ matmul FLOP/s: the most a dense bf16 kernel gets on this GPU, in this run."""
    if device != "cuda":
        return None
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        a @ b
    torch.cuda.synchronize()
    return 10 * 2 * 8192**3 / (time.perf_counter() - t0)


def train_once(device: str, steps: int, warmup: int, compile: bool, seed: int, overrides: dict) -> dict:
    model_kw, train_kw = preset("transformer", "small")
    train_kw = {**train_kw, **overrides}
    model_cfg = ModelConfig(kind="transformer", **model_kw)
    cfg = TrainConfig(
        **train_kw,
        steps=steps,
        eval_interval=steps,  # one evaluation, after the last step: outside the timed steps
        eval_iters=2,
        sample_tokens=0,
        device=device,
        compile=compile,
        seed=seed,
    )
    marks = {}

    def on_event(e):
        if isinstance(e, Stepped) and e.step in (warmup, steps):
            marks[e.step] = time.perf_counter()

    with tempfile.TemporaryDirectory() as out:
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        run = Trainer(CORPUS, model_cfg, cfg, Path(out) / "run", on_event=on_event)
        result = run.fit()
        total = time.perf_counter() - t0
        params = count_params(run.model)
    ctx, L, d = model_cfg.context, model_cfg.n_layers, model_cfg.d_model
    tokens = (steps - warmup) * cfg.batch_size * ctx
    tok_s = tokens / (marks[steps] - marks[warmup])
    return {
        "compile": compile,
        "params": params,
        "batch_size": cfg.batch_size,
        "context": ctx,
        "tokens_per_s": tok_s,
        "flop_per_s": tok_s * (6 * params + 12 * L * d * ctx),
        "first_steps_s": marks[warmup] - t0,  # setup, data, compile and the first `warmup` steps
        "total_s": total,
        "val_loss": result.last_val_loss,
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None,
    }


def train_part(args) -> list[dict]:
    variants = [dict(compile=False, overrides={}), dict(compile=True, overrides={})]
    for bs in args.batch_sizes:
        variants += [
            dict(compile=False, overrides={"batch_size": bs}),
            dict(compile=True, overrides={"batch_size": bs}),
        ]
    rows = {i: [] for i in range(len(variants))}
    for r in range(args.repeats):
        for i, v in enumerate(variants):  # interleaved, so drift hits each variant alike
            rows[i].append(train_once(args.device, args.steps, args.warmup, v["compile"], 1337 + r, v["overrides"]))
            print(json.dumps({"part": "train", "round": r, **rows[i][-1]}), flush=True)
    return [summary(xs) for xs in rows.values()]


def summary(xs: list[dict]) -> dict:
    """The last run's fields, with medians of the timings."""
    m = dict(xs[-1])
    for k in ("tokens_per_s", "flop_per_s", "first_steps_s"):
        m[k] = statistics.median(x[k] for x in xs)
    m["tokens_per_s_all"] = [round(x["tokens_per_s"]) for x in xs]
    return m


def generate_part(args) -> list[dict]:
    text = CORPUS.read_text(encoding="utf-8")
    tok = CharTokenizer.train([text])
    sizes = {
        "nanoGPT size (4×128, context 64)": dict(n_layers=4, d_model=128, n_heads=4, context=64),
        "small preset (6×256, context 256)": preset("transformer", "small")[0],
    }
    rows = []
    for name, dims in sizes.items():
        torch.manual_seed(0)
        cfg = ModelConfig(kind="transformer", vocab_size=tok.vocab_size, **{**dims, "dropout": 0.0})
        model = build_model(cfg).to(args.device).eval()
        prompt = tok.encode(text[: cfg.context // 2])
        Streamer(model, tok).complete(prompt, SampleConfig(max_tokens=50, seed=0))  # warm-up
        stats = []
        for r in range(args.repeats):
            gen = Streamer(model, tok)
            gen.complete(prompt, SampleConfig(temperature=0.8, top_k=200, max_tokens=500, seed=r))
            stats.append(gen.stats)
        row = {
            "part": "generate",
            "size": name,
            "params": count_params(model),
            "tokens_per_s": statistics.median(s.tokens_per_s for s in stats),
            "tokens_per_s_all": [round(s.tokens_per_s) for s in stats],
            "ttft_ms": statistics.median(s.ttft_ms for s in stats),
        }
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def torchrun_part(args) -> dict:
    """`torchrun --standalone --nproc-per-node 1 -m charlm train ...`: exit code, world size, tokens/s line."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
            "-m", "charlm", "train", str(CORPUS), "--preset", "small", "--steps", "200",
            "--device", args.device, "--out", str(out),
        ]  # fmt: skip
        env = {**os.environ, "CHARLM_CACHE": str(Path(tmp) / "cache")}
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        row = {"part": "torchrun", "exit": proc.returncode, "seconds": round(time.perf_counter() - t0, 1)}
        if proc.returncode == 0:
            ck = checkpoint.read(out / checkpoint.LAST)
            row |= {"world_size": ck.world_size, "step": ck.step, "device": ck.device}
        row["stdout_tail"] = proc.stdout[-1500:]
        row["stderr_tail"] = proc.stderr[-1500:]
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--parts", nargs="+", default=["train", "generate", "torchrun"])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=50, help="steps before the clock starts")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch-sizes", type=int, nargs="*", default=[128], help="also train at these batch sizes")
    args = ap.parse_args()
    if args.device == "cuda":
        print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, CUDA {torch.version.cuda}", flush=True)
    peaks = {"datasheet": datasheet_peak(), "measured": measured_peak(args.device)}
    print(json.dumps({"peak_bf16_flop_per_s": peaks}), flush=True)
    if "train" in args.parts:
        print(
            "\n| batch | --compile | tokens/s (median) | runs | MFU datasheet | MFU measured peak | first steps s | peak GiB | val loss |"
        )
        print("|---:|---|---:|---|---:|---:|---:|---:|---:|")
        for m in train_part(args):
            mfu = [f"{m['flop_per_s'] / p:.1%}" if p else "-" for p in (peaks["datasheet"], peaks["measured"])]
            print(
                f"| {m['batch_size']} | {'yes' if m['compile'] else 'no'} | {m['tokens_per_s']:,.0f} | "
                f"{m['tokens_per_s_all']} | {mfu[0]} | {mfu[1]} | {m['first_steps_s']:.1f} | "
                f"{m['peak_gib'] or 0:.2f} | {m['val_loss']:.3f} |",
                flush=True,
            )
    if "generate" in args.parts:
        generate_part(args)
    if "torchrun" in args.parts:
        torchrun_part(args)


if __name__ == "__main__":
    main()
