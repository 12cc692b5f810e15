"""Context parallelism in the API and the planner: the named degrees and their rank order, the
contextParallel rules, the memory and step-time terms it changes, auto's search for it, the
places a plan shows it, and elastic data parallelism keeping it."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest
from planner_factories import make_cpu_spec

from meshrun.api.crd import load_jobs
from meshrun.api.errors import SpecError
from meshrun.api.layout import (
    RANK_ORDER,
    Degrees,
    Layout,
    coordinates_of,
    groups_along,
    rank_at,
    split_layers,
)
from meshrun.api.read import read_spec
from meshrun.cli.main import EXIT_OK, main
from meshrun.envcontract import pod_env
from meshrun.jobdoc import JOB_VARIABLE, read_document
from meshrun.planner.elastic import resized
from meshrun.planner.memory import estimate_memory, fsdp_shards, layer_activation_elements
from meshrun.planner.plan import plan_job
from meshrun.planner.ranks import cp_groups, dp_groups, pp_groups, shard_groups, tp_groups
from meshrun.planner.steptime import estimate_step
from meshrun.rules.strategy import CP_SEQUENCE, CP_TP_SEQUENCE, CP_WORLD, DEGREES_WORLD

pytestmark = pytest.mark.unit

H100 = "NVIDIA-H100-80GB-HBM3"
LLAMA_70B = {
    "layers": 80,
    "hidden": 8192,
    "heads": 64,
    "kvHeads": 8,
    "vocab": 128256,
    "ffnHidden": 28672,
}
LLAMA_405B = {
    "layers": 126,
    "hidden": 16384,
    "heads": 128,
    "kvHeads": 8,
    "vocab": 128256,
    "ffnHidden": 53248,
}


def gpu_job(
    nodes: int, model: dict[str, Any], seq: int, batch: int, strategy: dict[str, Any]
) -> dict[str, Any]:
    return {
        "image": "x",
        "resources": {
            "numNodes": nodes,
            "numProcPerNode": 8,
            "accelerator": "nvidia.com/gpu",
            "acceleratorProduct": H100,
        },
        "strategy": strategy,
        "model": {**model, "seqLen": seq},
        "training": {"globalBatchSize": batch, "dataset": "synthetic"},
    }


# The named degrees and the rank order.


def test_rank_order_is_pp_dp_cp_tp_and_the_degrees_fields_are_its_names() -> None:
    assert RANK_ORDER == ("pp", "dp", "cp", "tp")
    assert {f.name for f in dataclasses.fields(Degrees)} == set(RANK_ORDER)


def test_rank_and_coordinates_round_trip_in_mixed_radix() -> None:
    degrees = Degrees(dp=3, cp=2, pp=2, tp=2)
    assert degrees.world_size == 24
    for rank in range(degrees.world_size):
        c = coordinates_of(rank, degrees)
        assert rank == ((c["pp"] * 3 + c["dp"]) * 2 + c["cp"]) * 2 + c["tp"]
        assert rank_at(c, degrees) == rank
    assert coordinates_of(5, degrees) == {"pp": 0, "dp": 1, "cp": 0, "tp": 1}


def test_groups_partition_the_ranks_and_vary_along_their_own_dimension() -> None:
    degrees = Degrees(dp=2, cp=4, pp=2, tp=2)
    world = degrees.world_size
    for dim, groups in (
        ("tp", tp_groups(degrees)),
        ("cp", cp_groups(degrees)),
        ("dp", dp_groups(degrees)),
        ("pp", pp_groups(degrees)),
    ):
        assert sorted(r for g in groups for r in g) == list(range(world)), dim
        for group in groups:
            coords = [coordinates_of(r, degrees) for r in group]
            for other in set(RANK_ORDER) - {dim}:
                assert len({c[other] for c in coords}) == 1, (dim, other)
            assert [c[dim] for c in coords] == list(range(degrees.size(dim)))
    assert cp_groups(degrees)[0] == [0, 2, 4, 6], "CP ranks are tp apart"
    assert dp_groups(degrees)[0] == [0, 8], "DP ranks are cp x tp apart"
    assert groups_along("pp", degrees)[0] == [0, 16]
    # Gradients are reduced (and ZeRO shards) over the dp x cp ranks of one (pp, tp).
    shards = shard_groups(degrees)
    assert shards[0] == [0, 2, 4, 6, 8, 10, 12, 14] and len(shards) == 4
    assert sorted(r for g in shards for r in g) == list(range(world))


def test_layout_text_shows_cp_only_above_one() -> None:
    assert Degrees(dp=8, cp=16, pp=16, tp=8).text() == "dp8 x cp16 x pp16 x tp8"
    assert Degrees(dp=8, pp=2, tp=4).text() == "dp8 x pp2 x tp4"
    assert Degrees(dp=8, cp=2, tp=4).text(without="dp") == "cp2 x pp1 x tp4"
    layout = Layout(Degrees(dp=2, cp=4, pp=1, tp=2), 1, "1f1b", 1, 1, 1, 1)
    assert (layout.dp, layout.cp, layout.pp, layout.tp) == (2, 4, 1, 2)
    assert layout.world_size == 16 and layout.data_shards == 8


# The API and its rules.


@pytest.mark.parametrize(
    ("strategy", "degrees"),
    [
        ({"type": "ddp", "contextParallel": 2}, Degrees(dp=4, cp=2)),
        ({"type": "zero", "zeroStage": 3, "contextParallel": 4}, Degrees(dp=2, cp=4)),
        ({"type": "tensor", "tensorParallel": 2, "contextParallel": 2}, Degrees(dp=2, cp=2, tp=2)),
        (
            {"type": "pipeline", "pipelineParallel": 2, "contextParallel": 2},
            Degrees(dp=2, cp=2, pp=2),
        ),
        (
            {"type": "hybrid", "dataParallel": 1, "pipelineParallel": 2, "contextParallel": 2},
            Degrees(dp=1, cp=2, pp=2, tp=2),
        ),
    ],
)
def test_every_explicit_type_takes_context_parallel(
    strategy: dict[str, Any], degrees: Degrees
) -> None:
    spec = make_cpu_spec(strategy=strategy, training={"globalBatchSize": 8})
    plan = plan_job(spec, "cp")
    assert plan.layout.degrees == degrees
    ranks = plan.to_dict()["ranks"]
    assert all(r["rank"] == rank_at(r, degrees) for r in ranks)
    assert {r["cp"] for r in ranks} == set(range(degrees.cp))
    assert plan.to_dict()["layout"]["cp"] == plan.status_summary()["cp"] == degrees.cp
    assert f"cp{degrees.cp}" in plan.layout.text() and "Context parallel" in plan.explanation


@pytest.mark.parametrize(
    ("strategy", "model", "rule", "words"),
    [
        ({"type": "ddp", "contextParallel": 3}, {}, CP_WORLD, "3 does not divide 8"),
        ({"type": "ddp", "contextParallel": 4}, {"seqLen": 36}, CP_SEQUENCE, "seqLen=36"),
        ({"type": "ddp", "contextParallel": 2}, {"seqLen": 66}, CP_SEQUENCE, "seqLen=66"),
        (
            {
                "type": "hybrid",
                "dataParallel": 2,
                "pipelineParallel": 2,
                "tensorParallel": 2,
                "contextParallel": 2,
            },
            {},
            DEGREES_WORLD,
            "2x2x2x2 = 16, not 8",
        ),
        # 20 tokens over cp 2 leave 10 per rank, which TP 4 cannot split.
        (
            {"type": "tensor", "tensorParallel": 4, "contextParallel": 2},
            {"seqLen": 20},
            CP_TP_SEQUENCE,
            "20 / 2 for tensorParallel=4",
        ),
    ],
)
def test_context_parallel_rules_name_the_field(
    strategy: dict[str, Any], model: dict[str, Any], rule: Any, words: str
) -> None:
    spec = make_cpu_spec(strategy=strategy, model=model)
    with pytest.raises(SpecError) as caught:
        plan_job(spec)
    assert caught.value.field == rule.field and rule.error().rule in caught.value.rule
    assert words in caught.value.rule
    assert "contextParallel" in str(caught.value)


def test_a_hybrid_search_keeps_the_given_cp() -> None:
    spec = make_cpu_spec(
        strategy={"type": "hybrid", "contextParallel": 2}, resources={"acceleratorMemoryGiB": 1}
    )
    plan = plan_job(spec)
    assert plan.layout.cp == 2 and plan.layout.world_size == 8 and plan.layout.tp > 1


def test_auto_searches_cp_itself() -> None:
    with pytest.raises(SpecError, match="contextParallel") as caught:
        plan_job(make_cpu_spec(strategy={"type": "auto", "contextParallel": 2}))
    assert caught.value.field == "spec.strategy.type"


def test_the_default_is_one() -> None:
    spec = read_spec(make_cpu_spec())
    assert spec.strategy.context_parallel == 1
    assert plan_job(spec).layout.cp == 1


# Memory and step time.


def test_memory_divides_the_sequence_and_counts_the_gathered_keys_and_values() -> None:
    spec = read_spec(gpu_job(4, LLAMA_70B, 32768, 32, {"type": "auto"}))
    shape = spec.shape
    plain = layer_activation_elements(shape, 8, "none")
    for cp in (2, 4, 8):
        # Per token of a rank's share: the same, but k and v cover the whole sequence.
        q = shape.heads * shape.head_dim
        extra = 2 * q * (cp - 1) / 8
        assert layer_activation_elements(shape, 8, "none", cp) == pytest.approx(plain + extra)
    stages = split_layers(shape.layers, 1, 1)

    def activations(cp: int, mode: str) -> int:
        layout = Layout(Degrees(dp=32 // cp, cp=cp, tp=1), 3, "1f1b", 1, 1, 1, 1)
        return estimate_memory(spec, layout, stages, mode).activations

    # A rank keeps s / cp tokens' activations: the full-recompute ones (block inputs only)
    # shrink by cp; without recompute the whole sequence's K/V stays per layer.
    assert activations(4, "full") < activations(1, "full") / 3
    assert activations(1, "none") / 4 < activations(4, "none") < activations(1, "none")


def test_shards_follow_the_trainers_data_parallelism_over_dp_x_cp() -> None:
    spec = read_spec(gpu_job(2, LLAMA_70B, 8192, 16, {"type": "auto"}))
    stages = split_layers(spec.shape.layers, 2, 1)

    def memory(zero: int, cp: int) -> Any:
        layout = Layout(Degrees(dp=4 // cp, cp=cp, pp=2, tp=2), zero, "1f1b", 2, 1, 2, 1)
        return estimate_memory(spec, layout, stages, "full")

    assert fsdp_shards(Layout(Degrees(dp=2, cp=4, tp=2), 1, "1f1b", 1, 1, 1, 1)) == 8
    # ZeRO-1 beside PP and TP: FSDP2 over the 4 ranks of dp x cp whatever the split.
    assert memory(1, 2).optimizer == memory(1, 1).optimizer
    # ZeRO-0 beside them: HSDP replicates over dp and shards over cp.
    assert memory(0, 2).optimizer < memory(0, 1).optimizer / 1.5
    assert fsdp_shards(Layout(Degrees(dp=4, cp=2, tp=2), 0, "1f1b", 1, 1, 1, 1)) == 2
    # Plain DDP with ZeroRedundancyOptimizer: nothing sharded by FSDP2.
    assert fsdp_shards(Layout(Degrees(dp=4, cp=2), 1, "1f1b", 1, 1, 1, 1)) == 1


def test_step_time_prices_the_cp_exchange_inside_and_across_nodes() -> None:
    spec = read_spec(gpu_job(16, LLAMA_70B, 32768, 16, {"type": "auto"}))
    stages = split_layers(spec.shape.layers, 1, 1)

    def step(cp: int, tp: int) -> dict[str, float]:
        layout = Layout(Degrees(dp=128 // (cp * tp), cp=cp, tp=tp), 3, "1f1b", 1, 1, 1, 1)
        return estimate_step(spec, layout, stages, "full").breakdown

    assert step(1, 8)["contextParallel"] == 0.0
    # Recomputation (selective too: the gathered keys and values are not kept) gathers again.
    layout = Layout(Degrees(dp=32, cp=2, tp=2), 3, "1f1b", 1, 1, 1, 1)
    none, selective = (
        estimate_step(spec, layout, stages, mode).breakdown["contextParallel"]
        for mode in ("none", "selective")
    )
    assert selective == pytest.approx(1.5 * none)
    inside, across = step(2, 4)["contextParallel"], step(4, 4)["contextParallel"]
    assert inside > 0.0
    # cp 2 x tp 4 stays on a node's NVLink; cp 4 x tp 4 crosses the network: the same bytes
    # per rank (a larger share gathered) move several times slower.
    assert across > 3 * inside
    # Attention work per rank divides by cp (the split balances causal attention).
    assert step(2, 4)["compute"] == pytest.approx(step(1, 4)["compute"] / 2, rel=0.15)


# auto.


def test_auto_plans_a_70b_at_128k_tokens_with_16_sequences_on_512_gpus_with_cp() -> None:
    plan = plan_job(gpu_job(64, LLAMA_70B, 131072, 16, {"type": "auto"}), "long")
    assert plan.layout.cp > 1 and plan.memory.fits
    assert plan.layout.world_size == 512
    assert f"Context parallel {plan.layout.cp}: the sequence is long" in plan.explanation
    assert "Without it the fastest layout is" in plan.explanation
    assert plan.estimate is not None and plan.estimate.breakdown["contextParallel"] > 0


def test_short_chunks_are_warned_about() -> None:
    strategy = {"type": "ddp", "contextParallel": 4}
    plan = plan_job(gpu_job(1, LLAMA_70B, 4096, 16, strategy) | {"model": {"preset": "1b"}})
    assert any("chunks of 256 tokens" in w for w in plan.warnings), plan.warnings
    long = plan_job(gpu_job(1, LLAMA_70B, 4096, 16, strategy | {"contextParallel": 2}))
    assert not any("contextParallel" in w for w in long.warnings)


def test_auto_leaves_short_sequences_with_enough_sequences_alone() -> None:
    plan = plan_job(gpu_job(2, LLAMA_70B, 4096, 256, {"type": "auto"}), "short")
    assert plan.layout.cp == 1 and "Context parallel" not in plan.explanation


def test_llama3_128k_layout_plans_and_fits() -> None:
    """Llama 3 405B's long-context stage: TP 8, CP 16, PP 16, DP 8 on 16,384 H100s, 16M tokens
    (128 sequences of 131,072) per step."""
    strategy = {
        "type": "hybrid",
        "dataParallel": 8,
        "contextParallel": 16,
        "pipelineParallel": 16,
        "tensorParallel": 8,
        "zeroStage": 1,
        "pipelineSchedule": "interleaved-1f1b",
    }
    plan = plan_job(gpu_job(2048, LLAMA_405B, 131072, 128, strategy), "llama3")
    assert plan.layout.text() == "dp8 x cp16 x pp16 x tp8"
    assert plan.memory.fits and plan.world_size == 16384
    assert plan.estimate is not None
    assert 20 < plan.estimate.tokens_per_second_per_gpu < 200
    # The CP group (cp16 x tp8 = 128 ranks) spans 16 nodes.
    assert "over 16 pods" in plan.explanation


# A given cp, and what it buys.


LONG_CONTEXT = Path(__file__).resolve().parents[2] / "examples" / "long-context.yaml"


def long_context(**strategy: int) -> tuple[str, dict[str, Any]]:
    """examples/long-context.yaml's name and spec, its strategy's degrees replaced."""
    (job,) = load_jobs(LONG_CONTEXT)
    job["spec"]["strategy"].update(strategy)
    if "contextParallel" in strategy:
        world = strategy["contextParallel"] * job["spec"]["strategy"]["dataParallel"]
        job["spec"]["resources"]["numProcPerNode"] = world
    return job["metadata"]["name"], job["spec"]


def test_the_long_context_example_fits_because_of_cp(capsys: pytest.CaptureFixture[str]) -> None:
    """cp 2 fits the 1 GiB a process has; the same 2 processes as dp 2 do not, with any
    activation checkpointing (the logits of a whole sequence stay), and the plan says so; cp 4
    on 4 processes fits with more room."""
    name, spec = long_context()
    plan = plan_job(spec, name)
    assert plan.layout.text() == "dp1 x cp2 x pp1 x tp1" and plan.memory.fits
    for checkpointing in ("none", "selective", "full"):
        _, plain = long_context(dataParallel=2, contextParallel=1)
        plain["training"]["activationCheckpointing"] = checkpointing
        assert not plan_job(plain, name).memory.fits, checkpointing
    assert "Without context parallelism (dp2 x pp1 x tp1) it does not fit" in plan.explanation
    assert "even with full activation checkpointing" in plan.explanation
    assert "Context parallelism is what makes it fit" in plan.explanation
    four = plan_job(long_context(contextParallel=4)[1], name)
    assert four.memory.fits and four.memory.total < plan.memory.total
    assert main(["plan", str(LONG_CONTEXT)]) == EXIT_OK
    assert "Context parallelism is what makes it fit" in " ".join(capsys.readouterr().out.split())


def test_a_given_cp_is_weighed_against_data_parallelism() -> None:
    """Where the same ranks as data parallelism would fit too, the plan gives both memory
    figures and predictions; where they would break a rule, the rule; auto explains its own cp;
    cp 1 says nothing."""
    name, spec = long_context()
    spec["resources"].pop("acceleratorMemoryGiB")
    spec["training"]["globalBatchSize"] = 4
    plan = plan_job(spec, name)
    assert "Without context parallelism (dp2 x pp1 x tp1) it would fit too: " in plan.explanation
    assert re.search(r"predicted [\d,]+ tokens/s per process against [\d,]+\.", plan.explanation)
    spec["training"]["globalBatchSize"] = 1
    refused = plan_job(spec, name).explanation
    assert "Without context parallelism (dp2 x pp1 x tp1) the job is not valid: " in refused
    assert "spec.training.globalBatchSize" in refused
    plain = plan_job(make_cpu_spec(), "plain")
    assert "Without context parallelism" not in plain.explanation
    pair = make_cpu_spec(
        resources={"numNodes": 1, "numProcPerNode": 2}, training={"globalBatchSize": 2}
    )
    pair["strategy"] = {"type": "ddp", "contextParallel": 2}
    one_replica = plan_job(pair, "pair").explanation
    assert "A single process" not in one_replica  # one replica of 2 cp ranks
    assert re.search(r"[\d.]+ MiB per process against [\d.]+ MiB per process", one_replica)
    auto = plan_job(gpu_job(64, LLAMA_70B, 131072, 16, {"type": "auto"}), "long").explanation
    assert "Without context parallelism" not in auto


# Where a plan shows cp, and elastic data parallelism.


def test_meshrun_plan_shows_cp(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    job = {
        "apiVersion": "meshrun.dev/v1alpha1",
        "kind": "ParallelTrainingJob",
        "metadata": {"name": "cp"},
        "spec": make_cpu_spec(strategy={"type": "ddp", "contextParallel": 2}),
    }
    path = tmp_path / "cp.yaml"
    path.write_text(json.dumps(job))
    picture = tmp_path / "cp.svg"
    assert main(["plan", str(path), "--picture", str(picture)]) == 0
    out = capsys.readouterr().out
    assert "dp4 x cp2 x pp1 x tp1" in out
    assert "context-parallel key/value exchange" in out
    assert "cp1 tp0" in picture.read_text()
    assert main(["plan", str(path), "-o", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["layout"]["cp"] == 2 and data["layoutString"] == "dp4 x cp2 x pp1 x tp1"
    assert {r["cp"] for r in data["ranks"]} == {0, 1}


def test_elastic_keeps_cp_while_dp_changes() -> None:
    spec = read_spec(
        make_cpu_spec(
            resources={"accelerator": "nvidia.com/gpu", "numNodes": 4, "numProcPerNode": 2},
            strategy={"type": "ddp", "contextParallel": 2},
            training={"globalBatchSize": 16},
            elastic={"minDataParallel": 1},
        )
    )
    plan = plan_job(spec, "el")
    assert plan.layout.degrees == Degrees(dp=4, cp=2)
    sized, smaller = resized(spec, plan, 2)
    assert smaller.layout.degrees == Degrees(dp=2, cp=2)
    assert sized.resources.num_nodes == 2 and sized.strategy.context_parallel == 2
    assert smaller.layout.grad_accumulation == 2 * plan.layout.grad_accumulation


def test_the_job_document_and_env_carry_cp() -> None:
    spec = read_spec(make_cpu_spec(strategy={"type": "zero", "zeroStage": 3, "contextParallel": 2}))
    plan = plan_job(spec, "cp")
    env = pod_env(plan, spec, job_name="cp", namespace="ns", pod_index=1, master_addr="m")
    assert env["MESHRUN_CP"] == "2" and env["MESHRUN_DP"] == "4"
    assert env["MESHRUN_RANK_ORDER"] == ",".join(RANK_ORDER)
    document = read_document(env[JOB_VARIABLE])
    assert document.plan == plan and document.plan.layout.degrees == Degrees(dp=4, cp=2)
    assert json.loads(env[JOB_VARIABLE])["plan"]["layout"]["degrees"] == {
        "dp": 4,
        "cp": 2,
        "pp": 1,
        "tp": 1,
    }
    # Pod 1 holds ranks 4-7: data-parallel replicas 2 and 3, each over both CP ranks.
    coords = [document.plan.coords(rank) for rank in range(4, 8)]
    assert [(c.dp, c.cp) for c in coords] == [(2, 0), (2, 1), (3, 0), (3, 1)]


def test_a_hybrid_of_data_and_context_parallelism_alone_plans() -> None:
    """dataParallel and contextParallel given, the rest unset: the given degrees leave no room
    for pipeline or tensor parallelism, and that layout is the plan, not a refusal."""
    spec = make_cpu_spec(strategy={"type": "hybrid", "dataParallel": 4, "contextParallel": 2})
    degrees = plan_job(spec).layout.degrees
    assert (degrees.dp, degrees.cp, degrees.pp, degrees.tp) == (4, 2, 1, 1)
