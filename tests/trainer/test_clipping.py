"""Gradient clipping in one process: the trainer's clip_grad_norm is torch's clip_grad_norm_ to
the bit (the layouts compare their clipped steps with a reference that clips the same way, so a
wrong rule shared by both would go unseen there)."""

from __future__ import annotations

import pytest
import torch
from meshrun_trainer.components.optim import clip_grad_norm

pytestmark = pytest.mark.unit


def _parameters(scale: float) -> list[torch.nn.Parameter]:
    generator = torch.Generator().manual_seed(3)
    shapes = [(7, 5), (5,), (3, 3, 2)]
    dtypes = [torch.float32, torch.bfloat16, torch.float32]  # a bf16 gradient is scaled too
    params = [
        torch.nn.Parameter(torch.randn(s, generator=generator).to(d))
        for s, d in zip(shapes, dtypes, strict=True)
    ]
    for param in params:
        param.grad = (torch.randn(param.shape, generator=generator) * scale).to(param.dtype)
    return params


def _clone(params: list[torch.nn.Parameter]) -> list[torch.nn.Parameter]:
    copies = [torch.nn.Parameter(p.detach().clone()) for p in params]
    for copy, param in zip(copies, params, strict=True):
        assert param.grad is not None
        copy.grad = param.grad.clone()
    return copies


@pytest.mark.parametrize("scale", [10.0, 1e-3])
def test_clipping_is_torchs_to_the_bit(scale: float) -> None:
    ours = _parameters(scale)
    theirs = _clone(ours)
    norm = clip_grad_norm(ours, 1.0)
    want = torch.nn.utils.clip_grad_norm_(theirs, 1.0)
    assert torch.equal(norm, want)
    for mine, torchs in zip(ours, theirs, strict=True):
        assert mine.grad is not None and torchs.grad is not None
        assert mine.grad.dtype == torchs.grad.dtype
        assert torch.equal(mine.grad, torchs.grad)
    # the large gradients were scaled down to the bar; the small ones kept
    clipped = torch.nn.utils.get_total_norm([p.grad for p in ours if p.grad is not None])
    assert (clipped.item() < 1.0 + 1e-3) if scale > 1 else torch.equal(clipped, norm)


def test_experts_are_scaled_by_the_whole_models_coefficient_and_duplicates_once() -> None:
    params = _parameters(10.0)
    expert = torch.nn.Parameter(torch.zeros(4))
    expert.grad = torch.full((4,), 2.0)
    square = torch.tensor(16.0)  # the expert group's squared norm, counted as given
    reference = _clone(params)
    norm = clip_grad_norm(
        params, 1.0, duplicates=[params[2]], experts=[expert], expert_square=square
    )
    counted = [p.grad for p in reference[:2] if p.grad is not None]
    want = (torch.nn.utils.get_total_norm(counted).pow(2) + square).sqrt()
    assert torch.equal(norm, want)
    coefficient = (1.0 / (want + 1e-6)).clamp(max=1.0)
    assert torch.equal(expert.grad, torch.full((4,), 2.0) * coefficient)
    for mine, before in zip(params, reference, strict=True):
        assert mine.grad is not None and before.grad is not None
        assert torch.equal(mine.grad, (before.grad * coefficient).to(before.grad.dtype))
