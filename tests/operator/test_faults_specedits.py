"""On the real control plane: spec edits while a job runs, and an operator upgrade with stricter
rules.

An accepted edit takes effect at the next attempt (the SpecUpdate condition says so,
observedGeneration and attemptGeneration tell which generation is seen and which runs); an edit
the planner refuses never fails the running attempt. A job an older operator started, whose spec
this operator's rules refuse, keeps running to the end.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from faults_support import deleted_leaves_nothing, merge_patch, one_pod_per_index, wait_condition
from meshrun_operator import names
from operator_harness import Cluster, OperatorProcess, job_manifest, wait_seconds
from waiting import wait_for

from meshrun.api.crd import API_VERSION, KIND, PLURAL

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]


def steps_of(pod: dict[str, Any]) -> str:
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    return str(json.loads(str(env["MESHRUN_JOB"]))["spec"]["training"]["steps"])


def test_edits_take_effect_at_the_next_attempt_and_never_fail_a_running_job(
    cluster: Cluster, operator_process: OperatorProcess
) -> None:
    cluster.apply(job_manifest("edited"))
    first = cluster.wait_running_pods("edited", 2)
    cluster.wait_phase("edited", "Running")
    uids = {p["metadata"]["uid"] for p in first}

    merge_patch(cluster, PLURAL, "edited", {"spec": {"training": {"steps": 20}}})
    wait_condition(cluster, "edited", "SpecUpdate", reason="NextAttempt")
    status = cluster.status("edited")
    assert status["observedGeneration"] == 2 and status["attemptGeneration"] == 1
    assert status["phase"] == "Running" and status["restarts"] == 0
    pods = cluster.live_pods("edited")
    assert {p["metadata"]["uid"] for p in pods} == uids and {steps_of(p) for p in pods} == {"10"}

    # The next attempt runs the edit.
    cluster.finish("edited-1", "Failed", exit_code=137)
    second = cluster.wait_running_pods("edited", 2, attempt=1)
    assert {steps_of(p) for p in second} == {"20"}
    status = cluster.wait_phase("edited", "Running")
    assert status["attemptGeneration"] == 2 and status["restarts"] == 1
    assert cluster.condition("edited", "SpecUpdate")["status"] == "False"

    # The API server accepts 18 (a multiple of microBatchSize 2); the planner refuses it
    # (dataParallel 8 x microBatchSize 2 does not divide it). The running attempt goes on.
    merge_patch(cluster, PLURAL, "edited", {"spec": {"training": {"globalBatchSize": 18}}})
    refused = wait_condition(cluster, "edited", "SpecUpdate", reason="RefusedWhileRunning")
    assert "spec.training.globalBatchSize" in refused["message"]
    wait_seconds(2)
    status = cluster.status("edited")
    assert status["phase"] == "Running" and status["restarts"] == 1
    assert status["observedGeneration"] == 3 and status["attemptGeneration"] == 2
    assert cluster.condition("edited", "Invalid").get("status") != "True"
    one_pod_per_index(cluster, "edited", 2, attempt=1)

    for pod in ("edited-0", "edited-1"):
        cluster.finish(pod, "Succeeded")
    status = cluster.wait_phase("edited", "Succeeded")
    assert status["restarts"] == 1 and status["attempt"] == 1
    deleted_leaves_nothing(cluster, "edited")


def old_operator_pod(job: dict[str, Any], index: int) -> dict[str, Any]:
    """A pod as an older operator built it (its labels and owner)."""
    name = job["metadata"]["name"]
    owner = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": name,
        "uid": job["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    labels = {
        names.LABEL_JOB: name,
        names.LABEL_POD_INDEX: str(index),
        names.LABEL_ATTEMPT: "0",
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"{name}-{index}", "labels": labels, "ownerReferences": [owner]},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "trainer", "image": "meshrun/trainer:test"}],
        },
    }


def test_an_upgrade_with_stricter_rules_never_fails_a_running_job(
    cluster: Cluster, kubeconfig: str, namespace: str, crds_installed: list[str], tmp_path: Path
) -> None:
    # An older operator started this job; this one's planner refuses its batch (dataParallel 8 x
    # microBatchSize 2 does not divide 18; the API server's rules accept it).
    name = "upgraded"
    cluster.apply(
        job_manifest(name, training={"steps": 10, "globalBatchSize": 18, "microBatchSize": 2})
    )
    job = cluster.job(name)
    for index in (0, 1):
        pod = json.dumps(old_operator_pod(job, index))
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=pod)
    running = wait_for(
        lambda: (
            len(ps := [p for p in cluster.pods(name) if p["status"].get("phase") == "Running"]) == 2
            and ps
        ),
        60,
        "the older operator's pods running",
    )
    uids = {p["metadata"]["uid"] for p in running}
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    old_status = {
        "phase": "Running",
        "attempt": 0,
        "restarts": 0,
        "startTime": started,
        "attemptStartTime": started,
        "activeSince": started,
        "gangRetries": 0,
        "message": "all pods are running",
        "observedGeneration": 1,
    }
    merge_patch(cluster, PLURAL, name, {"status": old_status}, "--subresource=status")
    operator = OperatorProcess(kubeconfig, namespace, tmp_path).start()
    try:
        refused = wait_condition(cluster, name, "SpecUpdate", reason="RefusedWhileRunning")
        assert refused["message"].startswith("spec.training.globalBatchSize:")
        wait_seconds(2)
        status = cluster.status(name)
        assert status["phase"] == "Running" and status["restarts"] == 0
        assert cluster.condition(name, "Invalid").get("status") != "True"
        assert {p["metadata"]["uid"] for p in cluster.live_pods(name)} == uids
        one_pod_per_index(cluster, name, 2, attempt=0)
        for index in (0, 1):
            cluster.finish(f"{name}-{index}", "Succeeded")
        status = cluster.wait_phase(name, "Succeeded")
        assert status["restarts"] == 0
        deleted_leaves_nothing(cluster, name)
    finally:
        operator.stop()
