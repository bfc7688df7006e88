"""Where and how the numbers are computed: the device, and the autocast dtype of matrix products.
Shared by training and by the commands that only run a model (sample, chat, eval, compare)."""

from __future__ import annotations

import os
import platform
import time
from contextlib import contextmanager

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
    once per step): `others`, the cores they kept busy; `rivals`, those of them not niced below this process
    (a niced program gives way); `own`, the cores this process used, since the reading before. From /proc/stat
    (all cores' busy time) less this process's own CPU time; None where there is no /proc/stat (macOS, Windows)
    or before the first reading. The training summary says from them what a busy machine cost a run
    (views/progress.py).

    Inside fitted_threads(), each reading also sets torch's threads to the cores the rivals leave free
    (threads_for): on a quiet machine torch's own count, whose OpenMP threads spin while they wait for each
    other (1.6x faster than sleeping ones on the 2-core Xeon); beside CPU-bound programs one thread, which has
    no partner to wait for (spinning threads wait on a partner the busy CPU has descheduled: 1 step where
    hundreds were due). Sleeping threads (OMP_WAIT_POLICY=PASSIVE) survive a busy CPU too, but run no faster
    than one thread on a quiet one (benchmarks/RESULTS.md, "Threads on a busy CPU")."""

    def __init__(self, every: float = 1.0, enabled: bool = True):
        self.every, self.others, self.rivals, self.own = every, None, None, None
        self.last = _cpu_times() if enabled else None
        self.fitting: int | None = None  # inside fitted_threads(): the most threads to use

    def tick(self) -> None:
        if self.last is None or time.perf_counter() - self.last[0] < self.every:
            return
        now = _cpu_times()
        wall, busy, niced, own = (b - a for a, b in zip(self.last, now))
        self.last, self.own, self.others = now, own / wall, max(0.0, (busy - own) / wall)
        # this process's own time is counted as niced when it runs niced itself
        self.rivals = max(0.0, (busy - niced - (own if _nice() <= 0 else 0.0)) / wall)
        if self.fitting is not None:
            _set_threads(threads_for(self.rivals, self.fitting))

    @contextmanager
    def fitted_threads(self):
        """torch's threads fitted to what other programs leave free while inside; as they were after. The
        first fit is from the programs runnable right now (/proc/loadavg), before any reading."""
        before = torch.get_num_threads()
        if self.last is None:
            yield
            return
        self.fitting = before
        _set_threads(threads_for(_runnable_others(), before))
        try:
            yield
        finally:
            self.fitting = None
            _set_threads(before)


def threads_for(rivals: float, most: int) -> int:
    """torch's threads beside programs keeping `rivals` cores busy: the cores they leave (rounded), at least
    one and at most `most`."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(most, int(cores - rivals + 0.5)))


def _set_threads(n: int) -> None:
    if n != torch.get_num_threads():  # resizing OpenMP's pool costs ~0.5 ms: only on a change
        torch.set_num_threads(n)


def _nice() -> int:
    try:
        return os.getpriority(os.PRIO_PROCESS, 0)
    except (AttributeError, OSError):
        return 0


def _runnable_others() -> float:
    """Other tasks runnable at this instant (/proc/loadavg's running count, less this one); 0 where unknown."""
    try:
        with open("/proc/loadavg", encoding="ascii") as f:
            return max(0.0, float(f.read().split()[3].split("/")[0]) - 1)
    except (OSError, ValueError, IndexError):
        return 0.0


def _cpu_times() -> tuple[float, float, float, float] | None:
    """(wall clock, seconds all cores were busy, of them niced, this process's CPU seconds), or None without
    /proc/stat."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    t = os.times()
    tick = os.sysconf("SC_CLK_TCK")
    return time.perf_counter(), (sum(fields[:8]) - idle) / tick, fields[1] / tick, t.user + t.system
