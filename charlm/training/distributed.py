"""Several training processes on PyTorch's own engine. torchrun starts one process per rank and tells
each, through environment variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), who it
is and where to meet; this module joins them into a process group and offers the few collectives the
trainer needs. Without torchrun (WORLD_SIZE unset or 1) everything here is a no-op: one process.

Failures: if a rank dies, torchrun notices its exit and stops the others. The process group's timeout
is the backstop for a rank that hangs without dying, so no rank ever waits forever.
"""

from __future__ import annotations

import hashlib
import os
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import NoReturn

import torch
import torch.distributed as dist

from charlm.errors import ConfigError

# Long enough for rank 0 to encode a large corpus while the others wait, finite so a hang ends.
TIMEOUT = timedelta(minutes=30)


@dataclass(frozen=True)
class Dist:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0  # this rank's index on its machine: its GPU

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def env() -> Dist:
    """Who this process is, from torchrun's environment variables (no process group needed)."""
    get = lambda name, default: int(os.environ.get(name, default))  # noqa: E731
    return Dist(rank=get("RANK", 0), world_size=get("WORLD_SIZE", 1), local_rank=get("LOCAL_RANK", 0))


def init(device: str) -> Dist:
    """Join the process group torchrun set up (gloo on CPU, NCCL on CUDA); a no-op for one process.
    On CUDA it makes this rank's GPU the current device, so "cuda" means that GPU everywhere."""
    me = env()
    if not me.enabled or dist.is_initialized():
        return me
    if device == "cuda":
        if me.local_rank >= torch.cuda.device_count():
            raise ConfigError(
                f"rank {me.rank} needs GPU {me.local_rank}, but only {torch.cuda.device_count()} are visible: "
                "start at most one process per GPU"
            )
        torch.cuda.set_device(me.local_rank)
    dist.init_process_group("nccl" if device == "cuda" else "gloo", timeout=TIMEOUT)
    return me


def close() -> None:
    """Leave the process group (torch warns at exit about a group that was never destroyed)."""
    if dist.is_initialized():
        dist.destroy_process_group()


def exit_process(code: int | str | None = 0) -> NoReturn:
    """End a torchrun process, its process group closed, without Python's finalization. Gloo's worker threads
    outlive destroy_process_group, and one may still be releasing the last collective's tensors, which takes
    the GIL: if the interpreter is finalizing by then, the thread is killed inside a C++ destructor and the
    process aborts (SIGABRT, "terminate called without an active exception"; seen in about 1 run in 10 on a
    busy 2-core machine), which torchrun reports as a failed run after a good one. Everything charlm writes is
    on disk by now (atomic saves, closed files); only the standard streams need flushing."""
    if isinstance(code, str):  # sys.exit("message") prints it
        print(code, file=sys.stderr)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: nothing more can reach it
            pass
    os._exit(code if isinstance(code, int) else 0 if code is None else 1)


def _device() -> torch.device:
    # NCCL only moves CUDA tensors; gloo only CPU ones
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def all_max(values: list[float]) -> list[float]:
    """The element-wise maximum over all ranks: e.g. [stop requested?, seconds trained], so that every
    rank stops at the same step and follows the same clock."""
    if not dist.is_initialized():
        return values
    t = torch.tensor(values, dtype=torch.float64, device=_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def all_sum(values: list[float]) -> list[float]:
    """The element-wise sum over all ranks (gloo has no AVG: divide by the world size yourself)."""
    if not dist.is_initialized():
        return values
    t = torch.tensor(values, dtype=torch.float64, device=_device())
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.tolist()


def all_gather(obj) -> list:
    """Every rank's obj (picklable, small: RNG states, digests), in rank order, on every rank."""
    if not dist.is_initialized():
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def weights_digest(state_dict: dict[str, torch.Tensor]) -> str:
    """sha256 of the weights' bytes, in key order: equal digests mean bit-identical weights."""
    h = hashlib.sha256()
    for name, t in state_dict.items():
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()
