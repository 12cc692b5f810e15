"""An elastic job planned at another data-parallel degree: the same tensor, context and pipeline
layout, the same global batch, micro-batch size and pipeline micro-batches, more (or less)
gradient accumulation per replica.

The data stream is a function of the step (every replica slices its rows out of the same global
batch) and DCP reshards model and optimizer state to any layout, so a job resumed from its
checkpoint under :func:`resized` trains on the same samples in the same order, with the same
step counter and learning-rate schedule; only the time per step changes.
"""

from __future__ import annotations

from dataclasses import replace
from math import gcd, isqrt
from typing import cast

from meshrun.api.errors import SpecError
from meshrun.api.spec import GIB, Checkpointing, JobSpec
from meshrun.planner.plan import Plan, plan_job


def pods_at(spec: JobSpec, plan: Plan, dp: int) -> int | None:
    """Pods of ``num_proc_per_node`` processes the job needs at degree ``dp``; None when
    dp x cp x pp x tp does not fill whole pods."""
    world = replace(plan.layout.degrees, dp=dp).world_size
    per_pod = spec.resources.num_proc_per_node
    return None if world % per_pod else world // per_pod


def resized(spec: JobSpec, plan: Plan, dp: int) -> tuple[JobSpec, Plan]:
    """The job and its plan at data-parallel degree ``dp`` (``plan`` is the job's own plan).

    SpecError when that degree breaks a rule (whole pods, the batch split, the pipeline
    schedule) or, on accelerators of known memory, does not fit.
    """
    pods = pods_at(spec, plan, dp)
    if pods is None:
        raise SpecError(
            "spec.elastic",
            f"data-parallel degree {dp} x {plan.layout.degrees.text(without='dp')} does not fill "
            f"whole pods of {spec.resources.num_proc_per_node} processes",
        )
    if dp == plan.layout.dp and pods == spec.resources.num_nodes:
        return spec, plan
    lay = plan.layout
    strategy = replace(
        spec.strategy,
        type="hybrid",
        data_parallel=dp,
        context_parallel=lay.cp,
        pipeline_parallel=lay.pp,
        tensor_parallel=lay.tp,
        zero_stage=lay.zero_stage,
        micro_batches=lay.micro_batches if lay.pp > 1 else None,
        virtual_stages=lay.virtual_stages if lay.virtual_stages > 1 else None,
        # Expert parallelism follows the ranks a stage has now: the largest degree that
        # divides both the planned one and dp x cp x tp; the experts reshard through the
        # checkpoint.
        expert_parallel=gcd(lay.ep, dp * lay.cp * lay.tp) if spec.shape.moe is not None else None,
        expert_tensor_parallel=lay.etp if spec.shape.moe is not None else None,
    )
    checkpointing = cast(Checkpointing, plan.activation_checkpointing)
    # The plan's micro-batch size stays (auto's choice where the spec left it unset).
    training = replace(
        spec.training,
        activation_checkpointing=checkpointing,
        micro_batch_size=lay.micro_batch_size,
    )
    sized = replace(
        spec,
        resources=replace(spec.resources, num_nodes=pods),
        strategy=strategy,
        training=training,
    )
    new = plan_job(sized, plan.name)
    if not new.memory.fits:
        raise SpecError(
            "spec.elastic",
            f"data-parallel degree {dp} does not fit: {new.memory.total / GIB:.1f} GiB per "
            f"accelerator of {new.memory.accelerator_bytes / GIB:.0f} GiB",
        )
    return sized, replace(new, strategy=plan.strategy)


def _candidates(spec: JobSpec, plan: Plan) -> list[int]:
    """The degrees between the bounds that divide globalBatchSize / microBatchSize, ascending
    (through the divisors of that quotient: a huge maxDataParallel costs nothing)."""
    assert spec.elastic is not None
    passes = spec.training.global_batch_size // plan.layout.micro_batch_size
    low = spec.elastic.min_data_parallel
    high = spec.elastic.max_data_parallel or plan.layout.dp
    small = [d for d in range(1, isqrt(passes) + 1) if passes % d == 0]
    return sorted(d for d in {*small, *(passes // d for d in small)} if low <= d <= high)


def _plans(spec: JobSpec, plan: Plan, dp: int) -> bool:
    try:
        resized(spec, plan, dp)
    except SpecError:
        return False
    return True


def elastic_degrees(spec: JobSpec, plan: Plan) -> list[int]:
    """The degrees the job may run at, ascending: from minDataParallel to maxDataParallel (the
    planned degree when unset), those :func:`resized` plans (empty without spec.elastic)."""
    if spec.elastic is None:
        return []
    return [dp for dp in _candidates(spec, plan) if _plans(spec, plan, dp)]


def largest_fitting(spec: JobSpec, plan: Plan, pods: int, below: int | None = None) -> int | None:
    """The largest allowed degree (at most ``below`` when given) whose pods number at most
    ``pods``; None when none does. Tries the largest first and stops at the first that plans."""
    if spec.elastic is None:
        return None
    for dp in reversed(_candidates(spec, plan)):
        needed = pods_at(spec, plan, dp)
        fits = (below is None or dp <= below) and needed is not None and needed <= pods
        if fits and _plans(spec, plan, dp):
            return dp
    return None
