"""On the real control plane: nodes that blip, die, or are cut off.

The job's pods run on a fake node whose KWOK controller belongs to the test. A NotReady blip
shorter than the operator's toleration kills nothing. When the node stays NotReady and its
controller is frozen (a dead or partitioned kubelet: nothing will ever confirm a graceful
deletion), the operator restarts the gang, force-deletes the old pods, and creates their
replacements only once the old pod objects are gone, so a pod and its replacement never exist
side by side.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from faults_support import FreezableNode, deleted_leaves_nothing, one_pod_per_index
from meshrun_operator import names
from operator_harness import Cluster, Kubectl, OperatorProcess, job_manifest, on_node
from waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

TOLERATION = 8.0
"""Seconds a NotReady node is tolerated: the blip below (two kubectl calls around a 2 s pause)
must fit in it on a loaded machine, with room to spare."""


@pytest.fixture
def node(kubectl: Kubectl, kubeconfig: str, tmp_path: Path) -> Iterator[FreezableNode]:
    lossy = FreezableNode(
        kubectl, kubeconfig, f"lossy-{uuid.uuid4().hex[:8]}", tmp_path / "kwok.log"
    )
    yield lossy
    lossy.close()


def test_a_blip_kills_nothing_and_a_lost_node_is_replaced_without_overlap(
    cluster: Cluster,
    node: FreezableNode,
    kubeconfig: str,
    namespace: str,
    crds_installed: list[str],
    tmp_path: Path,
) -> None:
    flags = ["--node-toleration-seconds", str(TOLERATION)]
    operator = OperatorProcess(kubeconfig, namespace, tmp_path, flags).start()
    try:
        cluster.apply(
            job_manifest(
                "lossy",
                podTemplate=on_node(node.name),
                resources={"numNodes": 2, "numProcPerNode": 2},
            )
        )
        pods = cluster.wait_running_pods("lossy", 2)
        cluster.wait_phase("lossy", "Running")
        uids = {p["metadata"]["uid"] for p in pods}

        # A blip shorter than the toleration: nothing is deleted, nothing restarts.
        blip = time.monotonic()
        node.down()
        time.sleep(2)
        node.up()
        assert time.monotonic() - blip < TOLERATION
        time.sleep(TOLERATION)  # past the toleration as counted from the blip's start
        status = cluster.status("lossy")
        assert status["phase"] == "Running" and status["restarts"] == 0, status
        assert {p["metadata"]["uid"] for p in cluster.live_pods("lossy")} == uids

        # Lost: NotReady for good and nothing confirms a deletion.
        node.down()
        node.freeze()
        lost = time.monotonic()
        seen: list[set[str]] = []

        def replaced() -> bool:
            attempts = {p["metadata"]["labels"][names.LABEL_ATTEMPT] for p in cluster.pods("lossy")}
            seen.append(attempts)
            return attempts == {"1"}

        wait_for(replaced, 60, "the old pods force-deleted and replaced", interval=0.1)
        took = time.monotonic() - lost
        assert took >= TOLERATION - 1, f"the pods were given up after {took:.1f}s"
        # Old and new pods were never there together (names are unique only per object).
        assert all(len(attempts) <= 1 for attempts in seen), seen
        status = cluster.status("lossy")
        assert (status["restarts"], status["disruptions"], status["attempt"]) == (0, 1, 1)
        assert cluster.condition("lossy", "Restarting")["reason"] == "NodeLost"

        # The node comes back: the new gang runs there.
        node.thaw()
        node.up()
        cluster.wait_running_pods("lossy", 2, attempt=1)
        status = cluster.wait_phase("lossy", "Running")
        assert (status["restarts"], status["disruptions"], status["attempt"]) == (0, 1, 1)
        one_pod_per_index(cluster, "lossy", 2, attempt=1)
        deleted_leaves_nothing(cluster, "lossy")
    finally:
        operator.stop()
