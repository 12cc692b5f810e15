"""Choosing each pipeline stage's topology domains (domains.py, placer.py) and which nodes count
(nodefit.py, the node watch's NodeInfo), on fake nodes: no cluster."""

from __future__ import annotations

from typing import Any

import pytest
from meshrun_operator.children.domains import choose, domain_room, natural_key
from meshrun_operator.children.nodefit import node_filter, tolerates
from meshrun_operator.children.owner import JobRef
from meshrun_operator.children.placer import Placer
from meshrun_operator.lifecycle.evaluation import evaluate
from meshrun_operator.seen.nodes import NodeInfo, node_info
from meshrun_operator.seen.views import NodeView, PodView, pod_view
from operator_factories import make_job

pytestmark = pytest.mark.unit

RACK = "topology.meshrun.dev/rack"
READY = NodeView(ready=True, since=None)


def node(rack: str | None, gpus: int = 8, **fields: Any) -> NodeInfo:
    labels = {"pool": "a"} | ({RACK: rack} if rack is not None else {})
    return NodeInfo(view=fields.pop("view", READY), labels=labels, accelerators=gpus, **fields)


def racks(*sizes: int) -> dict[str, NodeInfo]:
    """Racks rack-0, rack-1, ... of ``sizes`` 8-GPU nodes; nodes named r<rack>n<i>."""
    return {f"r{r}n{i}": node(f"rack-{r}") for r, size in enumerate(sizes) for i in range(size)}


def everywhere(_: NodeInfo) -> bool:
    return True


def room(nodes: dict[str, NodeInfo], used: dict[str, int] | None = None) -> dict[str, int]:
    return domain_room(RACK, nodes, 8, used or {}, {}, everywhere)


def test_a_stage_that_fits_one_rack_gets_the_tightest_and_its_neighbour_the_nearest() -> None:
    # rack-1 has 2 nodes free, the others 4: the 2-pod stage fills rack-1, not an empty rack.
    free = room(racks(4, 4, 4, 4), used={"r1n0": 8, "r1n1": 8})
    assert free == {"rack-0": 4, "rack-1": 2, "rack-2": 4, "rack-3": 4}
    assert choose([2], free) == [{"rack-1": 2}]
    # Stages of 4: each a whole rack; the next stage in the rack nearest the previous one.
    assert choose([4, 4, 2], free) == [{"rack-0": 4}, {"rack-2": 4}, {"rack-1": 2}]
    # Earlier stages' domains count as taken: two stages of 2 share a rack of 4.
    assert choose([2, 2], room(racks(4, 4))) == [{"rack-0": 2}, {"rack-0": 2}]


def test_a_stage_larger_than_any_rack_spans_the_fewest() -> None:
    # 6 pods over racks with 4, 4 and 2 free: the roomiest first, the rest in the tightest fit.
    free = {"rack-0": 4, "rack-1": 4, "rack-2": 2}
    assert choose([6], free) == [{"rack-0": 4, "rack-2": 2}]
    # 8 pods over racks of 4: two neighbouring racks.
    assert choose([8, 8], room(racks(4, 4, 4, 4))) == [
        {"rack-0": 4, "rack-1": 4},
        {"rack-2": 4, "rack-3": 4},
    ]


def test_no_room_no_key_no_choice() -> None:
    assert choose([4, 4], {"rack-0": 4, "rack-1": 3}) is None
    unlabelled = {"n0": node(None), "n1": node(None)}
    assert room(unlabelled) == {} and choose([1], room(unlabelled)) is None


def test_domains_in_natural_order() -> None:
    assert sorted(["rack-10", "rack-2", "rack-1"], key=natural_key) == [
        "rack-1",
        "rack-2",
        "rack-10",
    ]


def test_only_nodes_the_pods_may_go_on_count() -> None:
    taint = ("meshrun.dev/pool", "a", "NoSchedule")
    nodes = {
        "ok": node("rack-0"),
        "not-ready": node("rack-0", view=NodeView(ready=False, since=None)),
        "cordoned": node("rack-0", unschedulable=True),
        "tainted": node("rack-1", taints=(taint,)),
        "no-gpus": node("rack-1", gpus=0),
        "half-full": node("rack-1", gpus=8),
    }
    used = {"half-full": 4}
    plain = domain_room(RACK, nodes, 8, used, {}, node_filter({}))
    assert plain == {"rack-0": 1, "rack-1": 0}
    # Half-node pods fit where the 8-GPU ones do not.
    assert domain_room(RACK, nodes, 4, used, {}, node_filter({}))["rack-1"] == 1
    toleration = {"key": "meshrun.dev/pool", "operator": "Equal", "value": "a"}
    tolerant = domain_room(RACK, nodes, 8, used, {}, node_filter({"tolerations": [toleration]}))
    assert tolerant == {"rack-0": 1, "rack-1": 1}
    # Promised to another job's pods not yet bound: 8 GPUs of rack-0.
    assert domain_room(RACK, nodes, 8, used, {"rack-0": 8}, node_filter({}))["rack-0"] == 0
    # The template's nodeSelector and required node affinity choose among the nodes.
    assert domain_room(RACK, nodes, 8, {}, {}, node_filter({"nodeSelector": {"pool": "b"}})) == {}
    term = {"matchExpressions": [{"key": RACK, "operator": "NotIn", "values": ["rack-0"]}]}
    required = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
    spec = {"affinity": {"nodeAffinity": required}}
    assert set(domain_room(RACK, nodes, 8, {}, {}, node_filter(spec))) == {"rack-1"}


@pytest.mark.parametrize(
    ("toleration", "tolerated"),
    [
        ({"key": "k", "operator": "Equal", "value": "v", "effect": "NoSchedule"}, True),
        ({"key": "k", "value": "v"}, True),  # Equal by default, any effect
        ({"key": "k", "value": "w"}, False),
        ({"key": "k", "operator": "Exists"}, True),
        ({"operator": "Exists"}, True),  # every taint
        ({"key": "k", "operator": "Exists", "effect": "NoExecute"}, False),
        ({"key": "other", "operator": "Exists"}, False),
    ],
)
def test_tolerations(toleration: dict[str, str], tolerated: bool) -> None:
    assert tolerates([toleration], ("k", "v", "NoSchedule")) is tolerated


def test_the_node_watch_keeps_accelerators_and_schedulability() -> None:
    body = {
        "metadata": {"name": "n", "labels": {RACK: "rack-3"}},
        "spec": {
            "unschedulable": True,
            "taints": [
                {"key": "a", "value": "1", "effect": "NoSchedule"},
                {"key": "b", "effect": "PreferNoSchedule"},  # only a preference: not kept
                {"key": "c", "effect": "NoExecute"},
            ],
        },
        "status": {
            "allocatable": {"nvidia.com/gpu": "8", "cpu": "192"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    info = node_info(body)
    assert (info.accelerators, info.unschedulable) == (8, True)
    assert info.taints == (("a", "1", "NoSchedule"), ("c", "", "NoExecute"))
    assert node_info({"metadata": {"name": "cpu"}}).accelerators == 0
    pod = {
        "metadata": {"name": "p"},
        "spec": {
            "containers": [
                {"name": "trainer", "resources": {"limits": {"nvidia.com/gpu": "4"}}},
                {"name": "side", "resources": {"requests": {"nvidia.com/gpu": "1"}}},
            ]
        },
    }
    assert pod_view(pod).accelerators == 5


def pipeline(
    name: str, pods: int, stages: int, uid: str, accelerator: str = "nvidia.com/gpu"
) -> tuple[JobRef, Any]:
    """A job of ``pods`` 8-GPU pods in ``stages`` stages with the rack as its topology key."""
    strategy = {"type": "pipeline", "pipelineParallel": stages} if stages > 1 else {"type": "ddp"}
    job = make_job(
        name=name,
        resources={"numNodes": pods, "numProcPerNode": 8, "accelerator": accelerator},
        strategy=strategy,
        model={"preset": "1b"},
        training={"steps": 10, "globalBatchSize": 512, "microBatchSize": 1},
        scheduling={"topologyKey": RACK},
    )
    ev = evaluate(job["spec"], name)
    assert ev.spec is not None and ev.plan is not None, ev.error
    return JobRef(name, "ns", uid), ev


def bound(job: str, uid: str, nodes: list[str | None], attempt: int = 0) -> list[PodView]:
    return [
        PodView(f"{job}-{i}", i, attempt, "Running" if n else "Pending", node=n, owner_uid=uid,
                accelerators=8)
        for i, n in enumerate(nodes)
    ]  # fmt: skip


def test_the_placer_counts_bound_pods_and_other_jobs_promises() -> None:
    index: dict[tuple[str, str], list[PodView]] = {}
    placer = Placer(racks(4, 4, 4, 4), index)
    # A job of another operator run already holds two nodes of rack-0; one pod of it ended.
    index[("ns", "old")] = bound("old", "u0", ["r0n0", "r0n1", "r0n2"])
    index[("ns", "old")][2] = PodView("old-2", 2, 0, "Succeeded", node="r0n2", owner_uid="u0")
    first, ev1 = pipeline("first", 8, 2, "u1")
    assert ev1.spec is not None and ev1.plan is not None
    # Each stage of 4 in a rack of its own: not rack-0, which has 2 nodes left.
    assert placer.choose(first, ev1.spec, ev1.plan, 0) == {0: ("rack-1",), 1: ("rack-2",)}
    # Created at the same time, before any of first's pods is bound: its racks are promised.
    second, ev2 = pipeline("second", 4, 2, "u2")
    assert ev2.spec is not None and ev2.plan is not None
    assert placer.choose(second, ev2.spec, ev2.plan, 0) == {0: ("rack-0",), 1: ("rack-3",)}
    # The same attempt again (pods created after a refusal): the same domains.
    assert placer.choose(first, ev1.spec, ev1.plan, 0) == {0: ("rack-1",), 1: ("rack-2",)}
    # Once every pod of first is bound, its promise ends; its pods count as used instead.
    index[("ns", "first")] = bound("first", "u1", [f"r{r}n{i}" for r in (1, 2) for i in range(4)])
    assert "u1" in placer.promises
    third, ev3 = pipeline("third", 2, 1, "u3")
    assert ev3.spec is not None and ev3.plan is not None
    # second's promise still holds rack-0 and half of rack-3: the rest of rack-3 is left.
    assert placer.choose(third, ev3.spec, ev3.plan, 0) == {0: ("rack-3",)}
    assert "u1" not in placer.promises
    placer.forget("u2")
    placer.forget("u3")
    # Without those promises 6 nodes are free (2 in rack-0, 4 in rack-3): not room for 16.
    big, ev4 = pipeline("big", 16, 2, "u4")
    assert ev4.spec is not None and ev4.plan is not None
    assert placer.choose(big, ev4.spec, ev4.plan, 0) is None
    # A CPU job asks no accelerators: nothing to count, no choice.
    cpu, ev5 = pipeline("cpu", 2, 1, "u5", accelerator="cpu")
    assert ev5.spec is not None and ev5.plan is not None
    assert placer.choose(cpu, ev5.spec, ev5.plan, 0) is None
