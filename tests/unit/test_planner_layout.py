"""Explicit strategies: degrees, ranks, stages, micro-batches, and errors naming the field."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from meshrun.errors import SpecError
from meshrun.planner import plan_job, rank_of
from meshrun.planner.layout import split_layers

pytestmark = pytest.mark.unit


def make_spec(**sections: dict[str, Any]) -> dict[str, Any]:
    """A tiny 2 x 4 CPU job; keyword arguments replace keys inside each section."""
    spec: dict[str, Any] = {
        "image": "trainer:1",
        "resources": {"numNodes": 2, "numProcPerNode": 4, "accelerator": "cpu"},
        "strategy": {"type": "ddp"},
        "model": {"preset": "tiny"},
        "training": {"globalBatchSize": 8, "microBatchSize": 1},
    }
    for name, values in sections.items():
        spec[name] = {**spec.get(name, {}), **copy.deepcopy(values)}
    return spec


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


@pytest.mark.parametrize(
    ("sections", "field", "words"),
    [
        (
            {"strategy": {"type": "tensor", "tensorParallel": 3}},
            "spec.strategy.tensorParallel",
            "3 must divide",
        ),
        (
            {"strategy": {"type": "tensor", "tensorParallel": 8}},
            "spec.strategy.tensorParallel",
            "numProcPerNode=4",
        ),
        (
            {"strategy": {"type": "pipeline", "pipelineParallel": 8}},
            "spec.strategy.pipelineParallel",
            "spec.model.layers=4",
        ),
        (
            {
                "strategy": {
                    "type": "hybrid",
                    "dataParallel": 2,
                    "pipelineParallel": 2,
                    "tensorParallel": 4,
                }
            },
            "spec.strategy",
            "must equal",
        ),
        (
            {"strategy": {"type": "ddp", "dataParallel": 4}},
            "spec.strategy.dataParallel",
            "world size 8",
        ),
        ({"strategy": {"type": "ddp", "tensorParallel": 2}}, "spec.strategy.type", "must be 1"),
        ({"strategy": {"type": "ddp", "zeroStage": 2}}, "spec.strategy.zeroStage", "use type zero"),
        ({"strategy": {"type": "zero"}}, "spec.strategy.zeroStage", "1, 2 or 3"),
        ({"strategy": {"type": "auto", "tensorParallel": 2}}, "spec.strategy.type", "auto chooses"),
        (
            {"strategy": {"type": "pipeline", "tensorParallel": 2}},
            "spec.strategy.tensorParallel",
            "use hybrid",
        ),
        (
            {"strategy": {"type": "tensor", "pipelineParallel": 2}},
            "spec.strategy.pipelineParallel",
            "use hybrid",
        ),
        (
            {"strategy": {"type": "pipeline", "virtualStages": 2}},
            "spec.strategy.virtualStages",
            "interleaved",
        ),
        (
            {
                "strategy": {
                    "type": "pipeline",
                    "pipelineSchedule": "interleaved-1f1b",
                    "pipelineParallel": 4,
                }
            },
            "spec.strategy.pipelineParallel",
            "virtual stages",
        ),
        (
            {"strategy": {"type": "pipeline", "microBatches": 3}},
            "spec.strategy.microBatches",
            "must divide",
        ),
        (
            {
                "strategy": {
                    "type": "pipeline",
                    "pipelineSchedule": "interleaved-1f1b",
                    "microBatches": 1,
                }
            },
            "spec.strategy.microBatches",
            "multiple of pipelineParallel",
        ),
        (
            {"training": {"globalBatchSize": 6}},
            "spec.training.globalBatchSize",
            "dataParallel x microBatchSize",
        ),
        (
            {"training": {"globalBatchSize": 9, "microBatchSize": 2}},
            "spec.training.globalBatchSize",
            "multiple of spec.training.microBatchSize",
        ),
        (
            {"model": {"preset": "tiny", "heads": 3}},
            "spec.model.heads",
            "must divide spec.model.hidden",
        ),
        (
            {"model": {"preset": "tiny", "kvHeads": 3}},
            "spec.model.kvHeads",
            "must divide spec.model.heads",
        ),
        ({"model": {"preset": None, "layers": 2}}, "spec.model.preset", "must be a string"),
        (
            {"model": {"layers": 2, "hidden": 64}, "strategy": {"type": "ddp"}},
            "spec.model",
            "missing",
        ),
    ],
)
def test_bad_specs_name_field_and_rule(
    sections: dict[str, dict[str, Any]], field: str, words: str
) -> None:
    spec = make_spec(**sections)
    if sections.get("model", {}).get("layers") == 2 and "preset" not in sections["model"]:
        del spec["model"]["preset"]
    with pytest.raises(SpecError) as caught:
        plan_job(spec)
    assert caught.value.field == field
    assert words in caught.value.rule


def test_rank_order_tp_innermost_pp_outermost() -> None:
    strategy = {"type": "hybrid", "dataParallel": 2, "pipelineParallel": 2, "tensorParallel": 2}
    plan = plan_job(make_spec(strategy=strategy), "demo")
    ranks = plan.to_dict()["ranks"]
    for entry in ranks:
        assert entry["rank"] == rank_of(entry["pp"], entry["dp"], entry["tp"], 2, 2)
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
