"""Impossible or inconsistent specs: each error names the field and the rule it breaks."""

from __future__ import annotations

from typing import Any

import pytest
from planner_factories import make_cpu_spec as make_spec

from meshrun.api.errors import SpecError
from meshrun.planner.plan import plan_job

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("sections", "field", "words"),
    [
        (
            {"strategy": {"type": "tensor", "tensorParallel": 3}},
            "spec.strategy.tensorParallel",
            "3 neither divides nor is a multiple of numProcPerNode=4",
        ),
        (
            {
                "resources": {"numNodes": 3, "numProcPerNode": 4},
                "strategy": {"type": "tensor", "tensorParallel": 6},
                "model": {"preset": "tiny", "heads": 6, "kvHeads": 6, "hidden": 72},
            },
            "spec.strategy.tensorParallel",
            "6 neither divides nor is a multiple of numProcPerNode=4",
        ),
        (
            {"strategy": {"type": "pipeline", "pipelineParallel": 8}},
            "spec.strategy.pipelineParallel",
            "8 stages for layers=4",
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
            "2x1x2x4 = 16, not 8",
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
            "4 stages x 2 virtual stages for layers=4",
        ),
        (
            {"strategy": {"type": "pipeline", "microBatches": 3}},
            "spec.strategy.microBatches",
            "must divide",
        ),
        (
            {
                # torch's ScheduleInterleaved1F1B: 9 micro-batches on 4 stages make 2 rounds.
                "strategy": {
                    "type": "pipeline",
                    "pipelineParallel": 4,
                    "pipelineSchedule": "interleaved-1f1b",
                    "microBatches": 9,
                },
                "model": {"layers": 8},
                "training": {"globalBatchSize": 18},
            },
            "spec.strategy.microBatches",
            "multiple of max(1, microBatches // pipelineParallel) = 2",
        ),
        (
            {"training": {"globalBatchSize": 6}},
            "spec.training.globalBatchSize",
            "multiple of spec.strategy.dataParallel x spec.training.microBatchSize (6 against",
        ),
        (
            {"training": {"globalBatchSize": 9, "microBatchSize": 2}},
            "spec.training.globalBatchSize",
            "multiple of spec.training.microBatchSize",
        ),
        (
            {"model": {"preset": "tiny", "heads": 3}},
            "spec.model.heads",
            "must divide spec.model.hidden (3 does not divide hidden=64)",
        ),
        (
            {"model": {"preset": "tiny", "kvHeads": 3}},
            "spec.model.kvHeads",
            "must divide spec.model.heads (3 does not divide heads=4)",
        ),
        ({"model": {"preset": None, "layers": 2}}, "spec.model.preset", "must be a string"),
        (
            {"model": {"layers": 2, "hidden": 64}, "strategy": {"type": "ddp"}},
            "spec.model",
            "missing",
        ),
        (
            {"model": {"preset": "tiny", "vocab": 128}, "training": {"dataset": "corpus"}},
            "spec.training.dataset",
            "vocab >= 256",
        ),
        (
            # Sequence parallelism splits the sequence: the trainer would refuse it.
            {
                "resources": {"numNodes": 1, "numProcPerNode": 8},
                "strategy": {"type": "tensor", "tensorParallel": 8},
                "model": {"preset": "tiny", "heads": 8, "kvHeads": 8, "seqLen": 100},
            },
            "spec.strategy.tensorParallel",
            "8 does not divide seqLen=100",
        ),
        (
            {"model": {"preset": "tiny", "heads": 64, "kvHeads": 4}},
            "spec.model.heads",
            "must be even for rotary embeddings (64 / 64 = 1)",
        ),
        (
            {
                "strategy": {
                    "type": "pipeline",
                    "pipelineSchedule": "interleaved-1f1b",
                    "virtualStages": 1,
                }
            },
            "spec.strategy.virtualStages",
            "must be at least 2 (or unset)",
        ),
        (
            {"model": {"preset": "tiny", "seqLen": 20000}, "training": {"dataset": "corpus"}},
            "spec.model.seqLen",
            "20000 must be below 10983 for spec.training.dataset corpus",
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


def test_1f1b_with_fewer_micro_batches_than_stages_runs_in_gpipe_order() -> None:
    """With fewer micro-batches than stages every rank's 1F1B warm-up holds all of them, which
    is GPipe's order (torch's Schedule1F1B refuses it): the plan says so instead of refusing."""
    plan = plan_job(make_spec(strategy={"type": "pipeline", "microBatches": 1}))
    assert plan.layout.pp > 1 and plan.layout.micro_batches == 1
    assert plan.layout.schedule == "gpipe"
    assert any("GPipe's order, which 1F1B reduces to" in w for w in plan.warnings)


def test_tensor_parallel_over_whole_pods_is_planned_and_warned() -> None:
    spec = make_spec(
        resources={"numNodes": 2, "numProcPerNode": 2},
        strategy={"type": "tensor", "tensorParallel": 4},
    )
    plan = plan_job(spec)
    assert plan.layout.tp == 4 and plan.layout.dp == 1
    assert any("tensorParallel 4 spans 2 pods" in w for w in plan.warnings)
    assert "each TP group holds 2 whole pods" in plan.explanation


def test_a_rule_on_a_section_names_the_section_once() -> None:
    """A rule whose message starts with its field, or with a field inside it, does not repeat
    the field after the ``field:`` prefix."""
    degrees = {"dataParallel": 4, "pipelineParallel": 1, "tensorParallel": 1}
    impossible = make_spec(strategy={"type": "hybrid", **degrees})  # 4 ranks of 8
    with pytest.raises(SpecError) as caught:
        plan_job(impossible, "j")
    assert caught.value.field == "spec.strategy"
    assert str(caught.value).startswith("spec.strategy: dataParallel x contextParallel x "), str(
        caught.value
    )
