"""Optimizers: AdamW, and Muon for the hidden matrices, stepped as one (make_optimizer builds them).

Muon here is torch.optim.Muon (same hyperparameters, same saved state, so checkpoints move between the
two) with a faster step: the Newton-Schulz iterations of all same-shaped matrices run as one batched
product, and in bfloat16 only where the hardware computes bfloat16 natively. torch's own step does one
matrix at a time, always in bfloat16: on a GPU the per-matrix launches cost more than the arithmetic,
and on a CPU without bf16 instructions every bf16 product is emulated, so the optimizer step alone took
longer than the forward and backward passes (benchmarks/RESULTS.md, "Muon's step").
"""

from __future__ import annotations

import math
from collections import defaultdict

import torch

from charlm.config import TrainConfig
from charlm.errors import ConfigError
from charlm.runtime import autocast_dtype


def newton_schulz(
    g: torch.Tensor, coefficients: tuple[float, float, float], steps: int, eps: float, dtype
) -> torch.Tensor:
    """The quintic Newton-Schulz iteration of Muon (Keller Jordan's, as in torch.optim.Muon) over a batch of
    matrices (G, m, n): each is scaled to Frobenius norm 1, then pushed towards the nearest semi-orthogonal
    matrix. Computed in `dtype`; returns that dtype."""
    a, b, c = coefficients
    x = g.to(dtype)
    tall = g.size(-2) > g.size(-1)
    if tall:  # iterate on the wide side: x @ x.T is then the smaller Gram matrix
        x = x.mT
    x = x / x.norm(dim=(-2, -1), keepdim=True).clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.mT
        poly = torch.baddbmm(gram, gram, gram, beta=b, alpha=c)  # b * G + c * G @ G
        x = torch.baddbmm(x, poly, x, beta=a)  # a * x + poly @ x
    return x.mT if tall else x


def newton_schulz_dtype(device: str) -> torch.dtype:
    """bfloat16 where matrix products run natively in it (what autocast picks: GPUs with bf16, CPUs with
    AVX512-BF16 or AMX), float32 elsewhere."""
    return torch.bfloat16 if autocast_dtype(device, "auto") == torch.bfloat16 else torch.float32


class Muon(torch.optim.Muon):
    """torch.optim.Muon whose step batches the Newton-Schulz iterations by shape and runs them in
    `ns_dtype` (see the module's docstring). Only the "original" learning-rate adjustment is supported."""

    def __init__(self, params, ns_dtype: torch.dtype = torch.bfloat16, **kwargs):
        if kwargs.get("adjust_lr_fn") not in (None, "original"):
            raise ValueError("charlm's Muon supports only adjust_lr_fn='original'")
        super().__init__(params, **kwargs)
        self.ns_dtype = ns_dtype

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            if any(p.grad.is_complex() or p.grad.ndim != 2 for p in params):
                raise ValueError("Muon takes real 2-D matrices only")
            grads = [p.grad for p in params]
            for p in params:  # created as torch.optim.Muon does, so the two share their state
                if "momentum_buffer" not in self.state[p]:
                    self.state[p]["momentum_buffer"] = torch.zeros_like(p.grad, memory_format=torch.preserve_format)
            bufs = [self.state[p]["momentum_buffer"] for p in params]
            momentum, lr = group["momentum"], group["lr"]
            torch._foreach_lerp_(bufs, grads, 1 - momentum)
            updates = torch._foreach_lerp(grads, bufs, momentum) if group["nesterov"] else bufs
            by_shape = defaultdict(list)
            for i, p in enumerate(params):
                by_shape[tuple(p.shape)].append(i)
            if group["weight_decay"]:
                torch._foreach_mul_(params, 1 - lr * group["weight_decay"])
            for (rows, cols), idx in by_shape.items():
                stacked = torch.stack([updates[i] for i in idx])
                ortho = newton_schulz(stacked, group["ns_coefficients"], group["ns_steps"], group["eps"], self.ns_dtype)
                scale = lr * math.sqrt(max(1, rows / cols))  # torch's "original" adjustment
                torch._foreach_add_(
                    [params[i] for i in idx], list(ortho.to(params[idx[0]].dtype).unbind()), alpha=-scale
                )
        return loss


class Optimizers:
    """Several optimizers stepped as one (Muon for hidden matrices, AdamW for the rest).

    Each param group carries an "lr_scale": the schedule sets lr = scheduled lr * lr_scale."""

    def __init__(self, optimizers: list[torch.optim.Optimizer]):
        self.optimizers = optimizers

    @property
    def param_groups(self) -> list[dict]:
        return [g for o in self.optimizers for g in o.param_groups]

    def set_lr(self, lr: float) -> None:
        for group in self.param_groups:
            group["lr"] = lr * group["lr_scale"]

    def step(self, scaler: torch.amp.GradScaler | None = None) -> None:
        """One step of each; with fp16's scaler, through it (it skips a step whose gradients overflowed)."""
        for o in self.optimizers:
            if scaler:
                scaler.step(o)
            else:
                o.step()
        if scaler:
            scaler.update()

    def unscale(self, scaler: torch.amp.GradScaler | None) -> None:
        """Divide the gradients by fp16's loss scale, so clipping sees the true ones."""
        for o in self.optimizers if scaler else ():
            scaler.unscale_(o)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self.optimizers:
            o.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return {"optimizers": [o.state_dict() for o in self.optimizers]}

    def load_state_dict(self, state: dict) -> None:
        if len(state.get("optimizers", [])) != len(self.optimizers):
            raise ConfigError(
                "the checkpoint's optimizer state does not match --optimizer: resume with the same optimizer"
            )
        for o, s in zip(self.optimizers, state["optimizers"]):
            o.load_state_dict(s)


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig, device: str) -> Optimizers:
    """AdamW; or, with cfg.optimizer == "muon", Muon for the 2-D weights inside the network (attention,
    MLP, recurrent matrices) and AdamW for embeddings, the output head, norms and biases (Muon is
    only meant for hidden matrices)."""
    named = {id(p): (n, p) for n, p in model.named_parameters() if p.requires_grad}.values()  # tied weights once
    adam = dict(betas=(0.9, cfg.beta2), fused=device == "cuda")
    if cfg.optimizer == "muon":
        hidden = {id(p) for p in model.hidden_matrices()}  # the model says which weights are inside the network
        muon = [p for n, p in named if id(p) in hidden]
        rest = [(n, p) for n, p in named if id(p) not in hidden]
        groups = [
            {"params": [p for n, p in rest if p.dim() >= 2], "weight_decay": cfg.weight_decay, "lr_scale": 1.0},
            {"params": [p for n, p in rest if p.dim() < 2], "weight_decay": 0.0, "lr_scale": 1.0},
        ]
        return Optimizers(
            [
                Muon(
                    [{"params": muon, "lr_scale": cfg.muon_lr / cfg.lr}],
                    lr=cfg.muon_lr,
                    ns_steps=cfg.muon_steps,
                    momentum=cfg.muon_momentum,
                    weight_decay=0.0,
                    ns_dtype=newton_schulz_dtype(device),
                ),
                torch.optim.AdamW(groups, lr=cfg.lr, **adam),
            ]
        )
    decay = [p for n, p in named if p.dim() >= 2]  # matrices and embeddings
    no_decay = [p for n, p in named if p.dim() < 2]  # norms and biases
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay, "lr_scale": 1.0},
        {"params": no_decay, "weight_decay": 0.0, "lr_scale": 1.0},
    ]
    return Optimizers([torch.optim.AdamW(groups, lr=cfg.lr, **adam)])
