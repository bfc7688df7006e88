"""charlm's Muon against torch.optim.Muon (the same algorithm, one matrix at a time in bf16) and against a
float64 Newton-Schulz written out here; its state moves between the two, so old checkpoints resume."""

from __future__ import annotations

import pytest
import torch

from charlm.training.optim import Muon, newton_schulz, newton_schulz_dtype

A, B, C = 3.4445, -4.7750, 2.0315  # the quintic's coefficients (Keller Jordan's Muon)
SHAPES = [(24, 16), (24, 16), (16, 24), (16, 16), (40, 16)]  # tall, wide, square, two alike to batch


def reference_ns(g: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """One matrix, float64, with no shortcuts: X <- aX + (bXX^T + c(XX^T)^2) X on the wide orientation."""
    x = g.double()
    tall = x.shape[0] > x.shape[1]
    x = x.T if tall else x
    x = x / x.norm()
    for _ in range(steps):
        gram = x @ x.T
        x = A * x + (B * gram + C * gram @ gram) @ x
    return x.T if tall else x


def params(seed: int) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=g)) for s in SHAPES]


def set_grads(ps, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for p in ps:
        p.grad = torch.randn(p.shape, generator=g)


def test_batched_newton_schulz_in_float32_matches_a_float64_reference():
    g = torch.randn(3, 40, 16, generator=torch.Generator().manual_seed(0))
    got = newton_schulz(g, (A, B, C), 5, 1e-7, torch.float32)
    assert got.dtype == torch.float32 and got.shape == g.shape
    for i in range(3):
        torch.testing.assert_close(got[i].double(), reference_ns(g[i]), atol=1e-5, rtol=1e-5)
    # and it does what it is for: singular values pushed from anywhere into roughly (0.5, 1.5)
    assert torch.linalg.svdvals(g[0]).max() / torch.linalg.svdvals(g[0]).min() > 2
    s = torch.linalg.svdvals(got[0])
    assert s.min() > 0.5 and s.max() < 1.5


@pytest.mark.parametrize("nesterov", [True, False])
def test_steps_match_torch_muon(nesterov):
    kw = dict(lr=0.02, weight_decay=0.1, momentum=0.95, nesterov=nesterov)
    for dtype, atol in ((torch.bfloat16, 1e-6), (torch.float32, 1e-3)):
        ours, theirs, start = params(1), params(1), params(1)
        opt_ours, opt_theirs = Muon(ours, ns_dtype=dtype, **kw), torch.optim.Muon(theirs, **kw)
        for step in range(3):
            set_grads(ours, step), set_grads(theirs, step)
            opt_ours.step(), opt_theirs.step()
        for a, b, s in zip(ours, theirs, start):
            # in bf16 both compute the same products (measured: identical); in float32 ours skips bf16's
            # rounding, 4e-4 here, on weights that moved by 0.05 (momentum 0.9 instead of 0.95 gives 1.7e-3)
            torch.testing.assert_close(a, b, atol=atol, rtol=0)
            assert (a - s).abs().max() > 0.01


def test_state_moves_between_torch_muon_and_ours():
    """A checkpoint written with torch.optim.Muon resumes with charlm's, and back."""
    start = params(3)
    theirs = torch.optim.Muon(start, lr=0.02, weight_decay=0.0)
    set_grads(start, 0)
    theirs.step()
    ours = Muon(start, lr=0.02, weight_decay=0.0, ns_dtype=torch.float32)
    ours.load_state_dict(theirs.state_dict())
    for p in start:
        assert torch.equal(ours.state[p]["momentum_buffer"], theirs.state[p]["momentum_buffer"])
    set_grads(start, 1)
    ours.step()
    back = torch.optim.Muon(start, lr=0.02, weight_decay=0.0)
    back.load_state_dict(ours.state_dict())
    for p in start:
        assert torch.equal(back.state[p]["momentum_buffer"], ours.state[p]["momentum_buffer"])
    # the buffer is the momentum average of the two gradients: lerp twice from zero
    g0, g1 = params(0), params(0)
    set_grads(g0, 0), set_grads(g1, 1)
    for p, a, b in zip(start, g0, g1):
        expect = torch.zeros_like(a.grad).lerp_(a.grad, 0.05).lerp_(b.grad, 0.05)
        torch.testing.assert_close(ours.state[p]["momentum_buffer"], expect)


def test_newton_schulz_runs_in_bf16_only_where_the_hardware_has_it():
    native = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    assert newton_schulz_dtype("cpu") == (torch.bfloat16 if native else torch.float32)
    if torch.cuda.is_available():
        assert newton_schulz_dtype("cuda") == (torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32)


def test_the_muon_settings_reach_torch_muon_as_it_would_run_them():
    """--muon-steps and --muon-momentum: charlm's Muon, built from a TrainConfig, takes the same steps as
    torch.optim.Muon given ns_steps and momentum by hand (the reference); the defaults are torch's."""
    from charlm.config import ModelConfig, TrainConfig
    from charlm.models import build_model
    from charlm.training.optim import make_optimizer

    assert (TrainConfig().muon_steps, TrainConfig().muon_momentum) == (5, 0.95)  # torch.optim.Muon's
    model = build_model(ModelConfig(kind="transformer", vocab_size=11, n_layers=1, d_model=16, n_heads=2, context=8))
    cfg = TrainConfig(muon_steps=3, muon_momentum=0.8, muon_lr=0.02)
    ours = make_optimizer(model, cfg, "cpu").optimizers[0]
    start = [p.detach().clone() for p in ours.param_groups[0]["params"]]
    theirs_params = [torch.nn.Parameter(p.clone()) for p in start]
    theirs = torch.optim.Muon(theirs_params, lr=0.02, weight_decay=0.0, ns_steps=3, momentum=0.8)
    ours.ns_dtype = torch.bfloat16  # as torch's own step: then the two compute the same products
    for step in range(3):
        g = torch.Generator().manual_seed(step)
        for p, q in zip(ours.param_groups[0]["params"], theirs_params):
            p.grad = q.grad = torch.randn(p.shape, generator=g)
        ours.step()
        theirs.step()
    for p, q in zip(ours.param_groups[0]["params"], theirs_params):
        torch.testing.assert_close(p.detach(), q.detach(), atol=1e-6, rtol=0)
