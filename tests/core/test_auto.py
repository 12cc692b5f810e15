"""strategy: auto takes the fastest predicted layout that fits; the strategy table of
docs/planner.md, row by row, is what it explains itself against."""

from __future__ import annotations

from typing import Any

import pytest
from meshrun_trainer.config.read import read_job

from meshrun.api.read import read_spec
from meshrun.envcontract import pod_env
from meshrun.planner.auto import table_choice
from meshrun.planner.fastest import describe_layout
from meshrun.planner.plan import plan_job
from meshrun.planner.search import best_layouts, enumerate_layouts

pytestmark = pytest.mark.unit

# Two huge layers: one layer with its Adam states (12 GiB) exceeds an 8 GiB GPU.
WIDE = {"layers": 2, "hidden": 8192, "heads": 64, "vocab": 32000, "seqLen": 512}


def make_spec(
    model: dict[str, Any],
    nodes: int = 1,
    procs: int = 8,
    memory_gib: int | None = 80,
    intra: str = "nvlink",
    inter: str = "infiniband",
    batch: int = 64,
) -> dict[str, Any]:
    resources: dict[str, Any] = {
        "numNodes": nodes,
        "numProcPerNode": procs,
        "interconnect": {"intraNode": intra, "interNode": inter},
    }
    if memory_gib is not None:
        resources["acceleratorMemoryGiB"] = memory_gib
    return {
        "image": "trainer:1",
        "resources": resources,
        "strategy": {"type": "auto"},
        "model": model,
        "training": {"globalBatchSize": batch, "microBatchSize": 1},
    }


ROWS = [
    # (id, spec, the table row's text, the table's strategy, allowed by the table)
    ("single-gpu", make_spec({"preset": "small"}, procs=1), "a single GPU", "ddp", {"ddp"}),
    ("one-node-fits", make_spec({"preset": "small"}), "model fits one GPU", "ddp", {"ddp", "zero"}),
    (
        "one-node-too-big-nvlink",
        make_spec({"preset": "7b"}),
        "does not fit one GPU, NVLink",
        "zero",
        {"pipeline", "zero", "tensor"},
    ),
    (
        "one-node-too-big-pcie",
        make_spec({"preset": "7b"}, intra="pcie"),
        "PCIe: PP first",
        "pipeline",
        {"pipeline", "zero", "tensor"},
    ),
    (
        "one-node-largest-layer-too-big",
        make_spec(WIDE, memory_gib=8, batch=8),
        "largest layer does not fit",
        "tensor",
        {"tensor", "zero"},
    ),
    (
        "many-nodes-fast",
        make_spec({"preset": "13b"}, nodes=4),
        "many nodes, fast interconnect",
        "zero",
        {"zero", "hybrid"},
    ),
    # The 3D search's least model parallelism that fits 70b on 32 GPUs is TP 8 x DP 4 with
    # ZeRO-1 (no pipeline: under pipelining FSDP2 holds a stage's weights and fp32 gradients
    # whole through the step, 86 GiB at TP 4 x PP 2 x DP 4).
    (
        "many-nodes-fast-zero-not-enough",
        make_spec({"preset": "70b"}, nodes=4),
        "many nodes, fast interconnect",
        "tensor",
        {"zero", "hybrid", "tensor"},
    ),
    (
        "many-nodes-slow",
        make_spec({"preset": "70b"}, nodes=4, inter="ethernet"),
        "many nodes, slow interconnect",
        "tensor",
        {"zero", "hybrid", "tensor"},
    ),
    (
        "many-nodes-slow-small-model",
        make_spec({"preset": "1b"}, nodes=2, inter="ethernet"),
        "many nodes, slow interconnect",
        "zero",
        {"zero", "hybrid"},
    ),
]


@pytest.mark.parametrize(
    ("spec", "row", "expected", "allowed"), [r[1:] for r in ROWS], ids=[r[0] for r in ROWS]
)
def test_strategy_table_row(
    spec: dict[str, Any], row: str, expected: str, allowed: set[str]
) -> None:
    table = table_choice(read_spec(spec))
    assert table.strategy == expected
    assert table.strategy in allowed
    assert table.memory.fits
    plan = plan_job(spec, "auto")
    assert f"Strategy table row (docs/planner.md): {row}" in plan.explanation or (
        "Strategy table row (docs/planner.md): " in plan.explanation and row in plan.explanation
    )
    assert plan.memory.fits, plan.explanation
    assert plan.estimate is not None and table.estimate is not None
    assert plan.estimate.tokens_per_second_per_gpu >= table.estimate.tokens_per_second_per_gpu


@pytest.mark.parametrize(("spec"), [r[1] for r in ROWS], ids=[r[0] for r in ROWS])
def test_auto_takes_the_fastest_layout_that_fits(spec: dict[str, Any]) -> None:
    job = read_spec(spec)
    fitting, _ = enumerate_layouts(job)
    speeds = [c.estimate.tokens_per_second_per_gpu for c in fitting if c.estimate]
    assert speeds == sorted(speeds, reverse=True) and len(speeds) == len(fitting)
    assert all(c.memory.fits for c in fitting)
    plan = plan_job(spec, "auto")
    assert plan.estimate is not None
    assert plan.estimate.tokens_per_second_per_gpu == pytest.approx(speeds[0])
    assert (plan.layout, plan.activation_checkpointing) == (
        fitting[0].layout,
        fitting[0].checkpointing,
    )
    assert f"Fastest of the {len(fitting)} layouts that fit" in plan.explanation


def test_explanation_names_runners_up_and_why_the_table_is_slower() -> None:
    spec = make_spec({"preset": "70b"}, nodes=8, batch=512)
    plan = plan_job(spec, "auto")
    runners = best_layouts(read_spec(spec), 4)[1:]
    assert "Runners-up: " in plan.explanation
    named = [c for c in runners if describe_layout(c) in plan.explanation]
    assert named, plan.explanation
    table = table_choice(read_spec(spec))
    assert table.layout != plan.layout
    assert f"it would pick {describe_layout(table)}" in plan.explanation
    assert "s more per step on " in plan.explanation


def test_tp_across_the_network_is_slower_than_tp_on_nvlink() -> None:
    fast = plan_job(make_spec({"preset": "13b"}, nodes=2, batch=64))
    pcie = plan_job(make_spec({"preset": "13b"}, nodes=2, batch=64, intra="pcie"))
    assert fast.estimate is not None and pcie.estimate is not None
    assert pcie.layout.tp <= fast.layout.tp
    assert pcie.estimate.tokens_per_second_per_gpu < fast.estimate.tokens_per_second_per_gpu


def test_fits_one_gpu_is_decided_by_the_memory_estimate() -> None:
    roomy = table_choice(read_spec(make_spec({"preset": "1b"}, memory_gib=80)))
    tight = table_choice(read_spec(make_spec({"preset": "1b"}, memory_gib=16)))
    assert (roomy.strategy, tight.strategy) == ("ddp", "zero")
    assert "it fits one GPU" in roomy.reasons[0]
    assert "does not fit one GPU" in tight.reasons[0]


def test_slow_network_with_short_memory_table_uses_zero1_with_model_parallelism() -> None:
    choice = table_choice(read_spec(make_spec({"preset": "70b"}, nodes=4, inter="ethernet")))
    lay = choice.layout
    assert lay.tp > 1 and lay.dp > 1
    assert lay.zero_stage == 1
    assert 8 % lay.tp == 0, "TP stays inside a node"


def test_table_zero_picks_the_smallest_stage_that_fits() -> None:
    choice = table_choice(read_spec(make_spec({"preset": "13b"}, nodes=4)))
    # 13B: stages 1 and 2 still hold full bf16 weights (26 GB) and gradients; ZeRO-2 fits.
    assert choice.layout.zero_stage == 2
    worse = table_choice(read_spec(make_spec({"preset": "13b"}, nodes=4, memory_gib=48)))
    assert worse.layout.zero_stage == 3


def test_cpu_without_memory_is_ddp() -> None:
    spec = make_spec({"preset": "tiny"}, nodes=2, procs=4, memory_gib=None, batch=8)
    spec["resources"]["accelerator"] = "cpu"
    plan = plan_job(spec)
    assert plan.strategy == "ddp" and plan.layout.dp == 8
    assert plan.memory.fits and plan.memory.accelerator_bytes == 0


def test_nothing_fits_reports_the_smallest_and_fits_false() -> None:
    plan = plan_job(make_spec({"preset": "70b"}, procs=8, memory_gib=8, batch=8))
    assert not plan.memory.fits
    assert "smallest estimate" in plan.explanation
    smallest = min(
        (
            plan_job(
                {**make_spec({"preset": "70b"}, procs=8, memory_gib=8, batch=8), "strategy": s}
            )
            for s in (
                {"type": "zero", "zeroStage": 3},
                {"type": "tensor", "tensorParallel": 8},
            )
        ),
        key=lambda p: p.memory.total,
    )
    assert plan.memory.total <= smallest.memory.total


def test_auto_chooses_the_micro_batch_size_only_when_unset() -> None:
    spec = make_spec({"preset": "7b"}, nodes=4, batch=256)
    del spec["training"]["microBatchSize"]
    plan = plan_job(spec)
    sizes = {c.layout.micro_batch_size for c in enumerate_layouts(read_spec(spec))[0]}
    assert sizes >= {1, 2}, sizes
    assert "spec.training.microBatchSize is unset" in plan.explanation
    assert plan.to_dict()["layout"]["microBatchSize"] == plan.layout.micro_batch_size
    env = pod_env(
        plan, read_spec(spec), job_name="job", namespace="ns", pod_index=0, master_addr="job-0"
    )
    # what trains: the trainer checks and runs the plan's size, not the spec's
    assert read_job(env).plan.layout.micro_batch_size == plan.layout.micro_batch_size
    given_spec = make_spec({"preset": "7b"}, nodes=4, batch=256)
    assert plan_job(given_spec).layout.micro_batch_size == 1
    given = enumerate_layouts(read_spec(given_spec))[0]
    assert {c.layout.micro_batch_size for c in given} == {1}
