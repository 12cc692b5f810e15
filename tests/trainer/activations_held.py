"""The activation bytes a model's forward holds for backward: as torch's MemTracker sees them,
and as autograd's own saved tensors add up."""

from __future__ import annotations

import torch
from meshrun_trainer.models.loss import cross_entropy
from torch import nn
from torch.distributed._functional_collectives import AsyncCollectiveTensor
from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType
from torch.distributed.tensor import DTensor


def held_after_forward(model: nn.Module, tokens: torch.Tensor) -> int:
    """Bytes of activations alive after one forward of ``tokens`` (CPU), then its backward."""
    tracker = MemTracker()
    tracker.track_external(model)
    with tracker:
        loss = cross_entropy(model(tokens), tokens)
        held: int = tracker.get_tracker_snapshot("current")[torch.device("cpu")][_MemRefType.ACT]
        loss.backward()
    return held


def saved_after_forward(model: nn.Module, tokens: torch.Tensor) -> int:
    """Bytes of the distinct storages autograd saves in one forward of ``tokens``, parameters
    left out, then its backward. Counts only what no inner saved-tensor hook takes over (an
    inner hook hides its tensors from this one), so it suits a model without such hooks; it does
    not depend on when storages are freed, as MemTracker's count does."""

    def storage(tensor: torch.Tensor) -> torch.UntypedStorage:
        local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
        if isinstance(local, AsyncCollectiveTensor):  # a gathered input, not yet waited on
            local = local.elem
        return local.untyped_storage()

    params = {storage(p).data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}  # data pointer: bytes; autograd keeps each alive until backward

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        kept = storage(tensor)
        if kept.data_ptr() not in params:
            saved[kept.data_ptr()] = kept.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = cross_entropy(model(tokens), tokens)
    held = sum(saved.values())
    loss.backward()
    return held
