"""A parallel layout: the named degrees and their rank order, the schedule, and the split of a
model's layers into pipeline chunks.

Shared by the planner (which chooses the layout), the env contract (which hands it to the pods)
and the trainer (which reads it back and runs it), so the three agree by construction.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields

RANK_ORDER = ("pp", "dp", "cp", "tp")
"""The mesh's dimensions, outermost first: ``rank = ((pp_i * dp + dp_i) * cp + cp_i) * tp +
tp_i`` (torchtitan's mesh order pp, dp, cp, tp; Megatron-LM's tp-cp-dp-pp read inside out).
Consecutive ranks share a pod, so the innermost dimensions get the fastest links: TP innermost
(several all-gathers and reduce-scatters of activations per layer: NVLink), CP next (an
all-gather of keys and values per attention layer forward and a reduce-scatter of their
gradients backward: the next heaviest per layer), then DP (one gradient reduction per step,
hidden behind backward), and PP outermost (point-to-point activations between neighbouring
stages: the least traffic). A new dimension is a field of :class:`Degrees` and a name here."""
SHOWN_AT_ONE = ("dp", "pp", "tp")
"""Dimensions the layout string shows even at degree 1; the others appear only above 1."""


@dataclass(frozen=True, kw_only=True)
class Degrees:
    """A job's parallel degrees, by name (torchtitan's ParallelDims): the one object the planner,
    the job document, the env contract and the trainer pass around. The rank order is
    :data:`RANK_ORDER`."""

    dp: int = 1
    """Data-parallel degree (replicas, or ZeRO shards together with cp)."""
    cp: int = 1
    """Context-parallel degree: each sequence split over cp ranks, 2 x cp load-balanced chunks."""
    pp: int = 1
    """Pipeline stages."""
    tp: int = 1
    """Tensor-parallel degree (innermost, inside one pod or over whole pods)."""

    @property
    def world_size(self) -> int:
        return math.prod(self.sizes())

    def size(self, dim: str) -> int:
        """The degree of dimension ``dim`` (a name of :data:`RANK_ORDER`)."""
        value: int = getattr(self, dim)
        return value

    def sizes(self) -> tuple[int, ...]:
        """The degrees in rank order, outermost first."""
        return tuple(self.size(dim) for dim in RANK_ORDER)

    def stride(self, dim: str) -> int:
        """Global ranks between neighbours along ``dim``: the product of the degrees inside it."""
        return math.prod(self.sizes()[RANK_ORDER.index(dim) + 1 :])

    def text(self, without: str | None = None) -> str:
        """``dp8 x cp16 x pp16 x tp8``: each degree in field order, cp and later dimensions only
        above 1 (``without`` one of them: ``cp16 x pp16 x tp8``)."""
        return " x ".join(
            f"{f.name}{self.size(f.name)}"
            for f in fields(self)
            if f.name != without and (f.name in SHOWN_AT_ONE or self.size(f.name) > 1)
        )


def coordinates_of(rank: int, degrees: Degrees) -> dict[str, int]:
    """The index of global ``rank`` along each dimension (inverse of :func:`rank_at`)."""
    found: dict[str, int] = {}
    for dim in reversed(RANK_ORDER):
        rank, found[dim] = divmod(rank, degrees.size(dim))
    return {dim: found[dim] for dim in RANK_ORDER}


def rank_at(coordinates: Mapping[str, int], degrees: Degrees) -> int:
    """The global rank with these indices (a dimension left out is index 0)."""
    rank = 0
    for dim in RANK_ORDER:
        rank = rank * degrees.size(dim) + coordinates.get(dim, 0)
    return rank


def groups_along(dims: str | tuple[str, ...], degrees: Degrees) -> list[list[int]]:
    """The ranks of each group spanning ``dims`` (one name or several: equal indices along
    every other dimension), ascending, groups in order of their first rank: TP groups are
    consecutive ranks, CP groups ``tp`` apart, DP groups ``cp x tp`` apart, pipelines ``dp x cp
    x tp`` apart; ("dp", "cp") are the ranks holding the same parameters."""
    spanned = (dims,) if isinstance(dims, str) else dims
    groups: dict[tuple[int, ...], list[int]] = {}
    for rank in range(degrees.world_size):
        index = coordinates_of(rank, degrees)
        key = tuple(index[dim] for dim in RANK_ORDER if dim not in spanned)
        groups.setdefault(key, []).append(rank)
    return sorted(groups.values())


@dataclass(frozen=True)
class Layout:
    """A complete parallel layout: degrees, sharding, pipeline schedule and the batch split
    (globalBatchSize = dp x micro_batch_size x micro_batches x grad_accumulation; context
    parallelism splits each sequence, not the batch)."""

    degrees: Degrees
    """The parallel degrees, by name."""
    zero_stage: int
    """ZeRO stage over the data-parallel group (dp x cp ranks): 0 none, 1 optimizer, 2 +grads,
    3 +params."""
    schedule: str
    """Pipeline schedule (gpipe, 1f1b, interleaved-1f1b); meaningful when pp > 1."""
    micro_batches: int
    """Micro-batches per pipeline step (1 when pp == 1)."""
    virtual_stages: int
    """Model chunks per pipeline rank (above 1 only for interleaved-1f1b)."""
    grad_accumulation: int
    """Forward/backward passes (or pipeline steps) summed per optimizer step."""
    micro_batch_size: int
    """Sequences per forward pass on one rank: the spec's, or the one auto chose."""
    ep: int = 1
    """Expert-parallel degree: ranks of one pipeline stage over which a MoE layer's experts are
    spread (folded from dp x cp, and tp when etp is 1; not counted in the world size)."""
    etp: int = 1
    """Expert tensor-parallel degree: tp (each expert split like the dense MLP) or 1."""

    @property
    def dp(self) -> int:
        return self.degrees.dp

    @property
    def cp(self) -> int:
        return self.degrees.cp

    @property
    def pp(self) -> int:
        return self.degrees.pp

    @property
    def tp(self) -> int:
        return self.degrees.tp

    @property
    def world_size(self) -> int:
        return self.degrees.world_size

    @property
    def data_shards(self) -> int:
        """Ranks holding the same parameters (dp x cp): gradients are reduced over them and ZeRO
        shards over them, as torchtitan's FSDP over dp_shard x cp and Megatron's distributed
        optimizer over its data-parallel-with-context group do."""
        return self.degrees.dp * self.degrees.cp

    @property
    def num_stages(self) -> int:
        """Model chunks over all pipeline ranks: pp x virtual_stages."""
        return self.pp * self.virtual_stages

    def bubble_fraction(self) -> float:
        """Idle share of a pipeline step (Narayanan et al. 2021, arXiv 2104.04473)."""
        if self.pp == 1:
            return 0.0
        chunks = self.virtual_stages * self.micro_batches
        return (self.pp - 1) / (chunks + self.pp - 1)

    def text(self) -> str:
        experts = f" (ep{self.ep})" if self.ep > 1 else ""
        return f"{self.degrees.text()}{experts}"


@dataclass(frozen=True)
class Stage:
    """A contiguous run of layers on one pipeline rank (one model chunk)."""

    pp: int
    """Pipeline rank holding the chunk."""
    virtual: int
    """Chunk index on that rank (0 unless interleaved)."""
    first: int
    """First layer (0-based, inclusive)."""
    last: int
    """Last layer (inclusive)."""


def layer_ranges(layers: int, chunks: int) -> tuple[tuple[int, int], ...]:
    """``layers`` split into ``chunks`` contiguous inclusive ranges; earlier ones take the rest."""
    base, extra = divmod(layers, chunks)
    ranges, first = [], 0
    for chunk in range(chunks):
        count = base + (1 if chunk < extra else 0)
        ranges.append((first, first + count - 1))
        first += count
    return tuple(ranges)


def split_layers(layers: int, pp: int, virtual: int) -> list[Stage]:
    """Layers split evenly over pp x virtual chunks in model order (:func:`layer_ranges`).

    Chunk c sits on pipeline rank c % pp (Megatron's interleaved assignment, so rank 0 holds
    chunks 0, pp, 2pp, ...).
    """
    return [
        Stage(chunk % pp, chunk // pp, first, last)
        for chunk, (first, last) in enumerate(layer_ranges(layers, pp * virtual))
    ]


def layers_per_rank(stages: list[Stage], pp: int) -> list[int]:
    """The transformer blocks each of the ``pp`` pipeline ranks holds, over all its chunks."""
    layers = [0] * pp
    for stage in stages:
        layers[stage.pp] += stage.last - stage.first + 1
    return layers


def divisors(n: int, at_most: int | None = None) -> list[int]:
    """The positive divisors of ``n`` (up to ``at_most``), ascending."""
    limit = n if at_most is None else min(n, at_most)
    return [d for d in range(1, limit + 1) if n % d == 0]
