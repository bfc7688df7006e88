"""Training on a busy CPU: the tiny preset's real training step (Muon, autocast as charlm picks it, clipping)
for a few seconds, alone and beside CPU-bound processes, under each thread/OpenMP variant, interleaved.

    python benchmarks/bench_busy.py                       # variants x {alone, beside 2 spinners}, 3 rounds
    python benchmarks/bench_busy.py --seconds 10 --rounds 5 --spinners 2

A variant is an environment for the worker process (OpenMP reads it when torch loads) and optionally a thread
count: "charlm" (what the trainer does: GNU OpenMP's default wait policy, spinning, and torch's threads fitted
every second to the cores other programs leave free, runtime.CpuShare.fitted_threads), "OMP_WAIT_POLICY=PASSIVE"
(the last round's default: sleeping threads, torch's count), "threads=2 OMP_WAIT_POLICY=" (spinning, torch's 2
threads, fixed: before issue 40), "threads=1". Each worker prints steps, tokens/s and its CPU-seconds; the summary gives medians and
each variant's busy/alone ratio (the goal: >= 25 % of the quiet speed beside two spinners on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

VARIANTS = ("threads=2 OMP_WAIT_POLICY=", "OMP_WAIT_POLICY=PASSIVE", "threads=1", "charlm")


def worker(threads: str, seconds: float) -> None:
    t_cpu0 = time.process_time()
    __import__("charlm")  # first: charlm sets OpenMP's wait policy before torch loads (unless the variant did)
    import torch

    from charlm import runtime
    from charlm.config import ModelConfig, TrainConfig
    from charlm.models import build_model
    from charlm.presets import preset
    from charlm.training.optim import make_optimizer

    sizes, train = preset("transformer", "tiny")
    cfg = ModelConfig(**sizes, vocab_size=65)
    if threads not in ("fit", "torch"):
        torch.set_num_threads(int(threads))
    torch.manual_seed(0)
    model = build_model(cfg)
    opt = make_optimizer(model, TrainConfig(), "cpu")
    dtype = runtime.autocast_dtype("cpu", "auto")
    x = torch.randint(0, 65, (train["batch_size"], cfg.context))
    y = torch.randint(0, 65, (train["batch_size"], cfg.context))

    def step():
        with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0).item()
        opt.step()
        opt.zero_grad(set_to_none=True)

    share = runtime.CpuShare(enabled=threads == "fit")  # "fit": charlm's own choice, as the trainer makes it
    with share.fitted_threads():
        step()
        t0, c0, n, used = time.perf_counter(), time.process_time(), 0, []
        while time.perf_counter() - t0 < seconds:
            step()
            share.tick()
            used.append(torch.get_num_threads())
            n += 1
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    tokens = n * x.numel()
    out = dict(steps=n, tokens_per_s=tokens / wall, cpu_s=cpu, threads=sorted(set(used)))
    out["startup_cpu_s"] = c0 - t_cpu0
    print(json.dumps(out))


def run_variant(variant: str, seconds: float) -> dict:
    env = dict(os.environ)
    threads = "torch"
    for part in variant.split():
        k, _, v = part.partition("=")
        if k == "threads":
            threads = v
        elif k == "charlm":
            threads = "fit"
        else:
            env[k] = v
    cmd = [sys.executable, __file__, "--worker", threads, "--seconds", str(seconds)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker")
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--spinners", type=int, default=2)
    ap.add_argument("--variant", action="append")
    args = ap.parse_args()
    if args.worker:
        return worker(args.worker, args.seconds)
    variants = args.variant or list(VARIANTS)
    results: dict[tuple[str, str], list[float]] = {}
    for r in range(args.rounds):
        for where in ("alone", "busy"):
            spinners = []
            if where == "busy":
                spinners = [
                    subprocess.Popen([sys.executable, "-c", "while True: pass  # bench_busy spinner"])
                    for _ in range(args.spinners)
                ]
            try:
                for v in variants:
                    load = os.getloadavg()[0]
                    res = run_variant(v, args.seconds)
                    results.setdefault((v, where), []).append(res["tokens_per_s"])
                    print(f"round {r} {where:5} {v:40} {res} load {load:.1f}", flush=True)
            finally:
                for s in spinners:
                    s.kill()
                    s.wait()
    print(f"\nmedians, tokens/s ({args.rounds} rounds of {args.seconds:g} s; busy: beside {args.spinners} spinners)")
    for v in variants:
        alone, busy = statistics.median(results[v, "alone"]), statistics.median(results[v, "busy"])
        print(f"{v:40} alone {alone:8,.0f}  busy {busy:8,.0f}  busy/alone {busy / alone:6.1%}")


if __name__ == "__main__":
    main()
