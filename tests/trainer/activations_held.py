"""The activation bytes a model's forward holds for backward: as torch's MemTracker sees them,
and as autograd's own saved tensors add up."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

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
    """Bytes of the distinct storages autograd keeps from one forward of ``tokens``, parameters
    left out, then its backward. Every saved-tensor hook the model pushes is watched: what its
    pack returns is what backward holds (a tensor, or the tensors inside a packed record, such
    as a kept shard in place of its gathered tensor). It does not depend on when storages are
    freed, as MemTracker's count does, so it is the same under any load."""
    params = {_storage(p).data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}  # data pointer: bytes; autograd keeps each alive until backward

    def record(packed: object) -> None:
        for tensor in _tensors_in(packed):
            kept = _storage(tensor)
            if kept.data_ptr() not in params:
                saved[kept.data_ptr()] = kept.nbytes()

    # The outermost hook, identity, lets ``record`` see what autograd saves outside any of the
    # model's own hooks.
    with (
        _every_pack_recorded(record),
        torch.autograd.graph.saved_tensors_hooks(lambda tensor: tensor, lambda tensor: tensor),
    ):
        loss = cross_entropy(model(tokens), tokens)
    held = sum(saved.values())
    loss.backward()
    return held


@contextmanager
def _every_pack_recorded(record: Callable[[object], None]) -> Iterator[None]:
    """While inside, every saved-tensor hook pushed (the model's own ones included) still runs
    as given, and ``record`` sees what its pack returns. Nothing stands in for the trainer's
    hooks: they are wrapped, not replaced, and torch's class is restored on the way out."""
    hooks = torch.autograd.graph.saved_tensors_hooks
    push = hooks.__init__

    def watched(self: Any, pack: Callable[[torch.Tensor], Any], unpack: Any) -> None:
        def pack_and_record(tensor: torch.Tensor) -> Any:
            packed = pack(tensor)
            record(packed)
            return packed

        push(self, pack_and_record, unpack)

    hooks.__init__ = watched  # type: ignore[method-assign]
    try:
        yield
    finally:
        hooks.__init__ = push  # type: ignore[method-assign]


def _storage(tensor: torch.Tensor) -> torch.UntypedStorage:
    local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    if isinstance(local, AsyncCollectiveTensor):  # a gathered input, not yet waited on
        local = local.elem
    return local.untyped_storage()


def _tensors_in(packed: object) -> list[torch.Tensor]:
    """The tensors a pack hook's result holds: itself, or those in its dataclass fields."""
    if isinstance(packed, torch.Tensor):
        return [packed]
    if dataclasses.is_dataclass(packed) and not isinstance(packed, type):
        return [
            tensor
            for item in dataclasses.fields(packed)
            for tensor in _tensors_in(getattr(packed, item.name))
        ]
    return []
