"""The trainer's configuration from the job document: the core's types, read by the planner's
reader, checked by the planner's rules, errors naming the spec field."""

from __future__ import annotations

import json
from typing import Any

import pytest
from meshrun_trainer.config.read import read_job
from meshrun_trainer.local.env import edit_document, layout_env

from meshrun.api.errors import SpecError
from meshrun.api.presets import PRESETS
from meshrun.jobdoc import JOB_VARIABLE

pytestmark = pytest.mark.unit

TINY = {"preset": "tiny"}
TRAINING = {"steps": 4, "globalBatchSize": 8, "precision": "fp32", "dataset": "synthetic"}


def make_env(**parts: Any) -> dict[str, str]:
    """A one-process tiny job's environment, its document's spec/plan/pod edited by ``parts``."""
    env = layout_env(TINY, TRAINING)
    del env["WORLD_SIZE"]  # torchrun sets it for each process it starts
    return edit_document(env, **parts)


def test_a_planned_environment_reads_back_exactly() -> None:
    job = read_job(make_env())
    layout = job.plan.layout
    assert job.plan.model == job.spec.shape == PRESETS["tiny"] and job.plan.preset == "tiny"
    assert (layout.dp, layout.pp, layout.tp, layout.world_size) == (1, 1, 1, 1)
    assert job.plan.stage_layers == ((0, 3),)
    assert job.spec.training.precision == "fp32" and job.spec.training.steps == 4
    assert job.spec.training.learning_rate == 3e-4, "the CRD's default, not one of the trainer's"
    assert job.pod.metrics_port == 0 and job.pod.checkpoint_dir is None
    assert job.spec.tokens_per_step == 8 * 64


def test_interleaved_pipeline_takes_planner_ranges_in_stage_order() -> None:
    env = layout_env(
        TINY, TRAINING, pp=2, schedule="interleaved-1f1b", virtual_stages=2, micro_batches=4
    )
    plan = read_job(env).plan
    assert plan.layout.num_stages == 4
    assert plan.stage_layers == ((0, 0), (1, 1), (2, 2), (3, 3))


def test_the_document_is_required() -> None:
    env = make_env()
    del env[JOB_VARIABLE]
    with pytest.raises(SpecError, match="MESHRUN_JOB: is required"):
        read_job(env)
    with pytest.raises(SpecError, match="MESHRUN_JOB: is not JSON"):
        read_job({**env, JOB_VARIABLE: "{"})


def stages(*ranges: tuple[int, int]) -> list[dict[str, Any]]:
    return [{"pp": i, "virtual": 0, "first": a, "last": b} for i, (a, b) in enumerate(ranges)]


# the trainer takes the plan's micro-batch size (8 = dp1 x 4 x 2 micro-batches)
PIPELINE = {"degrees": {"dp": 1, "pp": 2, "tp": 1}, "microBatches": 2, "microBatchSize": 4}
MB4 = {"training": {"microBatchSize": 4}}
PLAN_MB4 = {"layout": PIPELINE}


@pytest.mark.parametrize(
    ("parts", "field", "fragment"),
    [
        (
            {"plan": {"layout": {"degrees": {"tp": 3}}}},
            "spec.strategy.tensorParallel",
            "must divide",
        ),
        ({"plan": {"layout": {"zeroStage": 4}}}, "spec.strategy.zeroStage", "0, 1, 2 or 3"),
        (
            {"plan": {"layout": {"degrees": {"pp": 8}, "microBatches": 8}}},
            "spec.strategy.pipelineParallel",
            "8 stages for layers=4",
        ),
        (
            {"plan": {**PLAN_MB4, "stages": stages((0, 2), (2, 3))}, "spec": MB4},
            "plan.stages",
            "contiguous",
        ),
        (
            {"plan": {**PLAN_MB4, "stages": stages((0, 0), (1, 2))}, "spec": MB4},
            "plan.stages",
            "cover all 4",
        ),
        (
            {"plan": PLAN_MB4, "spec": MB4},
            "plan.stages",
            "needs pp x virtualStages = 2",
        ),
        (
            {"plan": {"layout": {"degrees": {"dp": 3}}}},
            "spec.training.globalBatchSize",
            "(8 against 3x8 = 24)",
        ),
        (
            {"plan": {"layout": {"degrees": {"cp": 4}}, "model": {"seqLen": 20}}},
            "spec.strategy.contextParallel",
            "seqLen=20 for contextParallel=4",
        ),
        # seqLen 64 splits into 2 x cp chunks for cp 2, 4, 8 and 16, not for 3 or 64
        (
            {"plan": {"layout": {"degrees": {"cp": 3}}}},
            "spec.strategy.contextParallel",
            "2 x contextParallel",
        ),
        (
            {"plan": {"layout": {"degrees": {"cp": 64}}}},
            "spec.strategy.contextParallel",
            "seqLen=64",
        ),
        (
            # 2 tokens per rank, 4 tp ranks
            {"plan": {"layout": {"degrees": {"cp": 32, "tp": 4}}}},
            "spec.strategy.contextParallel",
            "64 / 32 for tensorParallel=4",
        ),
        ({"plan": {"layout": {"microBatchSize": 0}}}, "spec.training.microBatchSize", "got 0"),
        ({"spec": {"training": {"learningRate": "fast"}}}, "spec.training.learningRate", "number"),
        ({"spec": {"training": {"precision": "fp8"}}}, "spec.training.precision", "bf16"),
        ({"plan": {"model": {"kvHeads": 3}}}, "spec.model.kvHeads", "(3 does not divide heads=4)"),
        ({"plan": {"model": {"heads": 64, "kvHeads": 4}}}, "spec.model.heads", "rotary"),
        (
            {"spec": {"training": {"dataset": "corpus"}}, "plan": {"model": {"vocab": 128}}},
            "spec.training.dataset",
            "vocab >= 256",
        ),
    ],
)
def test_bad_values_name_the_spec_field_and_rule(
    parts: dict[str, Any], field: str, fragment: str
) -> None:
    with pytest.raises(SpecError) as caught:
        read_job(make_env(**parts))
    assert caught.value.field == field, caught.value
    assert fragment in caught.value.rule
    assert str(caught.value).startswith(f"{field}: ")


def test_world_size_must_match_the_layout() -> None:
    with pytest.raises(SpecError, match=r"spec.strategy: .*1x1x1x1 = 1, not 4"):
        read_job({**make_env(), "WORLD_SIZE": "4"})
    cp = make_env(plan={"layout": {"degrees": {"cp": 2}}})
    with pytest.raises(SpecError, match=r"spec.strategy: .*1x2x1x1 = 2, not 4"):
        read_job({**cp, "WORLD_SIZE": "4"})
    assert read_job({**cp, "WORLD_SIZE": "2"}).plan.layout.world_size == 2


def test_the_document_holds_only_what_the_crd_allows() -> None:
    document = json.loads(make_env()[JOB_VARIABLE])
    assert set(document) == {"spec", "plan", "pod"}
    assert "podTemplate" not in document["spec"]
    with pytest.raises(SpecError) as caught:
        read_job(make_env(spec={"training": {"warpDrive": True}}))
    assert caught.value.field.startswith("spec.training")
