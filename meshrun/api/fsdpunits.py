"""FSDP2's units under ZeRO-3: what the trainer gathers at once, and so what the planner counts.

A unit is one transformer block (torchtitan's unit), the input embedding, or the final norm
with the output head. A block too large to gather whole is split: each of its matrices becomes
a unit of its own, and the block keeps only its norms (and biases). DeepSpeed's ZeRO-3 gathers
module by module for the same reason, with at most ``stage3_max_live_parameters`` (1e9 by
default) gathered at a time. A GPT 530B block (hidden 20,480, a GeLU MLP of 4 x hidden) holds
5.0G parameters: gathered whole, with the next block prefetched, its gradient and the previous
block's fp32 reduce-scatter input, that is 47 GiB of an 80 GB A100 beside 33 GiB of checkpointed
block inputs, where DeepSpeed trained it on 640 GPUs at micro-batch 4. Its largest matrix is a
third of the block.

Shared by the planner (memory and step time) and the trainer (which applies it), so the two
agree by construction.
"""

from __future__ import annotations

from meshrun.api.layout import Layout
from meshrun.api.presets import MLP_MATRICES, ModelShape

MATRIX_UNIT_PARAMETERS = 1_000_000_000
"""A block with more local parameters (per tensor-parallel rank) than this is gathered matrix
by matrix: DeepSpeed's default ``stage3_max_live_parameters``."""

ATTENTION_MATRICES = 4
"""wq, wk, wv and wo."""


def block_local_parameters(shape: ModelShape, tp: int) -> int:
    """A block's parameters on one tensor-parallel rank, a MoE layer's routed experts aside
    (FSDP2 leaves them to expert parallelism)."""
    routed = shape.moe.routed_parameters(shape.hidden) if shape.moe is not None else 0
    return -(-(shape.layer_parameters() - routed) // tp)


def gathers_by_matrix(shape: ModelShape, layout: Layout) -> bool:
    """Whether ZeRO-3 gathers each of a block's matrices on its own rather than the block.

    Only where parameters are resharded after forward (ZeRO-3 without pipelining: a pipeline
    stage keeps its blocks gathered through the step, so smaller units would save nothing), and
    only in dense models (a MoE block's routed experts are outside FSDP2 already)."""
    return (
        layout.zero_stage >= 3
        and layout.pp == 1
        and shape.moe is None
        and block_local_parameters(shape, layout.tp) > MATRIX_UNIT_PARAMETERS
    )


def largest_matrix(shape: ModelShape) -> int:
    """The parameters of a block's largest matrix (with its bias), before tensor parallelism."""
    q = shape.heads * shape.head_dim
    return shape.hidden * max(q, shape.ffn_hidden) + max(q, shape.ffn_hidden, shape.hidden)


def block_units(shape: ModelShape, layout: Layout) -> int:
    """FSDP2 units (one gather and one reduce-scatter each) a block makes: 1, or its matrices
    and the block's own unit for the norms."""
    if not gathers_by_matrix(shape, layout):
        return 1
    return ATTENTION_MATRICES + MLP_MATRICES[shape.mlp] + 1


def block_unit_parameters(shape: ModelShape, layout: Layout) -> int:
    """The local parameters of a block's largest unit: the block, or its largest matrix."""
    if gathers_by_matrix(shape, layout):
        return -(-largest_matrix(shape) // layout.tp)
    return block_local_parameters(shape, layout.tp)
