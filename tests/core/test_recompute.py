"""The planner's pipeline split by weight, and auto turning activation checkpointing on."""

from __future__ import annotations

from typing import Any

import pytest

from meshrun.api.layout import split_layers
from meshrun.api.presets import PRESETS
from meshrun.planner.degrees import chunk_weights, stage_split
from meshrun.planner.plan import plan_job

pytestmark = pytest.mark.unit


def _costs(name: str, counts: list[int]) -> list[int]:
    block, embedding, head = chunk_weights(PRESETS[name])
    costs = [n * block for n in counts]
    costs[0] += embedding
    costs[-1] += head
    return costs


@pytest.mark.parametrize(
    ("preset", "pp", "virtual", "counts"),
    [
        ("tiny", 2, 1, [2, 2]),  # tiny's vocabulary weighs a quarter block: no change
        ("tiny", 2, 2, [1, 1, 1, 1]),
        ("1b", 4, 1, [3, 5, 5, 3]),  # embedding and head weigh ~1.1 blocks each
        ("small", 4, 1, [2, 4, 4, 2]),
        ("7b", 4, 1, [8, 8, 8, 8]),  # half a block each: moving a layer would not help
    ],
)
def test_split_weighs_embedding_and_head(
    preset: str, pp: int, virtual: int, counts: list[int]
) -> None:
    stages = stage_split(PRESETS[preset], pp, virtual)
    assert [s.last - s.first + 1 for s in stages] == counts
    assert [(s.pp, s.virtual) for s in stages] == [(c % pp, c // pp) for c in range(pp * virtual)]
    even = [s.last - s.first + 1 for s in split_layers(PRESETS[preset].layers, pp, virtual)]
    assert max(_costs(preset, counts)) <= max(_costs(preset, even))


def test_the_plan_hands_the_weighted_split_to_the_pods() -> None:
    spec = {
        "image": "trainer:1",
        "resources": {"numNodes": 4, "numProcPerNode": 1, "acceleratorMemoryGiB": 80},
        "strategy": {"type": "pipeline", "pipelineParallel": 4},
        "model": {"preset": "1b"},
        "training": {"globalBatchSize": 8, "microBatchSize": 1},
    }
    plan = plan_job(spec)
    assert [(s.first, s.last) for s in plan.stages] == [(0, 2), (3, 7), (8, 12), (13, 15)]


def _single_gpu(memory_gib: int, strategy: str = "auto", **training: Any) -> dict[str, Any]:
    return {
        "image": "trainer:1",
        "resources": {"numNodes": 1, "numProcPerNode": 1, "acceleratorMemoryGiB": memory_gib},
        "strategy": {"type": strategy},
        "model": {"preset": "1b"},
        "training": {
            "globalBatchSize": 16,
            "microBatchSize": 16,
            "precision": "bf16",
            **training,
        },
    }


@pytest.mark.parametrize("strategy", ["auto", "ddp"])
@pytest.mark.parametrize(
    ("memory_gib", "mode"),
    # none holds 60.6 GiB, selective 43.6, full 21.2: each fits with headroom here.
    [(80, "none"), (58, "selective"), (32, "full")],
)
def test_unset_checkpointing_is_the_least_that_fits(
    memory_gib: int, mode: str, strategy: str
) -> None:
    plan = plan_job(_single_gpu(memory_gib, strategy))
    assert plan.memory.fits
    assert plan.activation_checkpointing == mode
    assert plan.to_dict()["layout"]["activationCheckpointing"] == mode
    if mode == "none":
        assert "checkpointing" not in plan.explanation
    else:
        assert f"Activation checkpointing ({mode}) is on: without it" in plan.explanation


@pytest.mark.parametrize("strategy", ["auto", "ddp"])
def test_too_little_headroom_recomputes_when_that_is_faster(strategy: str) -> None:
    """Without recomputation the job fits in 62 GiB with 1.4 to spare (60.6 GiB, past 95%):
    too little for the allocator to run at speed, and recomputing the element-wise work is
    predicted faster than that slowdown."""
    plan = plan_job(_single_gpu(62, strategy))
    assert plan.activation_checkpointing == "selective"
    bare = plan_job(_single_gpu(62, strategy, activationCheckpointing="none"))
    assert bare.memory.fits and bare.estimate is not None and plan.estimate is not None
    assert bare.estimate.breakdown["memoryPressure"] > 0
    assert plan.estimate.breakdown["memoryPressure"] == 0
    assert plan.estimate.step_seconds < bare.estimate.step_seconds
    if strategy == "ddp":
        assert "fits with less recomputation (none, 60.6 GiB of 62)" in plan.explanation


def test_a_set_mode_is_kept_and_a_stronger_one_suggested() -> None:
    plan = plan_job(_single_gpu(32, "ddp", activationCheckpointing="selective"))
    assert plan.activation_checkpointing == "selective" and not plan.memory.fits
    assert "It would fit with spec.training.activationCheckpointing: full." in plan.explanation
    kept = plan_job(_single_gpu(80, "auto", activationCheckpointing="full"))
    assert kept.activation_checkpointing == "full" and "is on: without it" not in kept.explanation
