"""The activation bytes a model's forward holds for backward: as torch's MemTracker sees them,
and as autograd's own saved tensors add up."""

from __future__ import annotations

import torch
from meshrun_trainer.models.llama import cross_entropy
from torch import nn
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


def _plain(tensor: torch.Tensor) -> torch.Tensor:
    """The plain tensor under DTensor and collective wrappers, whose storage holds the bytes."""
    while True:
        if isinstance(tensor, DTensor):
            tensor = tensor._local_tensor
        elif hasattr(tensor, "elem"):  # funcol's AsyncCollectiveTensor
            tensor = tensor.elem
        else:
            return tensor


def saved_after_forward(model: nn.Module, tokens: torch.Tensor) -> int:
    """Bytes of the distinct storages autograd saves in one forward of ``tokens``, parameters
    left out, then its backward. Counts only what no inner saved-tensor hook takes over (an
    inner hook hides its tensors from this one), so it suits a model without such hooks; it does
    not depend on when storages are freed, as MemTracker's count does."""
    params = {_plain(p).untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, tuple[int, torch.Tensor]] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = _plain(tensor).untyped_storage()
        if storage.data_ptr() not in params:
            saved[storage.data_ptr()] = (storage.nbytes(), tensor)  # alive, so the key is unique
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = cross_entropy(model(tokens), tokens)
    held = sum(nbytes for nbytes, _ in saved.values())
    saved.clear()
    loss.backward()
    return held
