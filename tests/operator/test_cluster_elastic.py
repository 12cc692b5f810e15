"""On the real control plane with KWOK nodes: an elastic job loses a node, shrinks, grows back.

Two private KWOK nodes of 8 GPUs (a pool of this test alone: its own label and taint) run a
job of 2 pods x 8 GPUs (DDP, dp16, elastic down to dp8). One node is deleted with no spare:
the gang restarts (NodeLost, a disruption: no restart counted), its second pod cannot be
scheduled, and within shrinkAfterSeconds plus one restart the job runs at dp8 on one pod. The
node comes back: after growAfterSeconds the job runs at dp16 on two pods again. No pod is
duplicated or left over.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from meshrun_operator import names
from operator_harness import Cluster, OperatorProcess, fake_node, job_manifest
from waiting import wait_for

from meshrun.jobdoc import JOB_VARIABLE, read_document

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

POOL = "meshrun.dev/test-pool"
SHRINK_AFTER, GROW_AFTER = 4, 4


def _pool_node(name: str, pool: str) -> dict[str, Any]:
    node = fake_node(name)
    node["metadata"]["labels"][POOL] = pool
    node["spec"]["taints"] = [{"key": POOL, "value": pool, "effect": "NoSchedule"}]
    return node


def _on_pool(pool: str) -> dict[str, Any]:
    return {
        "spec": {
            "nodeSelector": {POOL: pool},
            "tolerations": [{"key": POOL, "operator": "Equal", "value": pool}],
        }
    }


@pytest.fixture
def pool(cluster: Cluster) -> Iterator[tuple[str, list[str]]]:
    """Two Ready KWOK nodes of 8 GPUs each, in a pool of this test alone."""
    pool = f"elastic-{uuid.uuid4().hex[:8]}"
    nodes = [f"{pool}-a", f"{pool}-b"]
    for node in nodes:
        cluster.apply(_pool_node(node, pool))
    for node in nodes:
        _wait_ready(cluster, node)
    yield pool, nodes
    for node in nodes:
        cluster.kubectl("delete", "node", node, "--wait=false", check=False)


def _wait_ready(cluster: Cluster, node: str) -> None:
    ready = "jsonpath={.status.conditions[?(@.type=='Ready')].status}"
    wait_for(
        lambda: cluster.kubectl("get", "node", node, "-o", ready, check=False).stdout == "True",
        60,
        f"node {node} Ready",
    )


def _attempt_pods(cluster: Cluster, job: str) -> dict[str, list[str]]:
    """Live pod names by attempt label."""
    found: dict[str, list[str]] = {}
    for pod in cluster.live_pods(job):
        found.setdefault(pod["metadata"]["labels"][names.LABEL_ATTEMPT], []).append(
            pod["metadata"]["name"]
        )
    return found


def test_a_lost_node_shrinks_the_job_and_a_new_one_grows_it_back(
    cluster: Cluster, pool: tuple[str, list[str]], operator_process: OperatorProcess
) -> None:
    name, (node_a, node_b) = pool
    cluster.apply(
        job_manifest(
            "elastic",
            resources={"numNodes": 2, "numProcPerNode": 8, "accelerator": "nvidia.com/gpu"},
            training={"steps": 1000, "globalBatchSize": 16, "microBatchSize": 1},
            podTemplate=_on_pool(name),
            scheduling={"gangTimeoutSeconds": 120},
            elastic={
                "minDataParallel": 8,
                "shrinkAfterSeconds": SHRINK_AFTER,
                "growAfterSeconds": GROW_AFTER,
            },
        )
    )
    cluster.wait_running_pods("elastic", 2)
    status = cluster.wait_phase("elastic", "Running")
    assert status["dataParallel"] == 16 and status["layout"] == "dp16 x pp1 x tp1"

    # The node of pod 1 dies and no spare can take its pod.
    placed = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in cluster.pods("elastic")}
    lost = placed["elastic-1"]
    kept = node_a if lost == node_b else node_b
    cluster.kubectl("delete", "node", lost, "--wait=false")

    def job_status() -> dict[str, Any]:
        return {k: v for k, v in cluster.status("elastic").items() if k != "plan"}

    def shrunk() -> dict[str, Any] | None:
        s = cluster.status("elastic")
        return s if s.get("dataParallel") == 8 and s.get("phase") == "Running" else None

    # NodeLost after --node-toleration-seconds (3), a disruption, SHRINK_AFTER, one backoff.
    status = wait_for(shrunk, 90, "the job running at dp8", describe=job_status)
    assert status["layout"] == "dp8 x pp1 x tp1" and status["gpus"] == 8
    assert status["plan"]["dp"] == 16
    shrink = status["resizes"][-1]
    assert (shrink["fromDataParallel"], shrink["toDataParallel"], shrink["reason"]) == (
        16,
        8,
        "Shrink",
    )
    # The lost node and the shrink are disruptions; neither is a restart.
    assert (status["restarts"], status["disruptions"]) == (0, 2)
    pods = cluster.live_pods("elastic")
    assert [p["metadata"]["name"] for p in pods] == ["elastic-0"], "one pod at dp8"
    assert pods[0]["spec"]["nodeName"] == kept
    env = {e["name"]: e.get("value") for e in pods[0]["spec"]["containers"][0]["env"]}
    assert env["MESHRUN_DP"] == "8"
    # the same global batch: twice the accumulation, in the plan the trainer is handed
    assert read_document(env[JOB_VARIABLE]).plan.layout.grad_accumulation == 2
    assert env["WORLD_SIZE"] == "8"
    reasons = {e["reason"] for e in cluster.events("elastic")}
    assert "Shrink" in reasons

    # The node comes back: room for two pods again.
    cluster.apply(_pool_node(lost, name))
    _wait_ready(cluster, lost)

    def grown() -> dict[str, Any] | None:
        s = cluster.status("elastic")
        running = s.get("dataParallel") == 16 and s.get("phase") == "Running"
        return s if running and len(cluster.live_pods("elastic")) == 2 else None

    status = wait_for(grown, 90, "the job back at dp16", describe=job_status)
    assert status["resizes"][-1]["reason"] == "Grow" and status["disruptions"] == 3
    assert status["restarts"] == 0, "a resize is not a restart"
    assert status["layout"] == "dp16 x pp1 x tp1"
    by_attempt = _attempt_pods(cluster, "elastic")
    assert list(by_attempt.values()) == [["elastic-0", "elastic-1"]], by_attempt
    assert {p["spec"]["nodeName"] for p in cluster.live_pods("elastic")} == {node_a, node_b}
