"""Planner invariants over many valid specs (hypothesis)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshrun.api.errors import SpecError
from meshrun.api.read import read_spec
from meshrun.planner.auto import table_choice
from meshrun.planner.plan import Plan, plan_job
from meshrun.planner.ranks import cp_groups, dp_groups, pp_groups, tp_groups

pytestmark = pytest.mark.unit

# tiny with 8 layers: heads 4 and ffn 192 allow tp 1, 2, 4; up to 8 pipeline stages.
MODEL = {"preset": "tiny", "layers": 8}


@st.composite
def hybrid_specs(draw: st.DrawFn) -> dict[str, Any]:
    """A valid explicit hybrid spec on up to 4 pods x 8 processes (tiny's 64 tokens split into
    2 x cp chunks for cp up to 4)."""
    nodes = draw(st.integers(1, 4))
    procs = draw(st.sampled_from([1, 2, 4, 8]))
    world = nodes * procs
    tp = draw(st.sampled_from([t for t in (1, 2, 4) if procs % t == 0]))
    cp = draw(st.sampled_from([c for c in (1, 2, 4) if (world // tp) % c == 0]))
    pp = draw(st.sampled_from([p for p in range(1, 9) if (world // (tp * cp)) % p == 0]))
    dp = world // (tp * cp * pp)
    micro = draw(st.integers(1, 2))
    schedule = draw(st.sampled_from(["gpipe", "1f1b"]))
    passes = draw(st.integers(1, 4))
    if schedule == "1f1b":
        passes = max(passes, pp)  # torch's Schedule1F1B needs a micro-batch per stage
    batch = dp * micro * passes
    return {
        "image": "trainer:1",
        "resources": {"numNodes": nodes, "numProcPerNode": procs, "acceleratorMemoryGiB": 1},
        "strategy": {
            "type": "hybrid",
            "dataParallel": dp,
            "contextParallel": cp,
            "pipelineParallel": pp,
            "tensorParallel": tp,
            "zeroStage": draw(st.integers(0, 3)),
            "pipelineSchedule": schedule,
        },
        "model": MODEL,
        "training": {"globalBatchSize": batch, "microBatchSize": micro},
    }


def check_invariants(plan: Plan) -> None:
    data = plan.to_dict()
    world = data["worldSize"]
    lay = data["layout"]
    assert lay["dp"] * lay["cp"] * lay["pp"] * lay["tp"] == world
    assert sorted(r["rank"] for r in data["ranks"]) == list(range(world))
    pod_ranks = [rank for pod in data["pods"] for rank in pod["ranks"]]
    assert sorted(pod_ranks) == list(range(world)), "each rank in exactly one pod"
    tp_pods: dict[tuple[int, int], set[int]] = defaultdict(set)
    groups: dict[str, set[tuple[int, int]]] = defaultdict(set)
    for r in data["ranks"]:
        assert r["pod"] == r["rank"] // data["numProcPerNode"]
        tp_pods[(r["pp"], r["dp"], r["cp"])].add(r["pod"])
        groups["tp"].add((r["pp"], r["dp"], r["cp"]))
        groups["cp"].add((r["pp"], r["dp"], r["tp"]))
        groups["dp"].add((r["pp"], r["cp"], r["tp"]))
        groups["pp"].add((r["dp"], r["cp"], r["tp"]))
    assert all(len(pods) == 1 for pods in tp_pods.values()), "a TP group stays in one pod"
    assert len(groups["tp"]) * lay["tp"] == world
    assert len(groups["cp"]) * lay["cp"] == world
    assert len(groups["dp"]) * lay["dp"] == world
    assert len(groups["pp"]) * lay["pp"] == world
    layers = [layer for s in data["stages"] for layer in range(s["layers"][0], s["layers"][1] + 1)]
    assert layers == list(range(data["model"]["layers"])), "stages cover every layer once"


@settings(max_examples=200, deadline=None)
@given(hybrid_specs())
def test_every_valid_hybrid_plan_is_consistent(spec: dict[str, Any]) -> None:
    check_invariants(plan_job(spec, "prop"))


@settings(max_examples=100, deadline=None)
@given(hybrid_specs())
def test_process_groups_partition_the_ranks(spec: dict[str, Any]) -> None:
    plan = plan_job(spec)
    world, lay = plan.world_size, plan.layout
    for groups, size, axis in (
        (tp_groups(lay.degrees), lay.tp, "tp"),
        (cp_groups(lay.degrees), lay.cp, "cp"),
        (dp_groups(lay.degrees), lay.dp, "dp"),
        (pp_groups(lay.degrees), lay.pp, "pp"),
    ):
        assert sorted(r for g in groups for r in g) == list(range(world)), axis
        assert all(len(g) == size for g in groups), axis
        for group in groups:
            coords = [plan.coords(r) for r in group]
            # Members differ only along their own axis.
            for other in {"tp", "cp", "dp", "pp"} - {axis}:
                assert len({getattr(c, other) for c in coords}) == 1, (axis, other)
            assert sorted(getattr(c, axis) for c in coords) == list(range(size))
    for group in tp_groups(lay.degrees):
        assert len({plan.coords(r).pod for r in group}) == 1, "TP group inside one pod"


@settings(max_examples=100, deadline=None)
@given(hybrid_specs())
def test_memory_shrinks_as_zero_stage_rises(spec: dict[str, Any]) -> None:
    totals, states = [], []
    for stage in range(4):
        spec["strategy"]["zeroStage"] = stage
        memory = plan_job(spec).memory
        totals.append(memory.total)
        states.append(memory.params + memory.grads + memory.optimizer)
    # Model states; FSDP2's working set (one unit's buffers) may outweigh what ZeRO-2 saves
    # over ZeRO-1 on a tiny model. Under pipelining FSDP2 holds a stage's weights and fp32
    # gradients whole through the step, so at a small dp sharding may save nothing over
    # replication.
    assert states[1:] == sorted(states[1:], reverse=True)
    if spec["strategy"]["pipelineParallel"] == 1:
        assert states == sorted(states, reverse=True)
        if spec["strategy"]["dataParallel"] > 1:
            assert totals[3] < totals[0]


@settings(max_examples=100, deadline=None)
@given(
    nodes=st.integers(1, 4),
    procs=st.sampled_from([1, 2, 4, 8]),
    preset=st.sampled_from(["tiny", "small", "1b", "7b", "13b", "70b"]),
    memory=st.sampled_from([8, 24, 40, 80, 141]),
    inter=st.sampled_from(["infiniband", "ethernet"]),
    intra=st.sampled_from(["nvlink", "pcie"]),
)
def test_auto_always_plans_a_consistent_layout(
    nodes: int, procs: int, preset: str, memory: int, inter: str, intra: str
) -> None:
    spec = {
        "image": "trainer:1",
        "resources": {
            "numNodes": nodes,
            "numProcPerNode": procs,
            "acceleratorMemoryGiB": memory,
            "interconnect": {"intraNode": intra, "interNode": inter},
        },
        "model": {"preset": preset},
        "training": {"globalBatchSize": 64 * nodes * procs},
    }
    plan = plan_job(spec)
    check_invariants(plan)
    assert plan.strategy in {"ddp", "zero", "pipeline", "tensor", "hybrid"}
    assert "Strategy table row (docs/planner.md): " in plan.explanation
    # auto searches a superset of the table's layouts: never predicted slower than its pick.
    table = table_choice(read_spec(spec))
    assert plan.estimate is not None and table.estimate is not None
    if table.memory.fits:
        assert plan.memory.fits
        chosen, tabled = plan.estimate, table.estimate
        assert chosen.tokens_per_second_per_gpu >= tabled.tokens_per_second_per_gpu * (1 - 1e-9)
    assert sum(plan.estimate.breakdown.values()) == pytest.approx(plan.estimate.step_seconds)


JUNK = st.one_of(st.none(), st.booleans(), st.integers(-3, 100), st.text(max_size=6), st.just([1]))


@settings(max_examples=200, deadline=None)
@given(
    section=st.sampled_from(["resources", "strategy", "model", "training"]),
    key=st.sampled_from(
        [
            "numNodes",
            "numProcPerNode",
            "type",
            "tensorParallel",
            "pipelineParallel",
            "microBatches",
            "preset",
            "layers",
            "heads",
            "globalBatchSize",
            "precision",
        ]
    ),
    value=JUNK,
)
def test_bad_input_raises_only_spec_error(section: str, key: str, value: object) -> None:
    spec: dict[str, Any] = {
        "image": "trainer:1",
        "resources": {"numNodes": 2, "numProcPerNode": 4},
        "strategy": {"type": "hybrid", "pipelineParallel": 2},
        "model": {"preset": "tiny"},
    }
    spec[section] = {**spec.get(section, {}), key: value}
    try:
        check_invariants(plan_job(spec))
    except SpecError as error:
        assert error.field.startswith("spec"), error
