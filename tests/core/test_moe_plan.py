"""What a mixture of experts costs in the plan: expert memory divided by expert parallelism
and kept out of ZeRO, the routed tokens' activations, the all-to-alls in the step time on the
links the EP group spans, MFU counted on the active parameters, and auto choosing ep with a
reason."""

from __future__ import annotations

from typing import Any

import pytest

from meshrun.api.errors import SpecError
from meshrun.api.presets import PRESETS
from meshrun.api.read import read_spec
from meshrun.cli.picture import layout_boxes
from meshrun.planner.elastic import elastic_degrees, resized
from meshrun.planner.memory import bytes_per_parameter
from meshrun.planner.plan import Plan, plan_job

pytestmark = pytest.mark.unit

H100 = "NVIDIA-H100-80GB-HBM3"


def _plan(strategy: dict[str, Any], nodes: int = 2, procs: int = 8) -> Plan:
    spec = {
        "image": "x",
        "resources": {
            "numNodes": nodes,
            "numProcPerNode": procs,
            "accelerator": "nvidia.com/gpu",
            "acceleratorProduct": H100,
        },
        "strategy": strategy,
        "model": {"preset": "moe-large"},
        "training": {"globalBatchSize": 256, "activationCheckpointing": "full"},
    }
    return plan_job(read_spec(spec), "moe")


def _hybrid(ep: int, dp: int = 8, pp: int = 2, zero: int = 1) -> dict[str, Any]:
    return {
        "type": "hybrid",
        "dataParallel": dp,
        "pipelineParallel": pp,
        "tensorParallel": 1,
        "zeroStage": zero,
        "expertParallel": ep,
    }


def test_expert_memory_is_divided_by_ep_and_not_by_zero() -> None:
    shape = PRESETS["moe-large"]
    assert shape.moe is not None
    routed = shape.moe.routed_parameters(shape.hidden) * shape.layers // 2  # one of 2 stages
    weight, grad, optim = bytes_per_parameter("bf16")
    one, eight = _plan(_hybrid(1)).memory, _plan(_hybrid(8)).memory
    # 7/8 of a stage's routed experts leave each rank at ep 8: weights, gradients, AdamW.
    assert one.params - eight.params == pytest.approx(weight * routed * 7 / 8, rel=1e-6)
    assert one.grads - eight.grads == pytest.approx(grad * routed * 7 / 8, rel=1e-6)
    assert one.optimizer - eight.optimizer == pytest.approx(optim * routed * 7 / 8, rel=1e-6)
    # ZeRO-3 shards the dense part over dp but not the experts (the whole model's, at ep 8).
    zero3 = _plan(_hybrid(8, dp=16, pp=1, zero=3)).memory
    assert zero3.optimizer >= optim * routed * 2 / 8


def test_all_to_alls_are_priced_on_the_links_ep_spans() -> None:
    none = _plan(_hybrid(1)).estimate
    inside = _plan(_hybrid(8)).estimate  # ep 8: one pod's 8 consecutive ranks
    across = _plan(_hybrid(8), nodes=4, procs=4).estimate  # the same ranks over 2 pods
    assert none is not None and inside is not None and across is not None
    assert none.breakdown.get("expertParallel", 0.0) == 0.0
    assert 0 < inside.breakdown["expertParallel"] < across.breakdown["expertParallel"]


def test_mfu_counts_the_active_parameters() -> None:
    plan = _plan(_hybrid(8))
    estimate = plan.estimate
    assert estimate is not None
    shape = PRESETS["moe-large"]
    flops = 6 * (shape.parameters(active=True) - shape.embedding_parameters())
    total_flops = 6 * (shape.parameters() - shape.embedding_parameters())
    assert 0 < estimate.mfu < 1
    # Counting every expert as computed would report 3.6x the utilisation.
    assert total_flops / flops == pytest.approx(3.6, rel=0.05)


def test_auto_chooses_expert_parallelism_and_says_why() -> None:
    plan = _plan({"type": "auto"})
    assert plan.layout.ep > 1 and plan.layout.tp == 1
    assert f"expert parallel {plan.layout.ep} (the fastest that fits)" in plan.explanation
    assert "all-to-alls take" in plan.explanation


def test_expert_tensor_parallel_above_one_is_refused_by_name() -> None:
    with pytest.raises(SpecError) as caught:
        _plan(_hybrid(2, dp=4, pp=2) | {"tensorParallel": 2})
    assert caught.value.field == "spec.strategy.expertTensorParallel"
    plan = _plan(_hybrid(4, dp=4, pp=2) | {"tensorParallel": 2, "expertTensorParallel": 1})
    assert (plan.layout.tp, plan.layout.ep, plan.layout.etp) == (2, 4, 1)


def test_elastic_resizing_reshards_the_experts() -> None:
    spec = read_spec(
        {
            "image": "x",
            "resources": {"numNodes": 4, "numProcPerNode": 1, "accelerator": "cpu"},
            "strategy": {
                "type": "hybrid",
                "dataParallel": 4,
                "pipelineParallel": 1,
                "tensorParallel": 1,
                "expertParallel": 4,
            },
            "model": {"preset": "tiny", "moe": {"experts": 4}},
            "training": {"globalBatchSize": 12, "dataset": "synthetic"},
            "elastic": {"minDataParallel": 2},
        }
    )
    plan = plan_job(spec, "moe")
    assert elastic_degrees(spec, plan) == [2, 3, 4]
    assert [resized(spec, plan, dp)[1].layout.ep for dp in (2, 3)] == [2, 1]


def test_the_picture_says_which_experts_live_where() -> None:
    plan = _plan(_hybrid(4, dp=8, pp=2), nodes=2)
    cells, _, labels, _, _ = layout_boxes(plan)
    thirds = [cell.lines[2] for cell in cells[:8]]  # pod 0: stage 0's 8 ranks
    assert thirds == ["tp0 e0-1", "tp0 e2-3", "tp0 e4-5", "tp0 e6-7"] * 2
    assert "eA-B = the routed experts held" in labels[0][2]
