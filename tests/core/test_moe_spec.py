"""spec.model.moe and expert parallelism in the API: the shape read from the spec, the presets
(parameter counts, total and active, of the published shapes), the rules naming their fields,
and the layout carrying ep. Mixtral and Qwen2-MoE config.json: tests/hf/test_hf_config.py."""

from __future__ import annotations

from typing import Any

import pytest

from meshrun.api.errors import SpecError
from meshrun.api.presets import PRESETS
from meshrun.api.read import read_spec
from meshrun.jobdoc import JobDocument, Pod, read_document, write_document
from meshrun.planner.plan import plan_job

pytestmark = pytest.mark.unit


def test_presets_are_the_published_shapes() -> None:
    large, small = PRESETS["moe-large"], PRESETS["moe-small"]
    assert large.parameters() == 46_702_792_704  # Mixtral 8x7B
    assert large.parameters(active=True) == pytest.approx(12.9e9, rel=0.01)
    assert small.parameters() == pytest.approx(14.3e9, rel=0.01)
    assert small.parameters(active=True) == pytest.approx(2.7e9, rel=0.01)


def _spec(moe: dict[str, Any] | None = None, **strategy: Any) -> dict[str, Any]:
    model: dict[str, Any] = {"preset": "tiny"}
    if moe is not None:
        model["moe"] = moe
    return {
        "image": "x",
        "resources": {"numNodes": 1, "numProcPerNode": 4, "accelerator": "cpu"},
        "strategy": {"type": "hybrid", "pipelineParallel": 1, "tensorParallel": 1, **strategy},
        "model": model,
        "training": {"globalBatchSize": 8, "dataset": "synthetic"},
    }


def test_the_spec_resolves_the_mixture() -> None:
    spec = read_spec(_spec({"experts": 8, "biasBalancing": True, "router": "sigmoid"}))
    moe = spec.shape.moe
    assert moe is not None
    assert (moe.experts, moe.experts_per_token, moe.expert_ffn_hidden) == (8, 2, 192)
    assert (moe.aux_loss_coefficient, moe.router) == (0.0, "sigmoid")  # 0 with biasBalancing
    assert read_spec(_spec({"experts": 8})).shape.moe.aux_loss_coefficient == 0.01  # type: ignore[union-attr]
    assert read_spec(_spec()).shape.moe is None


@pytest.mark.parametrize(
    ("moe", "strategy", "field", "words"),
    [
        (None, {"expertParallel": 2}, "spec.strategy.expertParallel", "needs spec.model.moe"),
        ({"experts": 6}, {"expertParallel": 4}, "spec.strategy.expertParallel", "must divide"),
        ({"experts": 4, "expertsPerToken": 5}, {}, "spec.model.moe.expertsPerToken", "exceed"),
        ({"experts": 4, "firstDenseLayers": 4}, {}, "spec.model.moe.firstDenseLayers", "below"),
        (
            {"experts": 4},
            {"expertTensorParallel": 2},
            "spec.strategy.expertTensorParallel",
            "1 or equal",
        ),
        (
            {"experts": 8},
            {"expertParallel": 8, "dataParallel": 4},
            "spec.strategy.expertParallel",
            "ranks of one pipeline stage",
        ),
    ],
)
def test_rules_name_the_field(
    moe: dict[str, Any] | None, strategy: dict[str, Any], field: str, words: str
) -> None:
    with pytest.raises(SpecError, match=words) as caught:
        plan_job(read_spec(_spec(moe, **strategy)), "moe")
    assert caught.value.field == field


def test_the_layout_carries_ep_through_the_job_document() -> None:
    spec = read_spec(_spec({"experts": 4}, dataParallel=4, expertParallel=2))
    plan = plan_job(spec, "moe")
    assert (plan.layout.ep, plan.layout.etp) == (2, 1)
    assert plan.layout.world_size == 4  # expert parallelism is folded, not added
    assert "(ep2)" in plan.layout.text()
    pod = Pod(
        job_name="moe",
        namespace="",
        index=0,
        attempt=0,
        checkpoint_dir=None,
        checkpoint_keep=0,
        metrics_port=0,
        termination_log="",
    )
    document = read_document(write_document(JobDocument(spec=spec, plan=plan, pod=pod)))
    assert document.plan.layout == plan.layout
    assert document.plan.model.moe == spec.shape.moe


@pytest.mark.parametrize(
    ("moe", "words"),
    [
        ({"experts": 4, "biasBalancing": True}, "no routing bias"),
        ({"experts": 4, "sharedExperts": 1}, "exported as Mixtral"),
        ({"experts": 4, "firstDenseLayers": 1}, "exported as Mixtral"),
    ],
)
def test_an_export_holds_what_the_format_describes(moe: dict[str, Any], words: str) -> None:
    spec = _spec(moe)
    spec["training"]["export"] = {"path": "/out"}
    with pytest.raises(SpecError, match=words) as caught:
        plan_job(read_spec(spec), "moe")
    assert caught.value.field == "spec.training.export"
