"""Explicit strategies: degrees, ranks, stages and micro-batches."""

from __future__ import annotations

from typing import Any

import pytest
from planner_factories import make_cpu_spec as make_spec

from meshrun.api.layout import rank_at, split_layers
from meshrun.planner.plan import plan_job

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("strategy", "degrees"),
    [
        ({"type": "ddp"}, (8, 1, 1, 0)),
        ({"type": "zero", "zeroStage": 2}, (8, 1, 1, 2)),
        ({"type": "tensor"}, (2, 1, 4, 0)),
        ({"type": "tensor", "tensorParallel": 2}, (4, 1, 2, 0)),
        ({"type": "tensor", "dataParallel": 4}, (4, 1, 2, 0)),
        ({"type": "pipeline"}, (4, 2, 1, 0)),
        ({"type": "pipeline", "pipelineParallel": 4}, (2, 4, 1, 0)),
        ({"type": "hybrid", "dataParallel": 2, "pipelineParallel": 2}, (2, 2, 2, 0)),
        (
            {"type": "hybrid", "dataParallel": 2, "pipelineParallel": 2, "tensorParallel": 2},
            (2, 2, 2, 0),
        ),
        ({"type": "hybrid", "pipelineParallel": 2, "zeroStage": 3}, (4, 2, 1, 3)),
    ],
)
def test_explicit_degrees(strategy: dict[str, Any], degrees: tuple[int, int, int, int]) -> None:
    plan = plan_job(make_spec(strategy=strategy))
    lay = plan.layout
    assert (lay.dp, lay.pp, lay.tp, lay.zero_stage) == degrees
    assert lay.world_size == plan.world_size == 8


def test_rank_order_tp_innermost_pp_outermost() -> None:
    strategy = {"type": "hybrid", "dataParallel": 2, "pipelineParallel": 2, "tensorParallel": 2}
    plan = plan_job(make_spec(strategy=strategy), "demo")
    ranks = plan.to_dict()["ranks"]
    for entry in ranks:
        assert entry["rank"] == rank_at(entry, plan.layout.degrees)
    assert [(r["pp"], r["dp"], r["tp"]) for r in ranks[:4]] == [
        (0, 0, 0),
        (0, 0, 1),
        (0, 1, 0),
        (0, 1, 1),
    ]
    pods = plan.to_dict()["pods"]
    assert pods == [
        {"index": 0, "name": "demo-0", "ranks": [0, 1, 2, 3]},
        {"index": 1, "name": "demo-1", "ranks": [4, 5, 6, 7]},
    ]
    assert {r["pp"] for r in ranks if r["pod"] == 1} == {1}, "a pod holds one stage"
    assert "each pod holds one pipeline stage" in plan.explanation


@pytest.mark.parametrize(
    ("layers", "pp", "virtual", "expected"),
    [
        (4, 2, 1, [(0, 0, 0, 1), (1, 0, 2, 3)]),
        (5, 2, 1, [(0, 0, 0, 2), (1, 0, 3, 4)]),
        (8, 2, 2, [(0, 0, 0, 1), (1, 0, 2, 3), (0, 1, 4, 5), (1, 1, 6, 7)]),
    ],
)
def test_split_layers(
    layers: int, pp: int, virtual: int, expected: list[tuple[int, int, int, int]]
) -> None:
    stages = split_layers(layers, pp, virtual)
    assert [(s.pp, s.virtual, s.first, s.last) for s in stages] == expected


def test_micro_batches_and_grad_accumulation() -> None:
    plan = plan_job(make_spec(strategy={"type": "pipeline"}, training={"globalBatchSize": 16}))
    # dp 4, micro-batch 1: 4 sequences per replica per step, all as pipeline micro-batches.
    assert (plan.layout.micro_batches, plan.layout.grad_accumulation) == (4, 1)
    split = plan_job(
        make_spec(
            strategy={"type": "pipeline", "microBatches": 2}, training={"globalBatchSize": 16}
        )
    )
    assert (split.layout.micro_batches, split.layout.grad_accumulation) == (2, 2)
    ddp = plan_job(make_spec(training={"globalBatchSize": 32, "microBatchSize": 2}))
    assert (ddp.layout.micro_batches, ddp.layout.grad_accumulation) == (1, 2)


def test_naive_model_parallelism_is_pipeline_with_one_micro_batch() -> None:
    spec = make_spec(
        resources={"numNodes": 1},
        strategy={"type": "pipeline", "pipelineParallel": 4, "pipelineSchedule": "gpipe"},
        training={"globalBatchSize": 1},
    )
    plan = plan_job(spec)
    assert plan.layout.micro_batches == 1
    assert plan.layout.bubble_fraction() == pytest.approx(3 / 4)
    assert "plain (naive) model parallelism" in plan.explanation
    assert "75%" in plan.explanation
    assert any("microBatches 1 is below pipelineParallel 4" in w for w in plan.warnings)


def test_bubble_fraction_follows_narayanan() -> None:
    spec = make_spec(
        resources={"numNodes": 1},
        strategy={
            "type": "pipeline",
            "pipelineParallel": 4,
            "pipelineSchedule": "interleaved-1f1b",
            "virtualStages": 2,
            "microBatches": 8,
        },
        model={"layers": 8},
        training={"globalBatchSize": 8},
    )
    lay = plan_job(spec).layout
    assert lay.bubble_fraction() == pytest.approx(3 / (2 * 8 + 3))
    plain = plan_job(
        make_spec(
            resources={"numNodes": 1},
            strategy={"type": "pipeline", "pipelineParallel": 4},
            training={"globalBatchSize": 8},
        )
    )
    assert plain.layout.bubble_fraction() == pytest.approx(3 / (8 + 3))


def test_ddp_explanation_says_dataparallel_is_superseded() -> None:
    plan = plan_job(make_spec())
    assert "supersedes" in plan.explanation and "DataParallel" in plan.explanation


def test_status_summary_matches_to_dict() -> None:
    plan = plan_job(make_spec(strategy={"type": "tensor"}))
    summary, full = plan.status_summary(), plan.to_dict()
    assert summary["layout"] == full["layoutString"] == "dp2 x pp1 x tp4"
    assert summary["memory"] == full["memory"]
    assert summary["worldSize"] == 8 and summary["gpus"] == 0


def test_sixteen_thousand_gpus_plan_with_every_rank_placed() -> None:
    spec = make_spec(
        resources={"numNodes": 2048, "numProcPerNode": 8, "accelerator": "nvidia.com/gpu"},
        strategy={
            "type": "hybrid",
            "dataParallel": 256,
            "pipelineParallel": 8,
            "tensorParallel": 8,
        },
        model={"preset": "70b"},
        training={"globalBatchSize": 4096},
    )
    data = plan_job(spec, "big").to_dict()  # its speed: bench/planner.py
    assert len(data["ranks"]) == 16384 and len(data["pods"]) == 2048
    assert data["ranks"][-1] == {
        "rank": 16383,
        "pod": 2047,
        "localRank": 7,
        "pp": 7,
        "dp": 255,
        "cp": 0,
        "tp": 7,
    }


def test_default_degrees_respect_the_model() -> None:
    one_pod = {"numNodes": 1, "numProcPerNode": 8}
    # tiny has 4 heads: TP 8 would not divide them, so the widest valid TP is 4.
    tensor = plan_job(make_spec(resources=one_pod, strategy={"type": "tensor"})).layout
    assert (tensor.dp, tensor.tp) == (2, 4)
    # tiny has 4 layers: at most 4 stages, not one per process.
    pipeline = plan_job(make_spec(resources=one_pod, strategy={"type": "pipeline"})).layout
    assert (pipeline.dp, pipeline.pp) == (2, 4)
