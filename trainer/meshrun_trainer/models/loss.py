"""The training loss: mean next-token cross-entropy, computed in fp32 a slice of rows at a time.

``F.cross_entropy(logits.float(), targets)`` keeps an fp32 copy of the log-probabilities for
backward and, at the start of backward, makes two more fp32 tensors of the logits' size (the
gradient of the log-probabilities and that of the logits): 12 bytes per logit, which for a
128,256-token vocabulary is 1.5 MB per token, 47 GiB for eight sequences of 4,096. This loss keeps
the logits as they come (16-bit under bf16) and one fp32 log-sum-exp per row, and rebuilds the
softmax in backward slice by slice straight into the logits' gradient, so it holds the logits
and their gradient (4 bytes per logit in bf16) and one slice of fp32 scratch.

Logits sharded over the vocabulary (a DTensor from the tensor-parallel output head) are reduced
across the tensor-parallel group: the ranks' log-sum-exps (their maximum, then the sum of their
exponentials) and the target's logit, each an all-reduce of one number per row.

Rows whose target is ``IGNORE`` (-100, torch's ``ignore_index``: the padding rows of a
validation block) count in neither the mean nor the gradient, as in ``F.cross_entropy``.

Under context parallelism each rank holds part of every sequence: its loss is the sum of its own
tokens' losses over the count of the whole group's (one all-reduce of a number), times the
group's size, so that averaging over the data-parallel x context-parallel ranks, as their
gradients are, gives the mean over all tokens, as one process computes it.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Shard

from meshrun.planner.memory import loss_slice_rows

IGNORE = -100
"""A target that is left out of the mean (``F.cross_entropy``'s default ``ignore_index``)."""


def cross_entropy(
    logits: torch.Tensor, targets: torch.Tensor, context: dist.ProcessGroup | None = None
) -> torch.Tensor:
    """Mean next-token cross-entropy in fp32 of ``logits`` (..., vocab) against ``targets``,
    over the targets that are not ``IGNORE``; ``context``: the context-parallel group holding
    the rest of these sequences (the mean is over all of their tokens, times its size)."""
    group: dist.ProcessGroup | None = None
    start = 0
    if isinstance(logits, DTensor):
        placement = logits.placements[0]
        if isinstance(placement, Shard) and placement.dim in (-1, logits.ndim - 1):
            group = logits.device_mesh.get_group()
            shard = -(-logits.shape[-1] // dist.get_world_size(group))  # torch.chunk's split
            start = logits.device_mesh.get_local_rank() * shard
        logits = logits.to_local()
    rows = logits.reshape(-1, logits.shape[-1])
    counted = (targets.reshape(-1) != IGNORE).float()
    total = counted.sum()
    if context is not None:
        dist.all_reduce(total, group=context)
        total = total / dist.get_world_size(context)
    weight = counted / total  # each counted row's share of the mean
    loss: torch.Tensor = _CrossEntropy.apply(  # type: ignore[no-untyped-call]
        rows, targets.reshape(-1), group, start, weight
    )
    return loss


class _CrossEntropy(torch.autograd.Function):
    """Rows of (local) logits, their global targets, the vocabulary group, the first
    vocabulary index held here and each row's weight in the mean.

    Each rank takes the log-sum-exp of its own logits (one fused kernel over an fp32 slice);
    the group combines them as ``m + log(sum(exp(lse_r - m)))`` with m their maximum, so only
    one number per row crosses the group. Backward is the softmax of the rank's own logits
    (fp32 from the 16-bit logits in one kernel) rescaled to the global one by
    ``exp(lse_r - lse)``, less one at the target on the rank that holds it."""

    @staticmethod
    def forward(
        ctx: Any,
        logits: torch.Tensor,
        targets: torch.Tensor,
        group: dist.ProcessGroup | None,
        start: int,
        weight: torch.Tensor,
    ) -> torch.Tensor:
        rows, vocab = logits.shape
        counted = targets != IGNORE
        local = targets - start
        held = counted & (local >= 0) & (local < vocab)
        index = local.clamp(0, vocab - 1).unsqueeze(1)
        own = torch.empty(rows, dtype=torch.float32, device=logits.device)
        picked = torch.empty_like(own)
        step = loss_slice_rows(vocab)
        for first in range(0, rows, step):
            part = logits[first : first + step].float()
            span = slice(first, first + part.shape[0])
            own[span] = torch.logsumexp(part, dim=1)
            picked[span] = part.gather(1, index[span]).squeeze(1)
        picked.masked_fill_(~held, 0.0)  # the target's logit where this rank holds it
        lse = own
        if group is not None:
            top = own.clone()
            dist.all_reduce(top, op=dist.ReduceOp.MAX, group=group)
            total = (own - top).exp()
            dist.all_reduce(total, op=dist.ReduceOp.SUM, group=group)
            lse = top + total.log()
            dist.all_reduce(picked, op=dist.ReduceOp.SUM, group=group)
        ctx.save_for_backward(logits, index, held, (own - lse).exp() * weight, weight)
        return ((lse - picked) * weight).sum()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        logits, index, held, share, weight = ctx.saved_tensors
        rows, vocab = logits.shape
        scale = grad.float()
        result = torch.empty_like(logits)
        step = loss_slice_rows(vocab)
        for first in range(0, rows, step):
            span = slice(first, min(first + step, rows))
            part = torch.softmax(logits[span], dim=1, dtype=torch.float32)
            part.mul_((share[span] * scale).unsqueeze(1))
            at_target = -scale * weight[span] * held[span]
            part.scatter_add_(1, index[span], at_target.unsqueeze(1))
            result[span] = part
        return result, None, None, None, None
