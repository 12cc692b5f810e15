"""On the real API server: the status of the largest job the CRD admits stays well under the object
size limit, and a job's status is not written again when a pod event changes nothing in it."""

from __future__ import annotations

import asyncio
import json
import re
from datetime import UTC, datetime

import pytest
from meshrun_operator.lifecycle.decide import decide
from meshrun_operator.lifecycle.evaluation import evaluate
from meshrun_operator.seen.views import Observed, PodView
from operator_door import operator_kube
from operator_harness import Cluster, OperatorProcess, job_manifest, wait_seconds
from waiting import wait_for

from meshrun.api.crd import GROUP, PLURAL, VERSION

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

OBJECT_LIMIT = 1536 * 1024
"""etcd's default request limit (1.5 MiB): no object may be larger."""


def largest_num_nodes(cluster: Cluster) -> int:
    """spec.resources.numNodes' maximum, as the API server's CRD has it."""
    crd_name = f"{PLURAL}.{GROUP}"
    crd = json.loads(cluster.kubectl("get", "crd", crd_name, "-o", "json").stdout)
    version = next(v for v in crd["spec"]["versions"] if v["name"] == VERSION)
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return int(spec["properties"]["resources"]["properties"]["numNodes"]["maximum"])


def test_the_largest_job_the_crd_admits_keeps_its_status_small(
    cluster: Cluster, kubeconfig: str
) -> None:
    largest = largest_num_nodes(cluster)
    assert largest >= 65536
    cluster.apply(
        job_manifest(
            "largest",
            resources={"numNodes": largest, "numProcPerNode": 8},
            training={"steps": 10, "globalBatchSize": largest * 8, "microBatchSize": 1},
        )
    )
    body = cluster.job("largest")
    # Its pods as the operator sees them mid-launch, in racks of 3 nodes, one pod in 7 still
    # Pending: the worst case for compact rows, nothing lines up.
    pods = tuple(
        PodView(
            name=f"largest-{i}",
            index=i,
            attempt=0,
            phase="Pending" if i % 7 == 0 else "Running",
            node=f"node-{i}",
            owner_uid=body["metadata"]["uid"],
            uid=f"pod-{i}",
        )
        for i in range(largest)
    )
    observed = Observed(
        pods=pods,
        nodes={p.node: True for p in pods if p.node},
        domains={f"node-{i}": f"rack-{i // 3}" for i in range(largest)},
    )
    decision = decide(
        body, observed, datetime.now(UTC), evaluation=evaluate(body["spec"], "largest")
    )

    async def write() -> None:
        # The operator's own status write.
        async with operator_kube(kubeconfig) as kube:
            version = body["metadata"]["resourceVersion"]
            await kube.patch_status(cluster.ns, "largest", version, decision.status)

    asyncio.run(write())
    stored = cluster.kubectl("get", PLURAL, "largest", "-n", cluster.ns, "-o", "json").stdout
    status = json.loads(stored)["status"]
    assert status["plan"]["worldSize"] == largest * 8
    placement = status["placement"]
    # The API server kept the compact rows (its schema declares them), and they add up.
    assert 1 <= len(placement) <= 512, len(placement)
    assert sum(row["count"] for row in placement) == largest, placement[:3]
    assert {row["phase"] for row in placement} == {"Pending", "Running"}
    # Well under the limit: a sixteenth of it, the whole job object included.
    assert len(stored) < OBJECT_LIMIT // 16, len(stored)


def status_patches(process: OperatorProcess) -> float:
    pattern = (
        r'meshrun_operator_api_requests_total\{resource="paralleltrainingjobs/status",'
        r'verb="patch"\} ([0-9.e+]+)'
    )
    found = re.search(pattern, process.metrics())
    return float(found.group(1)) if found else 0.0


def test_a_pod_event_that_changes_nothing_in_the_status_writes_nothing(
    cluster: Cluster, operator_process: OperatorProcess
) -> None:
    cluster.apply(job_manifest("quiet"))
    cluster.wait_running_pods("quiet", 2)
    cluster.wait_phase("quiet", "Running")
    # Let the launch's last writes (the pods' placement, the Running condition) land.
    wait_for(lambda: stable(cluster, operator_process), 30, "the status settles")
    before, version = status_patches(operator_process), cluster.job("quiet")["metadata"]
    # Pod events that change nothing the status tells: each pod is labelled and annotated,
    # twice, and every such event wakes a reconcile of the job.
    for round in range(2):
        for pod in cluster.pods("quiet"):
            name = pod["metadata"]["name"]
            cluster.annotate("pod", name, f"test.meshrun.dev/touch=r{round}")
            label = f"touch=r{round}"
            cluster.kubectl("label", "pod", name, "-n", cluster.ns, label, "--overwrite")
    wait_seconds(3)
    after = cluster.job("quiet")["metadata"]
    assert status_patches(operator_process) == before, operator_process.log_tail()
    assert after["resourceVersion"] == version["resourceVersion"]
    # The operator did look: a pod's change that the status tells is written (one pod fails,
    # the gang restarts).
    cluster.kubectl("delete", "pod", "quiet-1", "-n", cluster.ns, "--wait=false")
    wait_for(lambda: status_patches(operator_process) > before, 30, "a status patch")


def stable(cluster: Cluster, process: OperatorProcess) -> bool:
    """Whether neither the status nor the operator's count of status patches moved for 2 s."""
    first = (status_patches(process), cluster.job("quiet")["metadata"]["resourceVersion"])
    wait_seconds(2)
    return first == (status_patches(process), cluster.job("quiet")["metadata"]["resourceVersion"])
