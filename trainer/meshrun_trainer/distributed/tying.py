"""Tied input embedding and output head across pipeline stages.

With tied embeddings and pipeline parallelism the first stage holds the embedding and the last
stage the head: two copies of one matrix, started equal. After every backward pass the two
gradients are summed between the first and last stage of each (dp, cp, tp) coordinate, Megatron-LM's
embedding group, so both copies take the same optimizer steps and stay equal.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from meshrun_trainer.distributed.mesh import Mesh


def embedding_group(mesh: Mesh) -> dist.ProcessGroup | None:
    """This rank's (first stage, last stage) group; collective: every rank must call it."""
    ranks = mesh.device_mesh.mesh  # (pp, dp, dp_shard, cp, tp) global ranks
    ends = ranks[[0, -1]].reshape(2, -1)  # first and last stage at each other coordinate
    pairs = [[int(first), int(last)] for first, last in ends.T]
    mine, _ = dist.new_subgroups_by_enumeration(pairs)  # type: ignore[no-untyped-call]
    group: dist.ProcessGroup | None = mine
    return group


def tied_parameters(parts: Iterable[nn.Module]) -> list[nn.Parameter]:
    """The embedding on the first stage, the head on the last (the tied copies)."""
    found = []
    for part in parts:
        for name, param in part.named_parameters():
            if name.endswith(("tok_embeddings.weight", "output.weight")):
                found.append(param)
    return found


def sync_tied_gradients(params: list[nn.Parameter], group: dist.ProcessGroup | None) -> None:
    """Sum the copies' gradients over the embedding group."""
    if group is None:
        return
    for param in params:
        grad = param.grad
        if grad is None:
            grad = torch.zeros_like(param)
            param.grad = grad
        local = grad.to_local() if isinstance(grad, DTensor) else grad
        dist.all_reduce(local, group=group)
