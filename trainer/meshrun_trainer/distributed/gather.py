"""Sequence parallelism's all-gather before the column-parallel matrices, and what backward
keeps of it.

Under tensor parallelism each norm's output is split along the sequence; it is all-gathered
whole before the column-parallel matrices (wq/wk/wv, w1/w3), whose weight gradients need that
whole input. Kept as it is, it costs a whole ``h`` per token per norm, not divided by t.
Megatron-LM keeps the sequence-parallel shard instead and all-gathers it again in backward (its
``LinearWithGradAccumulationAndAsyncCommunication`` saves the input before the gather;
Korthikanti et al. 2022, section 4.2.2). :func:`gather_inputs` does the same with saved-tensor
hooks around the attention and feed-forward modules: a tensor autograd saves that is (a view
of) the gathered input is packed as the shard, and gathered again, once per module call, when
backward first unpacks it, dropped when the last of its views is unpacked.

Under autocast the shard is cast to the autocast dtype before the gather (the matrices would
cast the gathered input anyway, and keep that copy), so what travels and what is kept is
16-bit either way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Replicate


@dataclass
class _Gathered:
    """One module call's gathered input: its shard, where the gathered tensor's storage was,
    and the tensor gathered again in backward while views of it remain to be unpacked."""

    shard: DTensor
    storage: int
    pending: int = 0
    again: torch.Tensor | None = field(default=None, repr=False)

    def local(self) -> torch.Tensor:
        if self.again is None:
            with torch.no_grad():
                self.again = self.shard.redistribute(placements=[Replicate()])._local_tensor
        return self.again


@dataclass(frozen=True)
class _Packed:
    source: _Gathered
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    mesh: Any
    placements: tuple[Any, ...]
    shape: torch.Size
    global_stride: tuple[int, ...]


def _pack_hook(source: _Gathered) -> Callable[[torch.Tensor], Any]:
    def pack(tensor: torch.Tensor) -> Any:
        if not isinstance(tensor, DTensor):
            return tensor
        local = tensor._local_tensor
        if local.untyped_storage().data_ptr() != source.storage:
            return tensor
        source.pending += 1
        return _Packed(
            source,
            tuple(local.size()),
            tuple(local.stride()),
            int(local.storage_offset()),
            tensor.device_mesh,
            tuple(tensor.placements),
            tensor.shape,
            tuple(tensor.stride()),
        )

    return pack


def _unpack(packed: Any) -> Any:
    if not isinstance(packed, _Packed):
        return packed
    source = packed.source
    local = source.local().as_strided(packed.size, packed.stride, packed.offset)
    source.pending -= 1
    if source.pending == 0:
        source.again = None  # its last view is unpacked: backward holds it no longer
    return placed(local, packed.mesh, packed.placements, packed.shape, packed.global_stride)


def placed(
    local: torch.Tensor, mesh: Any, placements: Any, shape: torch.Size, stride: tuple[int, ...]
) -> DTensor:
    """``local`` as this rank's part of a DTensor of global ``shape`` and ``stride`` (no
    communication, no check)."""
    return DTensor.from_local(local, mesh, placements, run_check=False, shape=shape, stride=stride)


def _gathering(forward: Callable[..., torch.Tensor], keep_shard: bool) -> Callable[..., Any]:
    def run(x: DTensor, *args: Any) -> torch.Tensor:
        device = x.device.type
        if torch.is_autocast_enabled(device):
            x = cast(DTensor, x.to(torch.get_autocast_dtype(device)))
        gathered = x.redistribute(placements=[Replicate()])
        local = gathered._local_tensor
        if not keep_shard or not local.is_contiguous() or local.storage_offset():
            return forward(gathered, *args)
        source = _Gathered(cast(DTensor, x.detach()), local.untyped_storage().data_ptr())
        with torch.autograd.graph.saved_tensors_hooks(_pack_hook(source), _unpack):
            return forward(gathered, *args)

    return run


def gather_inputs(blocks: list[nn.Module], keep_shard: bool) -> None:
    """Gather the attention's and the feed-forward's sequence-sharded input before they run;
    with ``keep_shard`` backward keeps the shard and gathers it again (without it, autograd
    keeps the gathered tensor, or activation checkpointing decides)."""
    for block in blocks:
        for name in ("attention", "feed_forward"):
            module = getattr(block, name, None)  # a MoE layer has no feed_forward
            if module is None:
                continue
            # An instance attribute shadows the class's forward; __call__ still runs the hooks.
            module.__dict__["forward"] = _gathering(module.forward, keep_shard)
