"""Will a training run fit in memory? An estimate made before any work (encoding the corpus, building the
model), so that a run too large for the machine is refused in a second with what to change, instead of
swapping for minutes or dying with an allocator's trace."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from charlm.config import ModelConfig, TrainConfig
from charlm.errors import ConfigError

STATE_BYTES = 16  # per parameter: fp32 weight, gradient, and the optimizer's two moments
LOGIT_BYTES = 12  # per position and vocabulary entry: logits, their softmax and its gradient
CHAR_VOCAB_GUESS = 256  # a char run's vocabulary is known only once the corpus is read


def estimate(m: ModelConfig, t: TrainConfig) -> tuple[int, int]:
    """(bytes of weights and optimizer state, bytes of activations) one training process needs: the
    parameters counted from the model's shapes, the activations from its family's bytes per position."""
    from charlm.models import config_params, family  # (torch: only a training run gets here)

    vocab = m.vocab_size or (t.bpe_vocab if t.tokenizer == "bpe" else CHAR_VOCAB_GUESS)
    m = replace(m, vocab_size=vocab)
    positions = t.batch_size * m.context
    activations = positions * (m.d_model * m.n_layers * family(m.kind).ACTIVATION_BYTES + vocab * LOGIT_BYTES)
    return config_params(m) * STATE_BYTES, activations


CGROUP = Path("/sys/fs/cgroup")  # where a container's memory limit is read (cgroup v2, or v1's memory/)


def available(device: str) -> int | None:
    """Bytes free for a new run on device: the GPU's free memory; on the CPU the least of the system's
    MemAvailable, the room left under this process's cgroup limit (a container's --memory) and under its
    address-space limit (ulimit -v). None: unknown."""
    if device == "cuda":
        import torch

        return torch.cuda.mem_get_info()[0] if torch.cuda.is_available() else None  # absent: said later, once
    known = [x for x in (_mem_available(), _cgroup_room(), _address_space_room()) if x is not None]
    return min(known) if known else None


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):  # absent, unreadable, or "max" (no limit)
        return None


def _mem_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None


def _cgroup_room() -> int | None:
    # usage counts the page cache too; its inactive part is reclaimed before the limit bites (the kubelet's
    # "working set"), so it is not counted as taken
    for limit, usage, stat, inactive in (
        ("memory.max", "memory.current", "memory.stat", "inactive_file"),
        ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes", "memory/memory.stat", "total_inactive_file"),
    ):
        cap, used = _read_int(CGROUP / limit), _read_int(CGROUP / usage)
        if cap is not None and cap < 1 << 60 and used is not None:  # v1 writes "no limit" as a huge number
            return max(cap - used + _stat(CGROUP / stat, inactive), 0)
    return None


def _stat(path: Path, key: str) -> int:
    try:
        with open(path) as f:
            return next((int(line.split()[1]) for line in f if line.startswith(key + " ")), 0)
    except (OSError, ValueError, IndexError):
        return 0


def _address_space_room() -> int | None:
    try:
        import resource  # Unix only
    except ImportError:
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        with open("/proc/self/status") as f:
            size = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    except (OSError, StopIteration, ValueError):
        return None
    return max(soft - size, 0)


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000:
            return f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def check_fits(m: ModelConfig, t: TrainConfig, device: str, processes: int = 1) -> None:
    """ConfigError, with the estimate and what to change, when the run cannot fit in device's memory.
    processes: training processes that share this machine's memory (one per GPU on CUDA)."""
    free = available(device)
    if free is None:
        return
    state, activations = estimate(m, t)
    need = (state + activations) * (1 if device == "cuda" else processes)
    if need > free:
        raise ConfigError(
            f"this run needs about {_human(need)} of memory (weights and optimizer {_human(state)}, activations "
            f"{_human(activations)} per process) but {device} has {_human(free)} free: lower --batch-size (--grad-accum "
            f"keeps the effective batch), --context, --d-model or --layers"
        )
