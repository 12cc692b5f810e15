"""The planner at another data-parallel degree (meshrun.planner.elastic); spec.elastic's rules."""

from __future__ import annotations

from typing import Any

import pytest

from meshrun.api.errors import SpecError
from meshrun.api.read import read_spec
from meshrun.planner.elastic import elastic_degrees, largest_fitting, pods_at, resized
from meshrun.planner.plan import plan_job
from meshrun.rules.elastic import BOUNDS_BATCH, MAX_MIN, MIN_PLANNED

pytestmark = pytest.mark.unit


def _job(**over: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "image": "x",
        "resources": {"numNodes": 4, "numProcPerNode": 4, "accelerator": "nvidia.com/gpu"},
        "strategy": {
            "type": "hybrid",
            "dataParallel": 4,
            "pipelineParallel": 2,
            "tensorParallel": 2,
            "zeroStage": 1,
            "microBatches": 4,
        },
        "model": {"preset": "tiny"},
        "training": {"globalBatchSize": 32, "microBatchSize": 1},
        "elastic": {"minDataParallel": 1},
    }
    spec.update(over)
    return spec


def test_resized_keeps_tp_pp_the_batch_and_the_micro_batches() -> None:
    job = read_spec(_job())
    plan = plan_job(job, "j")
    small_job, small = resized(job, plan, 2)
    lay, was = small.layout, plan.layout
    assert (lay.dp, lay.pp, lay.tp, lay.zero_stage) == (2, 2, 2, 1)
    assert lay.micro_batches == was.micro_batches == 4
    assert lay.grad_accumulation == 2 * was.grad_accumulation
    assert small_job.resources.num_nodes == 2 and small.world_size == 8
    assert small_job.training.global_batch_size == 32 and small.strategy == plan.strategy
    assert small.stages == plan.stages  # the same layers on each pipeline rank
    assert resized(job, plan, 4) == (job, plan)


def test_allowed_degrees_fill_whole_pods_and_split_the_batch() -> None:
    # pp2 x tp2 = 4 processes per replica, 4 per pod: every degree fills whole pods; 3 does
    # not split 32 micro-batches of 1 into 4 rounds per replica.
    job = read_spec(_job(elastic={"minDataParallel": 1, "maxDataParallel": 8}))
    plan = plan_job(job, "j")
    assert elastic_degrees(job, plan) == [1, 2, 4, 8]
    assert pods_at(job, plan, 8) == 8
    assert largest_fitting(job, plan, 3) == 2 and largest_fitting(job, plan, 0) is None
    # 8 processes per pod: an odd degree leaves half a pod.
    wide = read_spec(
        _job(
            resources={"numNodes": 2, "numProcPerNode": 8, "accelerator": "nvidia.com/gpu"},
            strategy={"type": "ddp"},
            training={"globalBatchSize": 48, "microBatchSize": 1},
            elastic={"minDataParallel": 4},
        )
    )
    wide_plan = plan_job(wide, "w")
    assert elastic_degrees(wide, wide_plan) == [8, 16]
    assert pods_at(wide, wide_plan, 12) is None


def test_a_degree_that_does_not_fit_is_not_allowed() -> None:
    # 7b with ZeRO-3 over 16 GPUs of 24 GiB fits; over 8 or 4 it does not.
    gpus = {"numNodes": 4, "numProcPerNode": 4, "accelerator": "nvidia.com/gpu"}
    job = read_spec(
        _job(
            resources={**gpus, "acceleratorMemoryGiB": 24},
            strategy={"type": "zero", "zeroStage": 3},
            model={"preset": "7b"},
            training={
                "globalBatchSize": 16,
                "microBatchSize": 1,
                "activationCheckpointing": "selective",
            },
        )
    )
    plan = plan_job(job, "z")
    assert plan.memory.fits
    degrees = elastic_degrees(job, plan)
    assert degrees == [16]
    with pytest.raises(SpecError, match=r"degree 4 does not fit: .* GiB per accelerator of 24"):
        resized(job, plan, 4)


@pytest.mark.parametrize(
    ("elastic", "rule"),
    [
        ({"minDataParallel": 5}, MIN_PLANNED),
        ({"minDataParallel": 3}, BOUNDS_BATCH),
        ({"minDataParallel": 2, "maxDataParallel": 6}, BOUNDS_BATCH),
        ({"minDataParallel": 4, "maxDataParallel": 2}, MAX_MIN),
    ],
)
def test_the_rules_refuse_with_the_crd_message(elastic: dict[str, int], rule: Any) -> None:
    with pytest.raises(SpecError) as raised:
        plan_job(_job(elastic=elastic), "j")
    assert raised.value.field == rule.field
    # The CRD's message, less the field the error names already (Rule.error).
    assert rule.error().rule in raised.value.rule


def test_the_minimum_is_checked_against_the_degree_the_planner_derives() -> None:
    # type pipeline over 4 pods: one stage per pod, dp4 of 16 processes; the API server only
    # sees that 8 is within the world size.
    strategy = {"type": "pipeline", "microBatches": 4}
    spec = _job(strategy=strategy, elastic={"minDataParallel": 8})
    assert plan_job({**spec, "elastic": {"minDataParallel": 4}}, "p").layout.dp == 4
    with pytest.raises(SpecError) as raised:
        plan_job(spec, "p")
    assert raised.value.field == MIN_PLANNED.field and "8 > 4" in raised.value.rule


def test_a_huge_max_data_parallel_costs_only_the_batch_divisors() -> None:
    batch = {"globalBatchSize": 2**30, "microBatchSize": 1}
    job = read_spec(_job(training=batch, elastic={"minDataParallel": 1, "maxDataParallel": 2**29}))
    plan = plan_job(job, "j")
    # Every power of two up to 2**29 splits the batch; room for 7 pods holds dp4.
    assert largest_fitting(job, plan, 7) == 4
    assert largest_fitting(job, plan, 1) == 1


def _auto_elastic(batch: int, elastic: dict[str, int] | None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "image": "x",
        "resources": {
            "numNodes": 3,
            "numProcPerNode": 4,
            "acceleratorProduct": "NVIDIA-H100-80GB-HBM3",
        },
        "strategy": {"type": "auto"},
        "model": {"preset": "1b"},
        "training": {"globalBatchSize": batch},  # microBatchSize left to auto
    }
    if elastic:
        spec["elastic"] = elastic
    return spec


def test_auto_picks_a_micro_batch_size_every_elastic_degree_can_split() -> None:
    # Alone, auto takes 8 sequences per micro-batch (96 = dp12 x 8); at dp 8 that would leave
    # 96 / 8 = 12 micro-batches for 8 replicas, so with minDataParallel 8 it takes 4.
    assert plan_job(_auto_elastic(96, None), "j").layout.micro_batch_size == 8
    job = read_spec(_auto_elastic(96, {"minDataParallel": 8}))
    assert job.training.micro_batch_size is None
    plan = plan_job(job, "j")
    assert plan.layout.micro_batch_size == 4
    degrees = elastic_degrees(job, plan)
    assert degrees == [8, 12]
    for dp in degrees:
        _, small = resized(job, plan, dp)
        # the resized plan runs the same micro-batch size, the global batch kept
        lay = small.layout
        assert lay.micro_batch_size == plan.layout.micro_batch_size
        assert lay.dp * lay.micro_batch_size * lay.micro_batches * lay.grad_accumulation == 96
