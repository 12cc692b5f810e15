"""On the real node: pods that never start end the job within the start timeout.

A real kubelet reports ErrImagePull / ImagePullBackOff for an image that exists nowhere, and
CreateContainerConfigError for a root image under the restricted security context the operator
gives every pod (runAsNonRoot). Neither job sits in "pods are starting" holding its node: each
fails with the waiting reason in its Failed condition and a Warning Event, and its pods go.
Before that, from the first pass, the job's message and its Running condition name the waiting
pod with the kubelet's reason and words.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from faults_support import deleted_leaves_nothing
from operator_harness import Cluster, OperatorProcess, job_manifest
from waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

REAL_NODE = "meshrun.dev/real-node"
BASE_IMAGE = "meshrun.local/debian:bookworm"  # hack/realnode/images.sh: imported, runs as root
START_FAILURE_SECONDS = 5


def on_real_node(name: str, image: str, pull: str) -> dict[str, Any]:
    return job_manifest(
        name,
        image=image,
        resources={"numNodes": 1, "numProcPerNode": 1, "accelerator": "cpu"},
        training={"steps": 10, "globalBatchSize": 2, "microBatchSize": 2},
        podTemplate={
            "spec": {
                "nodeSelector": {REAL_NODE: "true"},
                "tolerations": [
                    {"key": REAL_NODE, "operator": "Equal", "value": "true", "effect": "NoSchedule"}
                ],
                "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "trainer", "imagePullPolicy": pull}],
            }
        },
    )


def test_pods_that_never_start_end_the_job_with_the_reason(
    cluster: Cluster,
    real_node: str,
    kubeconfig: str,
    namespace: str,
    crds_installed: list[str],
    tmp_path: Path,
) -> None:
    flags = ["--start-failure-seconds", str(START_FAILURE_SECONDS)]
    operator = OperatorProcess(kubeconfig, namespace, tmp_path, flags).start()
    try:
        cluster.apply(on_real_node("nopull", "meshrun.local/absent:1", "IfNotPresent"))
        cluster.apply(on_real_node("rootimage", BASE_IMAGE, "Never"))
        expected = {
            "nopull": ({"ErrImagePull", "ImagePullBackOff"}, "meshrun.local/absent"),
            "rootimage": ({"CreateContainerConfigError"}, "runAsNonRoot"),
        }
        for job, (reasons, words) in expected.items():
            status = cluster.wait_phase(job, "Failed", timeout=120)
            assert status["restarts"] == 0 and status["attempt"] == 0
            failed = cluster.condition(job, "Failed")
            # The real kubelet's waiting reason and words reach the condition.
            assert failed["reason"] in reasons, failed
            assert f"{job}-0" in failed["message"] and "cannot start" in failed["message"]
            assert words in failed["message"], failed["message"]
            assert status["lastFailure"]["pod"] == f"{job}-0"
            # The Event is posted after the status that says Failed: awaited.
            failed_events = cluster.wait_events(job, "Failed")
            assert any(
                e["type"] == "Warning" and "cannot start" in e["message"] for e in failed_events
            ), failed_events
            # One pod, created once, and the real node's kubelet reported on it.
            created = [e["message"] for e in cluster.events(job) if e["reason"] == "PodsCreated"]
            assert created == ["creating 1 pod(s) for attempt 0"]
            kubelet = {e.get("source", {}).get("host") for e in cluster.events(f"{job}-0")}
            assert real_node in kubelet, kubelet
            # Given up within the start timeout (and a few resyncs), not left holding the node.
            started = datetime.fromisoformat(status["attemptStartTime"])
            ended = datetime.fromisoformat(status["completionTime"])
            assert (ended - started).total_seconds() <= START_FAILURE_SECONDS + 30
            wait_for(lambda job=job: not cluster.live_pods(job), 60, f"the pods of {job} gone")
            deleted_leaves_nothing(cluster, job)
    finally:
        operator.stop()


@pytest.fixture
def patient_operator(
    kubeconfig: str, namespace: str, crds_installed: list[str], tmp_path: Path
) -> Iterator[OperatorProcess]:
    """An operator whose start timeout is far away: what a job says while it waits."""
    flags = ["--start-failure-seconds", "600"]
    operator = OperatorProcess(kubeconfig, namespace, tmp_path, flags).start()
    yield operator
    operator.stop()


def test_the_job_says_at_once_which_pod_waits_and_why(
    cluster: Cluster, real_node: str, patient_operator: OperatorProcess
) -> None:
    cluster.apply(on_real_node("pulling", "meshrun.local/absent:2", "IfNotPresent"))

    def running_condition(status: dict[str, Any]) -> dict[str, Any]:
        found = [c for c in status.get("conditions") or [] if c.get("type") == "Running"]
        return found[0] if found else {}

    def told() -> dict[str, Any] | None:
        # The condition and the message from one read of the status: the kubelet's reason
        # goes back and forth between ErrImagePull and ImagePullBackOff as it retries.
        status = cluster.status("pulling")
        running = running_condition(status)
        waits = running.get("reason") in ("ErrImagePull", "ImagePullBackOff")
        return status if waits and running.get("status") == "False" else None

    status = wait_for(
        told,
        60,
        "the job naming the pod that cannot pull its image",
        describe=lambda: {k: v for k, v in cluster.status("pulling").items() if k != "plan"},
    )
    running = running_condition(status)
    assert running["message"].startswith("pod pulling-0: container trainer: ")
    assert "meshrun.local/absent:2" in running["message"]
    assert status["phase"] == "Pending" and status["restarts"] == 0
    assert status["message"].startswith(f"pod pulling-0 waits: {running['reason']}: ")
    assert "meshrun.local/absent:2" in status["message"]
    assert "Failed" not in {c["type"] for c in status.get("conditions") or []}
    deleted_leaves_nothing(cluster, "pulling")


def test_an_unschedulable_gang_quotes_the_scheduler(
    cluster: Cluster, operator_process: OperatorProcess
) -> None:
    nowhere = {"spec": {"nodeSelector": {"meshrun.dev/no-such-pool": "true"}}}
    cluster.apply(job_manifest("nowhere", podTemplate=nowhere))

    def told() -> dict[str, Any] | None:
        scheduled = cluster.condition("nowhere", "Scheduled")
        return scheduled if scheduled.get("reason") == "Unschedulable" else None

    scheduled = wait_for(told, 60, "the job quoting the scheduler")
    assert scheduled["status"] == "False"
    # The first pod the scheduler has spoken about, in its own words.
    said = r"pod nowhere-[01]: Unschedulable: 0/\d+ nodes are available: .*node affinity/selector"
    assert re.match(rf"0 of 2 pods bound; {said}", scheduled["message"]), scheduled["message"]
    status = cluster.status("nowhere")
    assert re.match(rf"2 pod\(s\) not scheduled yet; {said}", status["message"]), status["message"]
    assert status["phase"] == "Pending" and status["gangRetries"] == 0
    deleted_leaves_nothing(cluster, "nowhere")
