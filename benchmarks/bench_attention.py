"""Attention under CPU autocast: bf16 (PyTorch's own choice) against fp32 (charlm's CPU_ATTENTION_FP32), and the
tiny preset's batch, side by side in one process, variants interleaved, medians of --repeat rounds.

    python benchmarks/bench_attention.py                    # the protocol of RESULTS.md
    benchmarks/as_avx2.sh python benchmarks/bench_attention.py --precision bf16   # an AVX2-only CPU, bf16 forced

Part 1: one SDPA call (batch, heads, context, head size) = (16, 4, 64, 32), causal: forward + backward, ms.
Part 2: the tiny preset's whole training step (Muon, clipping), tokens/s and CPU-ms per 1k tokens, with
attention in bf16 or fp32 and batch 16 or 32. Run with OMP_NUM_THREADS=1 for figures that survive a loaded
machine (ratios measured in one process).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from charlm.config import ModelConfig, TrainConfig
from charlm.models import build_model, transformer
from charlm.presets import preset
from charlm.runtime import autocast_dtype, cpu_name
from charlm.training.optim import make_optimizer


def timed(fn, n: int) -> tuple[float, float]:
    """(wall, CPU) seconds per call, over n calls."""
    w0, c0 = time.perf_counter(), time.process_time()
    for _ in range(n):
        fn()
    return (time.perf_counter() - w0) / n, (time.process_time() - c0) / n


def sdpa_case(dtype, cast: bool):
    q, k, v = (torch.randn(16, 4, 64, 32, dtype=dtype, requires_grad=True) for _ in range(3))

    def run():
        a, b, c = (t.float() for t in (q, k, v)) if cast else (q, k, v)
        F.scaled_dot_product_attention(a, b, c, is_causal=True).sum().backward()

    return run


def step_case(batch: int, attn_fp32: bool, dtype):
    sizes, _ = preset("transformer", "tiny")
    torch.manual_seed(0)
    model = build_model(ModelConfig(**sizes, vocab_size=65))
    opt = make_optimizer(model, TrainConfig(), "cpu")
    x, y = torch.randint(0, 65, (batch, 64)), torch.randint(0, 65, (batch, 64))

    def run():
        transformer.CPU_ATTENTION_FP32 = attn_fp32
        with torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None):
            _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0).item()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return run, batch * 64


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--precision", default="auto", choices=("auto", "bf16"))
    args = ap.parse_args()
    dtype = autocast_dtype("cpu", args.precision)
    print(f"{cpu_name()} · {torch.get_num_threads()} threads · autocast {dtype}")
    sdpa = {
        "sdpa bf16": sdpa_case(torch.bfloat16, False),
        "sdpa bf16 inputs cast to fp32": sdpa_case(torch.bfloat16, True),
        "sdpa fp32": sdpa_case(torch.float32, False),
    }
    steps = {
        f"step batch {b}, attention {'fp32' if f else 'bf16'}": step_case(b, f, dtype)
        for b in (16, 32)
        for f in (False, True)
    }
    ms: dict[str, list[float]] = {}
    tps: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}
    for fn in sdpa.values():
        fn()
    for fn, _ in steps.values():
        fn()
    for _ in range(args.repeat):
        for name, fn in sdpa.items():
            ms.setdefault(name, []).append(timed(fn, 10)[0] * 1e3)
        for name, (fn, tokens) in steps.items():
            wall, c = timed(fn, 5)
            tps.setdefault(name, []).append(tokens / wall)
            cpu.setdefault(name, []).append(c * 1e3 / tokens * 1000)
    transformer.CPU_ATTENTION_FP32 = True
    for name, v in ms.items():
        print(f"{name:36} {statistics.median(v):7.2f} ms forward+backward")
    base = statistics.median(tps["step batch 16, attention bf16"])
    for name, v in tps.items():
        t = statistics.median(v)
        print(f"{name:36} {t:9,.0f} tokens/s  {t / base:5.2f}x  {statistics.median(cpu[name]):6.1f} CPU-ms/1k tokens")


if __name__ == "__main__":
    main()
