"""The one-token decode step alone (issue 40): µs a token for the numpy step and the compiled one with each
weight storage, side by side in one process; and, given a trained run, how far bf16 storage moves its logits.

    python benchmarks/bench_decode_step.py                       # 4 × 128, context 64, RoPE, rolling cache
    python benchmarks/bench_decode_step.py --layers 2 --d-model 64
    python benchmarks/bench_decode_step.py --fidelity RUN corpora/heldout-sonnets.txt

Timing: thread CPU time over `--steps` steps after a 32-token prompt, each variant in turn, round after round
(`--rounds`), medians. Fidelity: 300 positions of the text, each step against torch's float32 one-token step on
the same cache: top-token agreement, KL(torch ‖ step) and the largest logit gap.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_generate import int8_run

from charlm.config import ModelConfig
from charlm.models import build_model, compiled_decode
from charlm.models.fast_decode import FastDecoder
from charlm.runtime import cpu_name
from charlm.storage import checkpoint


def per_token_us(model, make, steps: int) -> float:
    cache = model.new_cache(1, rolling=True)
    with torch.no_grad():
        model(torch.tensor([[1] * 32]), cache=cache)
    step = make(model, cache)
    for _ in range(20):
        step.step_np(3)
    t0 = time.thread_time()
    for t in range(steps):
        step.step_np(t % model.cfg.vocab_size)
    return (time.thread_time() - t0) / steps * 1e6


def timing(args) -> None:
    torch.manual_seed(0)
    cfg = ModelConfig(kind="transformer", vocab_size=65, n_layers=args.layers, d_model=args.d_model, n_heads=4,
                      context=args.context, positions="rope")  # fmt: skip
    model = build_model(cfg).eval()
    q = int8_run(model)
    variants = {
        "numpy step": (model, FastDecoder),
        "compiled, float32 storage": (model, lambda m, c: compiled_decode.CompiledDecoder(m, c, "f32")),
        "compiled, bf16 storage": (model, lambda m, c: compiled_decode.CompiledDecoder(m, c, "bf16")),
        "int8 run, numpy step": (q, FastDecoder),
        "int8 run, compiled (int8 storage)": (q, compiled_decode.CompiledDecoder),
    }
    times = {v: [] for v in variants}
    for _ in range(args.rounds):
        for v, (m, make) in variants.items():
            times[v].append(per_token_us(m, make, args.steps))
    mb = 4 * sum(p.numel() for p in model.parameters()) / 2**20
    print(f"{cpu_name()}, load {os.getloadavg()[0]:.1f}; {args.layers} × {args.d_model}, context {args.context}, "
          f"{mb:.2f} MB of float32; medians of {args.rounds} rounds of {args.steps} steps")  # fmt: skip
    print("| step | µs/token (thread CPU) | range |\n|---|---:|---:|")
    for v, ts in times.items():
        print(f"| {v} | {statistics.median(ts):.0f} | {min(ts):.0f}-{max(ts):.0f} |")


def fidelity(run: str, text_file: str) -> None:
    ck = checkpoint.load(run)
    model = ck.model.eval()
    ids = ck.tokenizer.encode(Path(text_file).read_text(encoding="utf-8"), unknown="drop")[:301]
    for name, make in (("compiled", compiled_decode.CompiledDecoder), ("numpy", FastDecoder)):
        cache, ref = model.new_cache(1, rolling=True), model.new_cache(1, rolling=True)
        agree, kls, gaps = 0, [], []
        with torch.no_grad():
            model(torch.tensor([ids[:1]]), cache=cache), model(torch.tensor([ids[:1]]), cache=ref)
            step = make(model, cache)
            for t in ids[1:]:
                got = torch.as_tensor(step.step_np(t)).double()
                want = model(torch.tensor([[t]]), cache=ref)[0][0, -1].double()
                p, q = torch.log_softmax(want, -1), torch.log_softmax(got, -1)
                agree += int(got.argmax() == want.argmax())
                kls.append(float((p.exp() * (p - q)).sum()))
                gaps.append(float((got - want).abs().max()))
        print(f"{name} step ({step.storage} weights): top token {agree}/{len(ids) - 1}, mean KL {np.mean(kls):.2e} "
              f"nats, max KL {max(kls):.2e}, largest logit gap {max(gaps):.3f}")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--fidelity", nargs=2, metavar=("RUN", "TEXT"), help="bf16's effect on a trained run instead")
    args = ap.parse_args()
    assert compiled_decode.kernel(wait=True) is not None, "the compiled step did not build (is numba installed?)"
    fidelity(*args.fidelity) if args.fidelity else timing(args)


if __name__ == "__main__":
    main()
