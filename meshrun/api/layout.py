"""A parallel layout and the split of a model's layers into pipeline chunks.

Shared by the planner (which chooses the layout), the env contract (which hands it to the pods)
and the trainer (which reads it back and runs it), so the three agree by construction.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Layout:
    """A complete parallel layout: degrees, sharding, pipeline schedule and the batch split
    (globalBatchSize = dp x micro_batch_size x micro_batches x grad_accumulation)."""

    dp: int
    """Data-parallel degree (replicas, or ZeRO shards)."""
    pp: int
    """Pipeline stages."""
    tp: int
    """Tensor-parallel degree (innermost, inside one pod)."""
    zero_stage: int
    """ZeRO stage over the data-parallel group: 0 none, 1 optimizer, 2 +grads, 3 +params."""
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
    cp: int = 1
    """Context-parallel degree: each sequence split over cp ranks (between dp and tp)."""

    @property
    def world_size(self) -> int:
        return self.dp * self.cp * self.pp * self.tp

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
        return f"dp{self.dp} x pp{self.pp} x tp{self.tp}"


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
