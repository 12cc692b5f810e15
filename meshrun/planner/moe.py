"""What a mixture of experts changes in the memory and step-time models.

- **Parameters**: a MoE layer's routed experts are spread over the ``ep`` ranks of the EP
  group (experts / ep each); the trainer keeps them out of ZeRO (DDP and FSDP2 leave them
  alone, their gradients are reduced over the ranks holding the same experts), so their
  weights, gradients and AdamW state are whole on each rank. Everything else of the layer
  (attention, router, shared experts) is the dense part, sharded as the layout says.
- **Activations and compute**: a token visits ``experts_per_token`` experts of
  ``expert_ffn_hidden`` and the shared experts, so a MoE layer's MLP computes and keeps what a
  dense SwiGLU of width ``k x expert_ffn_hidden x ROUTER_IMBALANCE + shared width`` would: the
  busiest rank receives up to ``ROUTER_IMBALANCE`` times the mean of the routed tokens (the
  router balances only on average). The routed tokens' dispatch buffers (the sorted copy, the
  received copy and the returned one, each tokens x k x hidden) add to the activations.
- **All-to-alls**: each MoE layer sends its routed tokens to their experts and back, forward
  (2) and again in backward (2), over the links the EP group spans (consecutive ranks of one
  pipeline stage: inside a pod while ep x stride fits one). The trainer waits for each (no
  overlap with compute), so they add to the step.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from meshrun.api.layout import Layout, Stage
from meshrun.api.presets import ModelShape
from meshrun.api.spec import JobSpec

if TYPE_CHECKING:
    from meshrun.planner.steptime import StepEstimate

ROUTER_IMBALANCE = 1.25
"""Routed tokens the busiest expert rank receives, as a multiple of the mean (a planning
allowance: the auxiliary loss or bias balancing keep the load near, not at, the mean)."""
DISPATCH_COPIES = 3
"""Copies of the routed tokens a MoE layer keeps per micro-batch: sorted, received, returned."""
ALL_TO_ALLS = 4
"""All-to-alls per MoE layer and micro-batch: dispatch and combine, forward and backward."""


def compute_shape(shape: ModelShape) -> ModelShape:
    """The dense shape whose MLP computes and keeps what a MoE layer's does on its busiest rank
    (the shape itself for a dense model)."""
    moe = shape.moe
    if moe is None:
        return shape
    routed = moe.experts_per_token * moe.expert_ffn_hidden * ROUTER_IMBALANCE
    # the experts are SwiGLU whatever the dense layers' MLP
    width = int(routed) + moe.shared_width
    return dataclasses.replace(shape, ffn_hidden=width, moe=None, mlp="swiglu")


def compute_spec(spec: JobSpec) -> JobSpec:
    """``spec`` with :func:`compute_shape` as its shape (for the activation and compute
    models, which read a dense MLP)."""
    if spec.shape.moe is None:
        return spec
    return dataclasses.replace(spec, shape=compute_shape(spec.shape))


def moe_layers_per_rank(shape: ModelShape, stages: list[Stage], pp: int) -> list[int]:
    """MoE layers each pipeline rank holds."""
    counts = [0] * pp
    if shape.moe is None:
        return counts
    for stage in stages:
        counts[stage.pp] += sum(
            shape.moe.is_moe_layer(layer) for layer in range(stage.first, stage.last + 1)
        )
    return counts


def routed_parameters(shape: ModelShape) -> int:
    """One MoE layer's routed experts' parameters (0 for a dense model)."""
    return shape.moe.routed_parameters(shape.hidden) if shape.moe is not None else 0


def expert_parameters(shape: ModelShape, moe_layers: int, ep: int) -> int:
    """The routed experts' parameters one rank of the EP group holds for ``moe_layers``."""
    return -(-moe_layers * routed_parameters(shape) // ep)


def dispatch_bytes(shape: ModelShape, tokens: int, element: int) -> int:
    """One MoE layer's routed-token buffers for ``tokens`` tokens (0 for a dense model)."""
    if shape.moe is None:
        return 0
    routed = tokens * shape.moe.experts_per_token * ROUTER_IMBALANCE
    return int(DISPATCH_COPIES * routed * shape.hidden * element)


def all_to_all_bytes(shape: ModelShape, layout: Layout, tokens: int, element: int) -> float:
    """Bytes one all-to-all of a MoE layer moves for ``tokens`` tokens (the busiest rank's)."""
    if shape.moe is None or layout.ep == 1:
        return 0.0
    return tokens * shape.moe.experts_per_token * shape.hidden * element * ROUTER_IMBALANCE


def ep_stride(layout: Layout) -> int:
    """Ranks between two members of an EP group: 1 when it takes the tensor-parallel ranks
    too (expertTensorParallel 1), else the TP degree."""
    return 1 if layout.etp == 1 else layout.tp


def active_flops_parameters(shape: ModelShape) -> int:
    """Parameters whose matmuls a token runs (6 FLOPs each in training): the active ones with
    the output head, without the embedding lookup."""
    return shape.parameters(active=True) - shape.embedding_parameters() + shape.vocab * shape.hidden


def expert_degrees(spec: JobSpec, stage_ranks: int) -> list[int | None]:
    """The expert-parallel degrees a search tries for ``stage_ranks`` ranks per pipeline stage:
    the spec's (None: it decides), else every divisor of the experts that divides the ranks."""
    moe = spec.shape.moe
    if moe is None or spec.strategy.expert_parallel is not None:
        return [None]
    return [
        ep for ep in range(1, stage_ranks + 1) if stage_ranks % ep == 0 and moe.experts % ep == 0
    ]


def describe_experts(spec: JobSpec, layout: Layout, estimate: StepEstimate | None) -> list[str]:
    """Why and how the experts are laid out, in sentences (nothing for a dense model)."""
    moe = spec.shape.moe
    if moe is None:
        return []
    per_rank = moe.experts // layout.ep
    chosen = "as given" if spec.strategy.expert_parallel is not None else "the fastest that fits"
    lines = [
        f"Mixture of experts: {moe.experts_per_token} of {moe.experts} experts per token"
        + (f" and {moe.shared_experts} shared" if moe.shared_experts else "")
        + f"; expert parallel {layout.ep} ({chosen}): each rank holds {per_rank} of each MoE "
        "layer's experts, whole (not sharded by ZeRO), and tokens reach them by all-to-all."
    ]
    if estimate is not None and layout.ep > 1:
        share = estimate.breakdown.get("expertParallel", 0.0) / estimate.step_seconds
        lines.append(f"The all-to-alls take {share:.0%} of the predicted step.")
    return lines


def held_experts(
    shape: ModelShape, layout: Layout, dp: int, cp: int, tp: int
) -> tuple[int, int] | None:
    """The first and last routed expert (of each MoE layer) the rank at data-, context- and
    tensor-parallel indices ``dp``, ``cp``, ``tp`` holds: EP groups are ``ep`` consecutive ranks
    of a stage's dp x cp x tp (expertTensorParallel 1), or of its dp x cp ranks (each expert
    split over tp). None for a dense model."""
    if shape.moe is None:
        return None
    shard = dp * layout.cp + cp
    position = shard * layout.tp + tp if layout.etp == 1 else shard
    per_rank = shape.moe.experts // layout.ep
    first = position % layout.ep * per_rank
    return first, first + per_rank - 1
