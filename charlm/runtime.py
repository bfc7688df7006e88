"""Where and how the numbers are computed: the device, and the autocast dtype of matrix products.
Shared by training and by the commands that only run a model (sample, chat, eval, compare)."""

from __future__ import annotations

import os
import platform
import time

import torch

from charlm.errors import ConfigError


def pick_device(name: str) -> str:
    """auto: cuda when PyTorch sees a GPU, else cpu."""
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda was asked for, but PyTorch sees no CUDA GPU: use --device cpu")
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def autocast_dtype(device: str, precision: str) -> torch.dtype | None:
    """The dtype matrix products run in under autocast (weights stay float32), or None for plain fp32.

    auto: bf16 on GPUs that have it (fp16 on older ones), and on CPUs with native bf16 instructions
    (AVX512-BF16 or AMX), where it makes the tiny LSTM ~1.5x faster (benchmarks/RESULTS.md)."""
    if precision == "fp32":
        return None
    if device == "cuda":
        return torch.bfloat16 if precision == "bf16" or torch.cuda.is_bf16_supported() else torch.float16
    native_bf16 = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    return torch.bfloat16 if precision == "bf16" or native_bf16 else None


def cpu_name() -> str:
    """The CPU as /proc/cpuinfo names it (family and model tell Zen 1, 3 and 4 apart, where the name may be
    just "AMD EPYC"), and whether it has AVX-512; elsewhere what platform knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            first = f.read().split("\n\n")[0]
        info = {k.strip(): v.strip() for k, v in (line.split(":", 1) for line in first.splitlines() if ":" in line)}
        avx512 = "AVX-512" if "avx512f" in info["flags"].split() else "no AVX-512"
        return f"{info['model name']} (family {info['cpu family']}, model {info['model']}, {avx512})"
    except (OSError, KeyError):
        return platform.processor() or platform.machine()


class CpuShare:
    """How much of the CPU other programs took while this process worked, read every `every` seconds (tick()
    once per step): `others`, the cores they kept busy, and `own`, the cores this process used, since the
    reading before. From /proc/stat (all cores' busy time) less this process's own CPU time; None where there is
    no /proc/stat (macOS, Windows) or before the first reading. The training summary says from them what a busy
    machine really cost a run (views/progress.py).

    What keeps a busy CPU from collapsing a run is OpenMP's wait policy, not the thread count: charlm sets
    OMP_WAIT_POLICY=PASSIVE before torch loads (charlm/__init__.py)."""

    def __init__(self, every: float = 2.0, enabled: bool = True):
        self.every, self.others, self.own = every, None, None
        self.last = _cpu_times() if enabled else None

    def tick(self) -> None:
        if self.last is None or time.perf_counter() - self.last[0] < self.every:
            return
        now = _cpu_times()
        wall, busy, own = (b - a for a, b in zip(self.last, now))
        self.last, self.own, self.others = now, own / wall, max(0.0, (busy - own) / wall)


def _cpu_times() -> tuple[float, float, float] | None:
    """(wall clock, seconds all cores were busy, this process's CPU seconds), or None without /proc/stat."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    t = os.times()
    return time.perf_counter(), (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK"), t.user + t.system
