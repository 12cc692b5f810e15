"""The step-time model's parts behave as the physics says, and the hardware profiles feed it."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_plan_properties import hybrid_specs

from meshrun.api.errors import SpecError
from meshrun.api.hardware import PROFILES
from meshrun.api.presets import PRESETS
from meshrun.api.read import read_spec
from meshrun.api.spec import GIB
from meshrun.planner.memory import MemoryEstimate
from meshrun.planner.plan import Plan, plan_job
from meshrun.planner.steptime import (
    collective_seconds,
    gemm_efficiency,
    group_of,
    layer_compute_seconds,
    pressure_slowdown,
)

pytestmark = pytest.mark.unit


def make_spec(
    strategy: dict[str, Any],
    nodes: int = 2,
    preset: str = "7b",
    batch: int = 64,
    **resources: Any,
) -> dict[str, Any]:
    return {
        "image": "trainer:1",
        "resources": {"numNodes": nodes, "numProcPerNode": 8, **resources},
        "strategy": strategy,
        "model": {"preset": preset},
        "training": {"globalBatchSize": batch, "activationCheckpointing": "none"},
    }


def parts(plan: Plan) -> dict[str, float]:
    assert plan.estimate is not None
    return plan.estimate.breakdown


def test_a_product_gives_memory_and_peak() -> None:
    h200 = read_spec(make_spec({"type": "ddp"}, acceleratorProduct="NVIDIA-H200"))
    assert h200.resources.accelerator_bytes == PROFILES["NVIDIA-H200"].memory_gib * GIB
    assert not h200.resources.memory_assumed
    given = read_spec(
        make_spec({"type": "ddp"}, acceleratorProduct="NVIDIA-H200", acceleratorMemoryGiB=100)
    )
    assert given.resources.accelerator_bytes == 100 * GIB
    a100 = read_spec(make_spec({"type": "ddp"}, acceleratorProduct="NVIDIA-A100-SXM4-40GB"))
    assert a100.resources.accelerator_bytes == 40 * GIB


def test_faster_products_predict_faster_steps() -> None:
    strategy = {"type": "hybrid", "dataParallel": 4, "pipelineParallel": 1, "tensorParallel": 4}
    speeds = [
        plan_job(make_spec(strategy, acceleratorProduct=p)).estimate
        for p in ("NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3", "NVIDIA-B200")
    ]
    tokens = [s.tokens_per_second_per_gpu for s in speeds if s is not None]
    assert tokens == sorted(tokens) and len(tokens) == 3


def test_unknown_product_warns_and_assumes_the_default() -> None:
    plan = plan_job(make_spec({"type": "ddp"}, preset="1b", acceleratorProduct="Acme-X1"))
    assert any("Acme-X1 has no built-in profile" in w for w in plan.warnings)
    assert plan.memory.accelerator_bytes == 80 * GIB


def test_a_product_needs_a_gpu_job() -> None:
    spec = make_spec({"type": "ddp"}, preset="tiny", acceleratorProduct="NVIDIA-H200")
    spec["resources"]["accelerator"] = "cpu"
    with pytest.raises(SpecError) as error:
        plan_job(spec)
    assert error.value.field == "spec.resources.acceleratorProduct"


def test_slower_links_slow_the_collectives_that_use_them() -> None:
    tensor = {"type": "hybrid", "dataParallel": 2, "pipelineParallel": 1, "tensorParallel": 8}
    fast = parts(plan_job(make_spec(tensor)))
    slow = parts(plan_job(make_spec(tensor, interconnect={"intraNodeGBps": 45})))
    assert slow["tensorParallel"] > 5 * fast["tensorParallel"]
    zero = {"type": "zero", "zeroStage": 3}
    wide = parts(plan_job(make_spec(zero, nodes=8, batch=64)))
    thin = parts(plan_job(make_spec(zero, nodes=8, batch=64, interconnect={"interNodeGbps": 25})))
    assert thin["dataParallel"] > wide["dataParallel"]


def test_a_tp_split_layer_is_slower_per_flop() -> None:
    shape = PRESETS["7b"]
    whole, _ = layer_compute_seconds(shape, 4096, 1, 989e12)
    split, _ = layer_compute_seconds(shape, 4096, 8, 989e12)
    assert split * 8 > whole * 1.03
    assert gemm_efficiency(4096, 512, 4096) < gemm_efficiency(4096, 4096, 4096)


def test_interleaving_shrinks_the_bubble_by_the_virtual_stages() -> None:
    base = {"type": "hybrid", "dataParallel": 2, "pipelineParallel": 8, "tensorParallel": 1}
    plain = parts(plan_job(make_spec(base, batch=32)))
    interleaved = parts(
        plan_job(
            make_spec(
                {**base, "pipelineSchedule": "interleaved-1f1b", "virtualStages": 4}, batch=32
            )
        )
    )
    ratio = interleaved["pipelineBubble"] / plain["pipelineBubble"]
    assert ratio == pytest.approx(1 / 4, rel=0.25)
    assert interleaved["pipelineTransfer"] > plain["pipelineTransfer"]


def test_full_recomputation_costs_about_one_more_forward() -> None:
    spec = make_spec({"type": "zero", "zeroStage": 1})
    none = parts(plan_job(spec))
    full_spec = copy.deepcopy(spec)
    full_spec["training"]["activationCheckpointing"] = "full"
    full = parts(plan_job(full_spec))
    assert none["recompute"] == 0
    # Forward is about a third of forward + backward (flash attention's backward is 2.5x).
    assert 0.25 < full["recompute"] / full["compute"] < 0.4


def test_zero3_gathers_again_for_every_micro_batch() -> None:
    """ZeRO-1 moves its gradients and parameters once per step, whatever the accumulation;
    ZeRO-3 gathers the parameters again for each micro-batch, so with enough micro-batches it
    moves more on the same machines."""

    def data_parallel(stage: int, batch: int) -> dict[str, float]:
        return parts(
            plan_job(make_spec({"type": "zero", "zeroStage": stage}, nodes=16, batch=batch))
        )

    z1 = [data_parallel(1, batch) for batch in (128, 1024)]
    z3 = [data_parallel(3, batch) for batch in (128, 1024)]
    assert z1[0]["dataParallel"] == pytest.approx(z1[1]["dataParallel"])
    assert z3[1]["dataParallel"] == pytest.approx(8 * z3[0]["dataParallel"])
    assert z3[1]["dataParallel"] > z1[1]["dataParallel"]
    assert z3[0]["optimizer"] == pytest.approx(z1[0]["optimizer"])


def test_mfu_matches_tokens_per_second() -> None:
    plan = plan_job(make_spec({"type": "zero", "zeroStage": 1}, acceleratorProduct="NVIDIA-H200"))
    est = plan.estimate
    assert est is not None
    shape = PRESETS["7b"]
    flops = 6 * (shape.layers * shape.layer_parameters() + shape.vocab * shape.hidden)
    flops += 12 * shape.layers * shape.seq_len * shape.hidden
    assert est.mfu == pytest.approx(est.tokens_per_second_per_gpu * flops / 989e12)
    assert sum(est.breakdown.values()) == pytest.approx(est.step_seconds)
    assert plan.status_summary()["predictedTokensPerSecond"] == pytest.approx(
        est.tokens_per_second_per_gpu * 16, rel=1e-3
    )


@pytest.mark.parametrize("product", ["bad value!", "-NVIDIA", "NVIDIA-H100-"])
def test_a_product_must_be_a_label_value(product: str) -> None:
    with pytest.raises(SpecError) as error:
        plan_job(make_spec({"type": "ddp"}, preset="tiny", acceleratorProduct=product))
    assert error.value.field == "spec.resources.acceleratorProduct"
    assert "does not match" in str(error.value)


@settings(max_examples=60, deadline=None)
@given(
    spec=hybrid_specs(),
    intra=st.sampled_from([25.0, 100.0, 450.0]),
    inter=st.sampled_from([10.0, 100.0, 400.0]),
    faster=st.sampled_from([2.0, 10.0]),
)
def test_faster_links_never_slow_a_layout(
    spec: dict[str, Any], intra: float, inter: float, faster: float
) -> None:
    spec["resources"].update(accelerator="nvidia.com/gpu", acceleratorMemoryGiB=4096)
    spec["resources"]["interconnect"] = {"intraNodeGBps": intra, "interNodeGbps": inter}
    slow = plan_job(spec).estimate
    spec["resources"]["interconnect"] = {
        "intraNodeGBps": intra * faster,
        "interNodeGbps": inter * faster,
    }
    fast = plan_job(spec).estimate
    assert slow is not None and fast is not None
    assert fast.step_seconds <= slow.step_seconds * (1 + 1e-9)
    assert fast.breakdown["compute"] == pytest.approx(slow.breakdown["compute"])


def test_a_group_across_pods_shares_its_pods_network_and_more_pods_share_less() -> None:
    """Across pods a group's ranks on one pod share that pod's NICs: a TP 16 group over two H100
    pods moves near NVLink speed, a DP group of one rank per pod at one GPU's network share, and
    the more pods a group spans the closer it comes to one share."""
    res = read_spec(make_spec({"type": "ddp"}, nodes=64)).resources
    share, nvlink = res.inter_node_bytes_per_second, res.intra_node_bytes_per_second
    inside = group_of(res, 8, 1)
    assert inside.bandwidth == nvlink and inside.pods == 1
    two_pods = group_of(res, 16, 1)
    assert two_pods.pods == 2 and 5 * share < two_pods.bandwidth < nvlink
    one_per_pod = group_of(res, 64, 8)  # DP beside TP 8: one rank on each pod
    assert one_per_pod.per_pod == 1 and one_per_pod.bandwidth == share
    spans = [group_of(res, 8 * pods, 1).bandwidth for pods in (2, 4, 16, 64)]
    assert spans == sorted(spans, reverse=True) and spans[-1] == share
    # Each further pod adds a network hop: a small collective's time grows with the span.
    times = [collective_seconds(1e6, group_of(res, 8 * pods, 1)) for pods in (2, 8, 32)]
    assert times == sorted(times)


def test_a_tp_block_with_little_work_waits_on_its_launches() -> None:
    """At one short sequence per micro-batch a TP block's shards hold less work than eager
    PyTorch takes to launch them; a whole block with a large micro-batch does not wait."""
    tensor = {"type": "tensor", "tensorParallel": 8}
    small = parts(plan_job(make_spec(tensor, nodes=1, preset="1b", batch=16)))
    assert small["launch"] > small["compute"]
    big = make_spec({"type": "ddp"}, nodes=1, preset="7b", batch=64)
    big["training"]["microBatchSize"] = 4
    assert parts(plan_job(big))["launch"] == 0


def test_memory_pressure_starts_at_95_percent_and_reaches_half_a_step() -> None:
    def at(share: float) -> float:
        return pressure_slowdown(MemoryEstimate(int(share * GIB), 0, 0, 0, GIB))

    assert at(0.5) == at(0.95) == 0
    assert at(0.975) == pytest.approx(0.25, abs=1e-6)
    assert at(1.0) == at(1.5) == pytest.approx(0.5)
    assert pressure_slowdown(None) == 0


def test_under_zero3_memory_pressure_starts_at_75_percent() -> None:
    """ZeRO-3 gathers and frees every unit's parameters all step long: its step slows from 75%
    of the accelerator (a fifth of it when full), the general half-step beyond 95% still
    applies, and no other layout slows below 95%."""
    zero3 = plan_job(make_spec({"type": "zero", "zeroStage": 3}, nodes=2)).layout
    zero1 = plan_job(make_spec({"type": "zero", "zeroStage": 1}, nodes=2)).layout

    def at(share: float, layout: Any) -> float:
        return pressure_slowdown(MemoryEstimate(int(share * GIB), 0, 0, 0, GIB), layout)

    assert at(0.75, zero3) == 0 < at(0.76, zero3)
    assert at(0.875, zero3) == pytest.approx(0.1, abs=1e-6)
    assert at(0.95, zero3) == pytest.approx(0.16, abs=1e-6)
    assert at(1.0, zero3) == pytest.approx(0.5) == at(1.0, zero1)
    assert at(0.875, zero1) == at(0.95, zero1) == 0


def test_zero1_without_tp_or_pp_broadcasts_after_the_step() -> None:
    """DDP's all-reduce hides behind a long backward; ZeRO-1 (ZeroRedundancyOptimizer) then
    broadcasts the updated shards with nothing to hide behind, while FSDP2's ZeRO-0 beside TP
    gathers no parameters at all."""
    spec = make_spec({"type": "ddp"}, nodes=2, batch=64)
    spec["training"]["microBatchSize"] = 4
    ddp = parts(plan_job(spec))
    zero1 = parts(plan_job({**spec, "strategy": {"type": "zero", "zeroStage": 1}}))
    # Hidden behind backward, DDP's all-reduce still shows DP_EXPOSED of its time.
    assert 0 < ddp["dataParallel"] < zero1["dataParallel"]
    hybrid = {"type": "hybrid", "dataParallel": 4, "pipelineParallel": 1, "tensorParallel": 4}
    replicated = parts(plan_job({**spec, "strategy": {**hybrid, "zeroStage": 0}}))
    zero1_tp = parts(plan_job({**spec, "strategy": {**hybrid, "zeroStage": 1}}))
    assert 0 < replicated["dataParallel"] < zero1_tp["dataParallel"]
