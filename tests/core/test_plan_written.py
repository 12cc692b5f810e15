"""The plan as others read it: the keys of ``status.plan``, ``meshrun plan -o json`` and its
candidates are pinned (kubectl users, dashboards and scripts read them), and what the operator
writes to ``status.plan`` is what the CRD's status schema declares."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from meshrun.api.crd import validate_status
from meshrun.api.read import read_spec
from meshrun.planner.fastest import candidate_dict
from meshrun.planner.plan import Plan, plan_job
from meshrun.planner.search import best_layouts

pytestmark = pytest.mark.unit

GPU_SPEC: dict[str, Any] = {
    "image": "trainer:1",
    "resources": {
        "numNodes": 2,
        "numProcPerNode": 8,
        "accelerator": "nvidia.com/gpu",
        "acceleratorMemoryGiB": 80,
    },
    "strategy": {"type": "auto"},
    "model": {"preset": "7b"},
    "training": {"globalBatchSize": 64},
}
CPU_PIPELINE: dict[str, Any] = {
    "image": "trainer:1",
    "resources": {"numNodes": 1, "numProcPerNode": 8, "accelerator": "cpu"},
    "strategy": {"type": "pipeline", "pipelineParallel": 2},
    "model": {"preset": "tiny"},
    "training": {"globalBatchSize": 8},
}

LAYOUT = [
    "dp",
    "cp",
    "pp",
    "tp",
    "zeroStage",
    "pipelineSchedule",
    "microBatches",
    "virtualStages",
    "gradAccumulation",
    "microBatchSize",
    "bubbleFraction",
    "activationCheckpointing",
]
MEMORY = {
    "perGpuBytes": ["params", "grads", "optimizer", "activations", "gathered", "total"],
    "acceleratorBytes": None,
    "fits": None,
}
ESTIMATE = {"stepSeconds": None, "tokensPerSecondPerGpu": None, "mfu": None, "breakdown": None}
PLAN_JSON = {
    "name": None,
    "worldSize": None,
    "gpus": None,
    "numNodes": None,
    "numProcPerNode": None,
    "accelerator": None,
    "strategy": None,
    "layoutString": None,
    "layout": LAYOUT,
    "model": [
        "preset",
        "parameters",
        "layers",
        "hidden",
        "heads",
        "kvHeads",
        "vocab",
        "seqLen",
        "ffnHidden",
        "mlp",
    ],
    "pods": ["index", "name", "ranks"],
    "ranks": ["pp", "dp", "cp", "tp", "rank", "pod", "localRank"],
    "stages": ["pp", "virtual", "layers"],
    "memory": MEMORY,
    "estimate": ESTIMATE,
    "explanation": None,
    "warnings": None,
}
STATUS_PLAN = {
    "strategy": None,
    "layout": None,
    "dp": None,
    "cp": None,
    "pp": None,
    "tp": None,
    "zeroStage": None,
    "microBatchSize": None,
    "worldSize": None,
    "gpus": None,
    "memory": MEMORY,
    "estimate": ESTIMATE,
    "predictedTokensPerSecond": None,
    "explanation": None,
    "warnings": None,
}
CANDIDATE = [
    "layoutString",
    "strategy",
    "dp",
    "cp",
    "pp",
    "tp",
    "zeroStage",
    "pipelineSchedule",
    "virtualStages",
    "microBatches",
    "microBatchSize",
    "activationCheckpointing",
    "memoryBytes",
    "stepSeconds",
    "tokensPerSecondPerGpu",
    "mfu",
]


def keys(value: Any) -> list[str]:
    """The keys of a mapping, or of a list's first entry, in order."""
    first = value[0] if isinstance(value, list) else value
    assert isinstance(first, Mapping)
    return list(first)


def plans() -> list[Plan]:
    return [plan_job(GPU_SPEC, "gpu"), plan_job(CPU_PIPELINE, "cpu")]


@pytest.mark.parametrize("plan", plans(), ids=["gpu", "cpu-pipeline"])
def test_the_keys_of_plan_json_and_status_plan_stay(plan: Plan) -> None:
    full, status = plan.to_dict(), plan.status_summary()
    assert keys(full) == list(PLAN_JSON)
    for key, nested in PLAN_JSON.items():
        if isinstance(nested, list):
            assert keys(full[key]) == nested, key
    assert keys(status) == list(STATUS_PLAN)
    for written in (full, status):
        assert keys(written["memory"]) == list(MEMORY)
        assert keys(written["memory"]["perGpuBytes"]) == MEMORY["perGpuBytes"]
        assert keys(written["estimate"]) == list(ESTIMATE)
        assert written["estimate"]["breakdown"]["compute"] > 0
    assert full["stages"][0]["layers"] == [plan.stages[0].first, plan.stages[0].last]
    assert status["layout"] == full["layoutString"] == plan.layout.text()


def test_the_keys_of_candidates_stay() -> None:
    candidates = best_layouts(read_spec(GPU_SPEC), 3)
    assert [list(candidate_dict(c)) for c in candidates] == [CANDIDATE] * 3


def test_predictions_are_rounded_and_unset_values_null() -> None:
    plan = plan_job(GPU_SPEC, "gpu")
    assert plan.estimate is not None
    full = plan.to_dict()
    assert full["estimate"]["stepSeconds"] == round(plan.estimate.step_seconds, 6)
    assert full["estimate"]["tokensPerSecondPerGpu"] == round(
        plan.estimate.tokens_per_second_per_gpu, 3
    )
    assert full["estimate"]["mfu"] == round(plan.estimate.mfu, 4)
    assert plan_job(CPU_PIPELINE, "cpu").to_dict()["layout"]["bubbleFraction"] == round(1 / 3, 4)
    explicit = {
        **GPU_SPEC,
        "model": {"layers": 2, "hidden": 64, "heads": 4, "vocab": 256, "seqLen": 64},
    }
    unnamed = plan_job(explicit, "unnamed")
    assert unnamed.to_dict()["model"]["preset"] is None
    assert (
        unnamed.status_summary()["predictedTokensPerSecond"]
        == unnamed.predicted_tokens_per_second()
    )


@pytest.mark.parametrize("plan", plans(), ids=["gpu", "cpu-pipeline"])
def test_status_plan_is_what_the_crd_status_schema_declares(plan: Plan) -> None:
    validate_status({"plan": plan.status_summary()})
