"""Give a model built on the meta device its memory and its initial values, shard by shard.

A model is built on the meta device (no memory), cut to its pipeline stage, parallelised (tensor
parallel, FSDP2), and only then materialized: ``to_empty`` allocates each rank's own shards, and
a :class:`WeightSource` writes their values. No rank ever holds the whole model.

The seam is :class:`WeightSource`: ``fill(targets)`` receives every parameter this rank holds, by
its canonical name (the model's own names, without wrapper prefixes), each a plain tensor (the
whole parameter) or a DTensor (this rank's shard of it), and writes their values in place.
Every rank calls it once, at the same point, so a source may use collectives.

- :class:`FullTensorSource` fills one parameter at a time from a full tensor it makes: the full
  tensor of ONE parameter exists at a time, is sliced into this rank's shard and dropped, so
  the extra memory is the largest single parameter.
- :class:`SeededInit` is the random initialisation: each parameter's values come from a
  generator seeded by (seed, name), so they are the same under every layout, whichever ranks
  hold which shards, and a pipeline stage never generates the parameters of other stages.
- A checkpoint-format source (for example Hugging Face safetensors through torch DCP's
  ``HuggingFaceStorageReader``) implements ``fill`` directly: DCP loads into DTensor targets
  reading only the slices each rank holds.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Protocol

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

INIT_STD = 0.02
"""GPT-2 / Llama reference initialisation standard deviation."""

WRAPPER_PREFIXES = ("module.", "_orig_mod.", "_checkpoint_wrapped_module.", "_fsdp_wrapped_module.")
"""Name parts added by DDP, torch.compile and checkpoint/FSDP1 wrappers (not model names)."""


def canonical_name(name: str) -> str:
    """The model's own name of a parameter, whatever wrappers surround its module."""
    for prefix in WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


class WeightSource(Protocol):
    """Where initial parameter values come from (see the module docstring)."""

    def fill(self, targets: dict[str, torch.Tensor]) -> None:
        """Write each named parameter's values into its target, in place; collective."""
        ...


def local_shard(full: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """This rank's part of ``full`` laid out as ``like``: ``full`` itself for a plain tensor,
    the local shard for a DTensor (sliced here, no communication: every rank has ``full``).

    Plain Shard/Replicate placements give a box of ``full``, returned as a view (no copy);
    others (FSDP2 over TP: strided shards) go through distribute_tensor."""
    if not isinstance(like, DTensor):
        return full
    if all(isinstance(p, Shard | Replicate) for p in like.placements):
        shape, offset = compute_local_shape_and_global_offset(
            full.shape, like.device_mesh, like.placements
        )
        box = tuple(slice(o, o + n) for o, n in zip(offset, shape, strict=True))
        return full[box]
    placed = distribute_tensor(full, like.device_mesh, like.placements, src_data_rank=None)
    return placed.to_local()


def copy_into(target: torch.Tensor, full: torch.Tensor) -> None:
    """Copy this rank's share of the whole parameter ``full`` into ``target``."""
    piece = local_shard(full.to(target.device, target.dtype), target)
    local = target.to_local() if isinstance(target, DTensor) else target
    local.copy_(piece)


class FullTensorSource(ABC):
    """A source that can make the full tensor of one parameter at a time."""

    @abstractmethod
    def full_tensor(self, name: str, shape: torch.Size) -> torch.Tensor:
        """The whole value of parameter ``name`` (global ``shape``), on the CPU in fp32."""

    def fill(self, targets: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for name, target in targets.items():
                copy_into(target, self.full_tensor(name, target.shape))


def _name_seed(seed: int, name: str) -> int:
    # A stable digest (Python's hash() of a str changes per process).
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


class SeededInit(FullTensorSource):
    """Norm weights 1, biases 0, every other weight N(0, INIT_STD) from a generator seeded by
    (seed, name); a head tied to the embedding starts from the embedding's values."""

    def __init__(self, seed: int, tie_embeddings: bool = False) -> None:
        self.seed = seed
        self.tie_embeddings = tie_embeddings

    def full_tensor(self, name: str, shape: torch.Size) -> torch.Tensor:
        if self.tie_embeddings and name == "output.weight":
            name = "tok_embeddings.weight"
        if "norm" in name:
            return torch.ones(shape)
        if name.endswith(".bias"):
            return torch.zeros(shape)
        generator = torch.Generator().manual_seed(_name_seed(self.seed, name))
        # In place: one full-size tensor at a time, not randn's and its scaled copy.
        return torch.empty(shape).normal_(0.0, INIT_STD, generator=generator)


def parameter_targets(parts: Iterable[nn.Module]) -> dict[str, torch.Tensor]:
    """{canonical name: parameter} of every parameter held in ``parts`` (shared ones once)."""
    targets: dict[str, torch.Tensor] = {}
    for part in parts:
        for name, param in part.named_parameters():
            targets.setdefault(canonical_name(name), param)
    return targets


def materialize(parts: list[nn.Module], device: torch.device, source: WeightSource) -> None:
    """Allocate the meta-device ``parts`` on ``device`` (local shards only) and fill them from
    ``source``; recompute the non-persistent buffers (the rotary tables)."""
    swap = torch.__future__.get_swap_module_params_on_conversion()
    # Swapping keeps each Parameter object (DTensors always swap), so parameters shared by two
    # modules (a tied head) stay shared; the default makes a new Parameter per module.
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        for part in parts:
            part.to_empty(device=device)
    finally:
        torch.__future__.set_swap_module_params_on_conversion(swap)
    for part in parts:
        for module in part.modules():
            reset = getattr(module, "reset_buffers", None)
            if callable(reset):
                reset()
    source.fill(parameter_targets(parts))
