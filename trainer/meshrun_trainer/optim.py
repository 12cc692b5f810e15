"""Optimizer construction and global gradient-norm clipping."""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.distributed.tensor import DTensor

ADAMW_BETAS = (0.9, 0.95)
"""Llama 2 paper's AdamW betas (Touvron et al. 2023, section 2.2)."""
WEIGHT_DECAY = 0.1
"""Llama 2 paper's weight decay."""


def make_optimizer(
    params: Iterable[torch.nn.Parameter],
    learning_rate: float,
    zero1_group: dist.ProcessGroup | None = None,
) -> torch.optim.Optimizer:
    """AdamW; sharded across ``zero1_group`` (ZeRO-1) when given."""
    params = list(params)
    if zero1_group is not None:
        return ZeroRedundancyOptimizer(
            params,
            optimizer_class=torch.optim.AdamW,
            process_group=zero1_group,
            lr=learning_rate,
            betas=ADAMW_BETAS,
            weight_decay=WEIGHT_DECAY,
        )
    return torch.optim.AdamW(params, lr=learning_rate, betas=ADAMW_BETAS, weight_decay=WEIGHT_DECAY)


def clip_grad_norm(
    params: list[torch.nn.Parameter],
    max_norm: float,
    pp_group: dist.ProcessGroup | None = None,
) -> torch.Tensor:
    """Clip by the norm over all parameters of the whole model; returns that norm.

    DTensor gradients (TP and FSDP shards) give a DTensor norm whose full_tensor() covers the
    TP/DP shards; pipeline stages hold disjoint parameters, so their squared norms are summed
    across the pp group (the torchtitan recipe). DDP gradients are already whole on each rank.
    """
    grads = [p.grad for p in params if p.grad is not None]
    total = torch.nn.utils.get_total_norm(grads, norm_type=2.0)
    if isinstance(total, DTensor):
        total = total.full_tensor()
    if pp_group is not None and dist.get_world_size(pp_group) > 1:
        squared = total.pow(2)
        dist.all_reduce(squared, group=pp_group)
        total = squared.sqrt()
    if max_norm > 0:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return total
