"""The RNN's one-token step: generate's Streamer before (torch's nn.LSTM / nn.GRU for one token, native
kernels: what it ran) against the numpy step (models/fast_rnn.py), with and without its first layer's input table
(the row of tok_emb W_ih^T + b_ih for the token, instead of W_ih e), interleaved in one process, medians.

    OMP_NUM_THREADS=1 python benchmarks/bench_rnn_step.py                 # LSTM and GRU, 2 x 256 (the tiny preset)
    OMP_NUM_THREADS=1 python benchmarks/bench_rnn_step.py --layers 3 --width 512 --repeat 7

Random weights: speed does not depend on what a model has learnt. Also prints the largest logit gap
between the two over the timed tokens.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from charlm.config import ModelConfig
from charlm.models import build_model
from charlm.models.fast_rnn import FastRNN
from charlm.runtime import cpu_name


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    print(f"{cpu_name()} · {torch.get_num_threads()} threads · {args.layers} x {args.width}, vocab 65")
    for kind in ("lstm", "gru"):
        torch.manual_seed(0)
        cfg = ModelConfig(kind=kind, n_layers=args.layers, d_model=args.width, context=64, vocab_size=65)
        model = build_model(cfg).eval()
        theirs, ours, plain_state = model.new_cache(1), model.new_cache(1), model.new_cache(1)
        with torch.inference_mode():
            model.decode([1, 2, 3], theirs), model.decode([1, 2, 3], ours), model.decode([1, 2, 3], plain_state)
        fast, plain = FastRNN(model, ours), FastRNN(model, plain_state)
        plain.table = None  # the step without its input table: W_ih e + b_ih for every token
        before, after, untabled, gap = [], [], [], 0.0
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            with torch.inference_mode():
                want = [model.decode([t % 65], theirs) for t in range(args.tokens)]
            before.append((time.perf_counter() - t0) / args.tokens * 1e6)
            t0 = time.perf_counter()
            got = [fast.step_np(t % 65).copy() for t in range(args.tokens)]
            after.append((time.perf_counter() - t0) / args.tokens * 1e6)
            t0 = time.perf_counter()
            got_plain = [plain.step_np(t % 65).copy() for t in range(args.tokens)]
            untabled.append((time.perf_counter() - t0) / args.tokens * 1e6)
            gap = max(gap, max((torch.from_numpy(g) - w).abs().max().item() for g, w in zip(got + got_plain, want * 2)))
        b, a, u = statistics.median(before), statistics.median(after), statistics.median(untabled)
        print(
            f"{kind}: torch one-token step {b:7.0f} µs · numpy {a:6.0f} µs ({b / a:4.2f}x) · without the input table "
            f"{u:6.0f} µs ({b / u:4.2f}x) · logits within {gap:.1e}"
        )


if __name__ == "__main__":
    main()
