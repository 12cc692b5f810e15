"""On the real control plane: operator crashes, lost nodes, and the operator's own endpoints."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from meshrun_operator import names
from operator_harness import (
    Cluster,
    OperatorProcess,
    http_get,
    job_manifest,
    on_node,
    wait_seconds,
)
from waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]


def test_operator_killed_mid_creation_leaves_no_duplicates_or_orphans(
    cluster: Cluster, kubeconfig: str, namespace: str, crds_installed: list[str], tmp_path: Path
) -> None:
    first = OperatorProcess(kubeconfig, namespace, tmp_path).start()
    try:
        cluster.apply(
            job_manifest(
                "crash",
                resources={"numNodes": 6, "numProcPerNode": 4},
                training={"steps": 10, "globalBatchSize": 48, "microBatchSize": 2},
            )
        )
        # Kill it as soon as the first pod exists: creation is (very likely) half done.
        wait_for(lambda: cluster.pods("crash"), 60, "the first pod of job crash")
        first.kill()
        before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in cluster.pods("crash")}
    finally:
        first.stop()
    second = OperatorProcess(kubeconfig, namespace, tmp_path).start()
    try:
        pods = cluster.wait_running_pods("crash", 6)
        cluster.wait_phase("crash", "Running")
        assert sorted(p["metadata"]["name"] for p in pods) == [f"crash-{i}" for i in range(6)]
        assert len(cluster.pods("crash")) == 6, "duplicate or orphan pods"
        for pod in pods:  # pods created before the crash were kept, not recreated
            name = pod["metadata"]["name"]
            if name in before:
                assert pod["metadata"]["uid"] == before[name]
        assert cluster.status("crash")["restarts"] == 0
        # A second restart of a healthy job changes nothing at all.
        uids = {p["metadata"]["uid"] for p in pods}
        second.stop()
        second = OperatorProcess(kubeconfig, namespace, tmp_path).start()
        wait_seconds(3)
        assert {p["metadata"]["uid"] for p in cluster.pods("crash")} == uids
    finally:
        second.stop()


@pytest.mark.parametrize("how", ["not-ready", "deleted"])
def test_a_lost_node_force_deletes_its_pods_and_restarts_the_gang(
    how: str, cluster: Cluster, private_node: str, operator_process: OperatorProcess
) -> None:
    cluster.apply(
        job_manifest(
            "lost",
            podTemplate=on_node(private_node),
            resources={"numNodes": 2, "numProcPerNode": 2},
        )
    )
    cluster.wait_running_pods("lost", 2)
    cluster.wait_phase("lost", "Running")
    if how == "not-ready":
        cluster.annotate("node", private_node, "sim.meshrun.dev/node-down=true", namespaced=False)
    else:
        cluster.kubectl("delete", "node", private_node, "--wait=false")
    wait_for(
        lambda: cluster.status("lost").get("disruptions", 0) >= 1,
        60,
        f"a gang restart after the node was {how}",
    )
    assert cluster.condition("lost", "Restarting")["reason"] == "NodeLost"
    # The node failed, not the job: a disruption, backoffLimit untouched.
    assert cluster.status("lost").get("restarts", 0) == 0
    # Force deletion: the old pods vanish although no kubelet confirms it.
    wait_for(
        lambda: all(
            p["metadata"]["labels"][names.LABEL_ATTEMPT] != "0" for p in cluster.pods("lost")
        ),
        60,
        "attempt-0 pods gone",
    )


def test_healthz_and_metrics(cluster: Cluster, operator_process: OperatorProcess) -> None:
    # The resync loop runs from the operator's start (kopf's startup handler), before any job.
    idle = http_get(f"http://127.0.0.1:{operator_process.health_port}/healthz") or ""
    assert '"resync"' in idle, idle
    cluster.apply(job_manifest("metered"))
    cluster.wait_phase("metered", "Running")
    text = wait_for(
        lambda: (
            (m := operator_process.metrics())
            and 'meshrun_operator_jobs{phase="Running"} 1.0' in m
            and m
        ),
        30,
        "jobs gauge showing one Running job",
    )
    created = re.search(r"^meshrun_operator_pods_created_total (\S+)$", text, re.M)
    assert created is not None and float(created.group(1)) == 2.0
    assert "meshrun_operator_reconcile_seconds_count" in text
    assert 'meshrun_operator_api_requests_total{resource="pods",verb="create"} 2.0' in text
    # kopf's watch streams are followed too: the jobs' and their pods' are running. (kopf keeps
    # the probes' answer for 10 s, so the idle one above may still be served for a while.)
    health = wait_for(
        lambda: (
            (h := http_get(f"http://127.0.0.1:{operator_process.health_port}/healthz"))
            and "paralleltrainingjobs" in h
            and h
        ),
        30,
        "/healthz listing the jobs' watcher",
    )
    assert '"resync"' in health and '"watchers"' in health, health
