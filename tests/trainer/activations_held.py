"""The activation bytes a model's forward holds for backward, as torch's MemTracker sees them."""

from __future__ import annotations

import torch
from meshrun_trainer.models.llama import cross_entropy
from torch import nn
from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType


def held_after_forward(model: nn.Module, tokens: torch.Tensor) -> int:
    """Bytes of activations alive after one forward of ``tokens`` (CPU), then its backward."""
    tracker = MemTracker()
    tracker.track_external(model)
    with tracker:
        loss = cross_entropy(model(tokens), tokens)
        held: int = tracker.get_tracker_snapshot("current")[torch.device("cpu")][_MemRefType.ACT]
        loss.backward()
    return held
