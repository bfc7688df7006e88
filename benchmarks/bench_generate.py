"""Generation speed: the KV cache against recomputing the window for every token (`--no-cache`).

    python benchmarks/bench_generate.py              # 3 repeats, ~5 minutes on a 2-core CPU
    python benchmarks/bench_generate.py --repeats 1  # a quick look

For each model size and each length (500 and 2,000 new tokens): tokens/s with the cache, with the
cache but the torch one-token step (Generator(fast_decode=False): what the numpy step buys) and
without the cache; the time per token over the first and the last 100 tokens (flat = the window
slides without slowing down); and the time to the first token after a prompt of half the context.

The models are freshly initialised (random weights): speed does not depend on what a model has
learnt. Variants run interleaved, repeat after repeat, so a noisy shared CPU hurts them alike; the
table shows medians over the repeats.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch

from charlm.config import ModelConfig, preset
from charlm.generate import Generator, SampleConfig
from charlm.models import build_model, count_params
from charlm.tokenizer import CharTokenizer

TEXT = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n"
        "First Citizen:\nYou are all resolved rather to die than to famish?\n") * 20
TOKENIZER = CharTokenizer.train([TEXT + "".join(chr(c) for c in range(32, 127))])  # 95 printable chars + newline

SIZES = {
    "tiny preset (4×128, 4 heads, context 128)": dict(preset("transformer", "tiny")[0]),
    "nanoGPT size (4×128, 4 heads, context 64)": dict(n_layers=4, d_model=128, n_heads=4, context=64),
    "4×128, 4 heads, context 256": dict(n_layers=4, d_model=128, n_heads=4, context=256),
}
VARIANTS = ("cache", "cache, torch step", "no cache")


def run_once(model, variant: str, n_tokens: int, seed: int) -> dict:
    gen = Generator(model, TOKENIZER, use_cache=variant != "no cache", fast_decode=variant != "cache, torch step")
    prompt = TOKENIZER.encode(TEXT[: model.cfg.context // 2])
    settings = SampleConfig(temperature=0.8, max_tokens=n_tokens, seed=seed)
    times = []
    cpu = time.thread_time()
    last = time.perf_counter()
    for _ in gen.stream(prompt, settings):  # a char tokenizer and no stop strings: one piece per token
        now = time.perf_counter()
        times.append(now - last)
        last = now
    cpu = time.thread_time() - cpu
    assert len(times) == n_tokens
    return {"tokens_per_s": gen.stats.tokens_per_s, "tokens_per_cpu_s": n_tokens / cpu, "ttft_ms": gen.stats.ttft_ms,
            "first100_ms": 1000 * statistics.mean(times[1:101]), "last100_ms": 1000 * statistics.mean(times[-100:])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tokens", type=int, nargs="+", default=[500, 2000])
    ap.add_argument("--json", action="store_true", help="also print every measurement as JSON lines")
    args = ap.parse_args()

    print(f"machine: {platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads available "
          f"(generation runs on 1), torch {torch.__version__}")
    rows = []
    for size, dims in SIZES.items():
        torch.manual_seed(0)
        model = build_model(ModelConfig(kind="transformer", vocab_size=TOKENIZER.vocab_size, **dims)).eval()
        Generator(model, TOKENIZER).complete([0], SampleConfig(max_tokens=20, seed=0))  # warm-up
        for n in args.tokens:
            results = {v: [] for v in VARIANTS}
            for r in range(args.repeats):
                for v in VARIANTS:  # interleaved: load changes on a shared machine hit every variant
                    results[v].append(run_once(model, v, n, seed=r))
            med = {v: {k: statistics.median(x[k] for x in xs) for k in xs[0]} for v, xs in results.items()}
            rows.append((size, count_params(model), n, med))
            if args.json:
                print(json.dumps({"size": size, "tokens": n, "runs": results}))

    print()
    print(f"medians over {args.repeats} repeats; tokens/s is wall clock and counts prefill and every step; "
          "tokens per CPU-second divides by the CPU time this thread got (what an idle core would give)")
    print()
    print("| model | new tokens | variant | tokens/s | tokens per CPU-s | ms/token first 100 | ms/token last 100 | TTFT ms |")
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    for size, params, n, med in rows:
        for v in VARIANTS:
            m = med[v]
            print(f"| {size}, {params / 1e6:.2f}M params | {n:,} | {v} | {m['tokens_per_s']:,.0f} | {m['tokens_per_cpu_s']:,.0f} | "
                  f"{m['first100_ms']:.3f} | {m['last100_ms']:.3f} | {m['ttft_ms']:.1f} |")
    print()
    print("ratios of the medians: wall clock (per CPU-second in brackets)")
    print()
    print("| model | new tokens | cache ÷ no cache | cache ÷ torch step | last ÷ first 100 (cache) |")
    print("|---|---:|---:|---:|---:|")
    for size, params, n, med in rows:
        c, t, u = med["cache"], med["cache, torch step"], med["no cache"]
        print(f"| {size} | {n:,} | {c['tokens_per_s'] / u['tokens_per_s']:.1f}× ({c['tokens_per_cpu_s'] / u['tokens_per_cpu_s']:.1f}×) | "
              f"{c['tokens_per_s'] / t['tokens_per_s']:.1f}× ({c['tokens_per_cpu_s'] / t['tokens_per_cpu_s']:.1f}×) | "
              f"{c['last100_ms'] / c['first100_ms']:.2f} |")


if __name__ == "__main__":
    main()
