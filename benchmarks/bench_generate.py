"""Generation speed: the KV cache against recomputing the window for every token (`--no-cache`).

    python benchmarks/bench_generate.py              # 3 repeats, ~5 minutes on a 2-core CPU
    python benchmarks/bench_generate.py --repeats 1  # a quick look
    python benchmarks/bench_generate.py --size nanoGPT --variants cache "nanoGPT generate()" --top-k 200 --tokens 500
        # issue 12's case: charlm's cached sampling against nanoGPT's own generate() at the same size
        # (add "nanoGPT generate(), 1 thread" for the steadier comparison on a busy machine; issue 19
        # measures with --repeats 5)
    python benchmarks/bench_generate.py --heldout RUN corpora/heldout-sonnets.txt
        # what a trained model's generator predicts: bits/char, cached and recomputed, past the window

    python benchmarks/bench_generate.py --size nanoGPT --top-k 200 --tokens 500 2000 --repeats 5 --variants cache \
        "cache, numpy step" "nanoGPT generate()" "nanoGPT generate(), 1 thread" "int8 run, cache" "int8 run, numpy step"
        # issue 40's case: the compiled step (bf16 weights; an int8 run's int8) against the numpy step and nanoGPT

The compiled decode step is loaded before timing, so "cache" runs it from the first token (a Streamer on its own
loads it only for long generations: models/compiled_decode.py, LOAD_AFTER).
For each model size and each length (500 and 2,000 new tokens): tokens/s with the cache, with the
cache but the numpy one-token step (Streamer(compiled=False)), with the cache but the torch one-token step
(Streamer(fast_decode=False): what the numpy step buys), an int8 run of the same model (compress --bits 8, as
loaded) with either step,
without the cache, and nanoGPT's own generate() (benchmarks/nanogpt_reference.py) on a model of the same size; the time per token over the first and the last 100 tokens (flat = once the
window is full, the rolling cache costs what filling it did); and the time to the first token after
a prompt of half the context.

The models are freshly initialised (random weights): speed does not depend on what a model has
learnt. Variants run interleaved, repeat after repeat, so a noisy shared CPU hurts them alike; the
table shows medians over the repeats.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import nanogpt_reference as nanogpt

from charlm.config import ModelConfig
from charlm.generate import SampleConfig, Streamer
from charlm.models import build_model, compiled_decode, count_params
from charlm.presets import preset
from charlm.runtime import cpu_name
from charlm.storage import checkpoint
from charlm.tokenizer import CharTokenizer

TEXT = (
    "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n"
    "First Citizen:\nYou are all resolved rather to die than to famish?\n"
) * 20
TOKENIZER = CharTokenizer.train([TEXT + "".join(chr(c) for c in range(32, 127))])  # 95 printable chars + newline

SIZES = {
    "tiny preset (its own sizes)": dict(preset("transformer", "tiny")[0]),
    "nanoGPT size (4×128, 4 heads, context 64)": dict(n_layers=4, d_model=128, n_heads=4, context=64),
    "4×128, 4 heads, context 256": dict(n_layers=4, d_model=128, n_heads=4, context=256),
}
VARIANTS = (
    "cache",
    "cache, numpy step",
    "cache, torch step",
    "no cache",
    "nanoGPT generate()",
    "nanoGPT generate(), 1 thread",
    "int8 run, cache",
    "int8 run, numpy step",
)
DEFAULT_VARIANTS = VARIANTS[:5]


def int8_run(model):
    """The model as `charlm compress --bits 8` leaves it once loaded: every matrix int8 values times row scales."""
    import copy

    from charlm.compress import stored

    run = copy.deepcopy(model)
    _, quantized = stored(run.state_dict(), 8)  # what compress writes
    with torch.no_grad():
        for name, p in run.named_parameters():
            if name in quantized:  # what checkpoint.load makes of it (quantized.dequantized, int8)
                p.copy_(quantized[name]["values"].float() * quantized[name]["scales"].float()[:, None])
    return run


def nanogpt_once(model, n_tokens: int, seed: int, top_k: int, threads: int | None = None) -> dict:
    """nanoGPT's own generate() on a model of the same size (benchmarks/nanogpt_reference.py), with torch's
    default threads, as its sample.py runs it, or with `threads`. (On a busy 2-core machine its default
    two threads wait on each other: one thread is then often faster, and always steadier.)"""
    if threads is not None:
        saved = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            return nanogpt_once(model, n_tokens, seed, top_k)
        finally:
            torch.set_num_threads(saved)
    cfg = model.cfg
    gpt = nanogpt.GPT(
        nanogpt.GPTConfig(
            block_size=cfg.context, vocab_size=cfg.vocab_size, n_layer=cfg.n_layers, n_head=cfg.n_heads,
            n_embd=cfg.d_model, dropout=0.0, bias=False,
        )
    ).eval()  # fmt: skip
    prompt = torch.tensor([TOKENIZER.encode(TEXT[: cfg.context // 2])])
    torch.manual_seed(seed)
    cpu, t0 = time.process_time(), time.perf_counter()
    out = gpt.generate(prompt, n_tokens, temperature=0.8, top_k=top_k or None)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu
    assert out.size(1) == prompt.size(1) + n_tokens
    return {"tokens_per_s": n_tokens / seconds, "tokens_per_cpu_s": n_tokens / cpu, "ttft_ms": float("nan"),
            "first100_ms": float("nan"), "last100_ms": float("nan")}  # fmt: skip


def run_once(model, variant: str, n_tokens: int, seed: int, top_k: int, int8=None) -> dict:
    if variant.startswith("nanoGPT generate()"):
        return nanogpt_once(model, n_tokens, seed, top_k, threads=1 if variant.endswith("1 thread") else None)
    step = {"fast_decode": False} if variant == "cache, torch step" else {}
    step |= {"compiled": False} if variant.endswith("numpy step") else {}
    if variant.startswith("int8 run"):
        model = int8
    gen = Streamer(model, TOKENIZER, use_cache=variant != "no cache", **step)
    prompt = TOKENIZER.encode(TEXT[: model.cfg.context // 2])
    settings = SampleConfig(temperature=0.8, top_k=top_k, max_tokens=n_tokens, seed=seed)
    times = []
    cpu = time.thread_time()
    last = time.perf_counter()
    for _ in gen.stream(prompt, settings):  # a char tokenizer and no stop strings: one piece per token
        now = time.perf_counter()
        times.append(now - last)
        last = now
    cpu = time.thread_time() - cpu
    assert len(times) == n_tokens
    return {
        "tokens_per_s": gen.stats.tokens_per_s,
        "tokens_per_cpu_s": n_tokens / cpu,
        "ttft_ms": gen.stats.ttft_ms,
        "first100_ms": 1000 * statistics.mean(times[1:101]),
        "last100_ms": 1000 * statistics.mean(times[-100:]),
    }


def load() -> str:
    return "load average {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def heldout(ckpt: str, text_file: str) -> None:
    """Teacher-forced bits/char and top-1 accuracy of the Streamer's next-token logits along a text:
    the cache (a rolling cache past the context, for RoPE) against recomputing the window every token."""
    ck = checkpoint.load(ckpt)
    ids = ck.tokenizer.encode(Path(text_file).read_text(encoding="utf-8"), unknown="drop")
    chars = len(ck.tokenizer.decode(ids[1:]))
    print(f"{ckpt}: {ck.model_config.to_dict()}, {len(ids) - 1:,} tokens scored ({chars:,} chars)")
    for use_cache in (True, False):
        gen = Streamer(ck.model, ck.tokenizer, use_cache=use_cache)
        gen.ids, nats, hits = ids[:1], 0.0, 0
        for t in ids[1:]:
            logits = gen.next_logits().float()
            nats -= torch.log_softmax(logits, -1)[t].item()
            hits += int(logits.argmax()) == t
            gen.ids.append(t)
        print(
            json.dumps(
                {
                    "cache": use_cache,
                    "bits_per_char": round(nats / math.log(2) / chars, 4),
                    "top1": round(hits / (len(ids) - 1), 4),
                }
            )
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tokens", type=int, nargs="+", default=[500, 2000])
    ap.add_argument("--json", action="store_true", help="also print every measurement as JSON lines")
    ap.add_argument("--size", default="", help="only the model sizes whose name contains this")
    ap.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(DEFAULT_VARIANTS))
    ap.add_argument("--top-k", type=int, default=0, help="sampling's top-k (0: off)")
    ap.add_argument("--heldout", nargs=2, metavar=("CKPT", "TEXT"), help="score a trained model on a text instead")
    args = ap.parse_args()
    if args.heldout:
        return heldout(*args.heldout)
    sizes = {name: dims for name, dims in SIZES.items() if args.size in name}
    compiled = compiled_decode.kernel(wait=True) is not None  # compiled (or loaded from numba's cache) before timing

    print(
        f"machine: {cpu_name()}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads available "
        f"(generation runs on 1), torch {torch.__version__}, numpy {np.__version__}, compiled step: {compiled}; "
        f"{load()} at the start"
    )
    rows = []
    for size, dims in sizes.items():
        torch.manual_seed(0)
        model = build_model(ModelConfig(kind="transformer", vocab_size=TOKENIZER.vocab_size, **dims)).eval()
        int8 = int8_run(model) if any(v.startswith("int8") for v in args.variants) else None
        Streamer(model, TOKENIZER).complete([0], SampleConfig(max_tokens=20, seed=0))  # warm-up
        for n in args.tokens:
            results = {v: [] for v in args.variants}
            for r in range(args.repeats):
                for v in args.variants:  # interleaved: load changes on a shared machine hit every variant
                    results[v].append(run_once(model, v, n, seed=r, top_k=args.top_k, int8=int8))
            med = {v: {k: statistics.median(x[k] for x in xs) for k in xs[0]} for v, xs in results.items()}
            rows.append((size, count_params(model), n, med))
            if args.json:
                print(json.dumps({"size": size, "tokens": n, "top_k": args.top_k, "runs": results}))

    print(f"{load()} at the end")
    print()
    print(
        f"medians over {args.repeats} repeats; tokens/s is wall clock and counts prefill and every step; "
        "tokens per CPU-second divides by the CPU time this thread got (what an idle core would give)"
    )
    print()
    print(
        "| model | new tokens | variant | tokens/s | tokens per CPU-s | ms/token first 100 | ms/token last 100 | TTFT ms |"
    )
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    for size, params, n, med in rows:
        for v, m in med.items():
            print(
                f"| {size}, {params / 1e6:.2f}M params | {n:,} | {v} | {m['tokens_per_s']:,.0f} | {m['tokens_per_cpu_s']:,.0f} | "
                f"{m['first100_ms']:.3f} | {m['last100_ms']:.3f} | {m['ttft_ms']:.1f} |"
            )
    others = [v for v in args.variants if v != "cache"]
    if "cache" not in args.variants or not others:
        return
    print()
    print("ratios of the medians: the cache's tokens/s over each other variant's, wall clock (per CPU-second)")
    print()
    print("| model | new tokens | " + " | ".join(f"cache ÷ {v}" for v in others) + " | last ÷ first 100 (cache) |")
    print("|---|---:|" + "---:|" * (len(others) + 1))
    for size, _params, n, med in rows:
        c = med["cache"]
        cells = [
            f"{c['tokens_per_s'] / med[v]['tokens_per_s']:.1f}× ({c['tokens_per_cpu_s'] / med[v]['tokens_per_cpu_s']:.1f}×)"
            for v in others
        ]
        print(f"| {size} | {n:,} | " + " | ".join(cells) + f" | {c['last100_ms'] / c['first100_ms']:.2f} |")


if __name__ == "__main__":
    main()
