"""Context-parallel attention on four real gloo ranks against one process's causal attention.

Each rank holds its two chunks of every sequence (the load-balanced split), rotates its queries
and keys at their global positions, gathers the keys and values over its cp group (grouped-query:
2 KV heads for 4 query heads) and attends. Over cp 2 (two groups of two ranks) and cp 4 (one
group), the outputs and the gradients of queries, keys and values, each rank's own chunks, equal
those of ``scaled_dot_product_attention(is_causal=True)`` over the whole sequence within 1e-5:
a wrong chunk order, position, mask edge or a missing reduction of the keys' gradients in
backward shows at once. The boolean masks equal torch's lower-right causal bias, which CUDA's
kernels apply instead.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from meshrun_trainer.models.context import (
    ContextGroup,
    context_attention,
    positions,
    sequence_share,
)
from torch.nn.attention.bias import CausalBias
from trainer_launch import gloo_ranks

pytestmark = [pytest.mark.trainer, pytest.mark.timeout(120)]

WORLD, BATCH, SEQ, HEADS, KV_HEADS, DIM = 4, 2, 16, 4, 2, 8


def _whole(seed: int) -> tuple[torch.Tensor, ...]:
    """Queries, keys, values and an output weight over the whole sequence (every rank alike)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(BATCH, SEQ, HEADS, DIM, generator=g)
    k = torch.randn(BATCH, SEQ, KV_HEADS, DIM, generator=g)
    v = torch.randn(BATCH, SEQ, KV_HEADS, DIM, generator=g)
    weight = torch.randn(BATCH, SEQ, HEADS, DIM, generator=g)
    return q, k, v, weight


def _reference(seed: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    q, k, v, weight = (t.requires_grad_(i < 3) for i, t in enumerate(_whole(seed)))
    keys = k.repeat_interleave(HEADS // KV_HEADS, dim=2)
    values = v.repeat_interleave(HEADS // KV_HEADS, dim=2)
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2), is_causal=True
    ).transpose(1, 2)
    (out * weight).sum().backward()
    return out.detach(), [t.grad for t in (q, k, v) if t.grad is not None]


def _rank(rank: int, results: dict[str, Any]) -> None:
    errors: dict[str, float] = {}
    for cp in (2, 4):
        groups = [list(range(first, first + cp)) for first in range(0, WORLD, cp)]
        mine, _ = dist.new_subgroups_by_enumeration(groups)  # type: ignore[no-untyped-call]
        context = ContextGroup(mine, rank % cp, cp, SEQ, torch.device("cpu"))
        want, grads = _reference(cp)
        held = [sequence_share(t, context.rank, cp) for t in _whole(cp)]
        q, k, v = (t.requires_grad_() for t in held[:3])
        assert positions(SEQ // cp, context.rank, cp, q.device).tolist() == [
            p
            for p in range(SEQ)
            if (p // (SEQ // (2 * cp))) in (context.rank, 2 * cp - 1 - context.rank)
        ]
        # CUDA's masks are torch's lower-right causal bias: the same booleans, applied by kernels
        chunk = SEQ // (2 * cp)
        for bias, mask in zip(context._masks(chunk, None), context.masks, strict=True):
            assert isinstance(bias, CausalBias) and torch.equal(bias._materialize(), mask)
        out = context_attention(q, k, v, context)
        (out * held[3]).sum().backward()
        errors[f"cp{cp}/out"] = (out - sequence_share(want, context.rank, cp)).abs().max().item()
        for name, got, whole in zip("qkv", (q, k, v), grads, strict=True):
            assert got.grad is not None
            share = sequence_share(whole, context.rank, cp)
            errors[f"cp{cp}/d{name}"] = (got.grad - share).abs().max().item()
    results[str(rank)] = errors


def test_gathered_attention_equals_whole_sequence() -> None:
    results = gloo_ranks(_rank, WORLD)
    assert set(results) == {str(r) for r in range(WORLD)}
    worst = {key: max(r[key] for r in results.values()) for key in results["0"]}
    assert len(worst) == 8 and max(worst.values()) < 1e-5, worst
