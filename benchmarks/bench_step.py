"""The tiny Transformer's training step, in ms, for variants stepped in turn (a noisy machine hurts them alike).

    python benchmarks/bench_step.py                          # 8 rounds, 2 threads
    benchmarks/as_avx2.sh python benchmarks/bench_step.py    # AVX2 kernels, fp32 (no native bf16: no autocast)

Variants: round six's preset with ReLU² through autograd (relu, then square), the same with transformer.relu_squared
(its gradient written out), and today's preset (+ smear, an untied head). Each round runs 3 warm-up and 10 timed
steps of each; the table is the median over rounds. RESULTS.md, "The tiny preset, round seven".
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_train as bt

from charlm.config import ModelConfig, TrainConfig
from charlm.data import Batches, load_tokens, prepare
from charlm.models import build_model
from charlm.models import transformer as tr
from charlm.presets import MODEL_KEYS, preset
from charlm.runtime import autocast_dtype
from charlm.training.optim import make_optimizer


def autograd_relu_squared(self, x):
    return self.drop(self.proj(F.relu(self.fc(x)).square()))


VARIANTS = {  # name: (model settings over the tiny preset's, MLP.forward)
    "round six, autograd ReLU²": (dict(smear=False, tied=True), autograd_relu_squared),
    "round six, ReLU² written out": (dict(smear=False, tied=True), tr.MLP.forward),
    "today's preset": ({}, tr.MLP.forward),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=8)
    args = ap.parse_args()
    settings = {k: v for part in preset("transformer", "tiny") for k, v in part.items()}
    tokenizer, path, _ = prepare(bt.CORPUS, "char", None)
    batches = Batches(load_tokens(path), context=settings["context"])
    train = TrainConfig(**{k: v for k, v in settings.items() if k not in MODEL_KEYS})
    dtype = autocast_dtype("cpu", train.precision)
    autocast = torch.autocast("cpu", dtype=dtype) if dtype else contextlib.nullcontext()
    runs = {}
    for name, (over, forward) in VARIANTS.items():
        model_settings = {k: v for k, v in settings.items() if k in MODEL_KEYS} | over
        torch.manual_seed(0)
        model = build_model(ModelConfig(kind="transformer", vocab_size=tokenizer.vocab_size, **model_settings))
        runs[name] = (model, make_optimizer(model, train, "cpu"), forward)
    generator = torch.Generator().manual_seed(0)

    def step(model, opt):
        x, y = batches.get_batch("train", train.batch_size, generator)
        with autocast:
            _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), train.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)

    ms = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name, (model, opt, forward) in runs.items():
            tr.MLP.forward = forward
            for _ in range(3):
                step(model, opt)
            start = time.perf_counter()
            for _ in range(10):
                step(model, opt)
            ms[name].append((time.perf_counter() - start) * 100)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, autocast {dtype}, {args.rounds} rounds")
    first = statistics.median(ms[next(iter(ms))])
    for name, times in ms.items():
        median = statistics.median(times)
        print(f"{name:32s} {median:7.2f} ms/step  {first / median:5.3f}x  (rounds {min(times):.1f}-{max(times):.1f})")


if __name__ == "__main__":
    main()
