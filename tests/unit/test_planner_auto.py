"""strategy: auto reproduces the strategy table of docs/planner.md, row by row."""

from __future__ import annotations

from typing import Any

import pytest

from meshrun.planner import plan_job

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
    # (id, spec, the table row's text in the explanation, strategy chosen, allowed by the table)
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
    plan = plan_job(spec, "auto")
    assert plan.strategy == expected
    assert plan.strategy in allowed
    assert f"Strategy table row (docs/planner.md): {row}" in plan.explanation or (
        "Strategy table row (docs/planner.md): " in plan.explanation and row in plan.explanation
    )
    assert plan.memory.fits, plan.explanation


def test_fits_one_gpu_is_decided_by_the_memory_estimate() -> None:
    roomy = plan_job(make_spec({"preset": "1b"}, memory_gib=80))
    tight = plan_job(make_spec({"preset": "1b"}, memory_gib=16))
    assert (roomy.strategy, tight.strategy) == ("ddp", "zero")
    assert "it fits one GPU" in roomy.explanation
    assert "does not fit one GPU" in tight.explanation


def test_slow_network_with_short_memory_uses_zero1_with_model_parallelism() -> None:
    plan = plan_job(make_spec({"preset": "70b"}, nodes=4, inter="ethernet"))
    lay = plan.layout
    assert lay.tp > 1 and lay.dp > 1
    assert lay.zero_stage == 1
    assert 8 % lay.tp == 0, "TP stays inside a node"


def test_zero_picks_the_smallest_stage_that_fits() -> None:
    plan = plan_job(make_spec({"preset": "13b"}, nodes=4))
    # 13B: stages 1 and 2 still hold full bf16 weights (26 GB) and gradients; ZeRO-2 fits.
    assert plan.layout.zero_stage == 2
    worse = plan_job(make_spec({"preset": "13b"}, nodes=4, memory_gib=48))
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
