"""On the real control plane: partial creation and children the API server refuses.

A failing admission webhook answers 500 for some pods, the operator is killed while the gang is
half created, and a new operator creates only the missing pods (no restart counted). A
ResourceQuota admits only part of a gang until it is raised. PodSecurity admission refuses every
pod of a job. Each refusal reaches the job as the CreationRefused condition and a Warning Event
naming the cause, the phase says the job is Pending, and the retries back off.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from faults_support import deleted_leaves_nothing, events_of, one_pod_per_index, wait_condition
from meshrun_operator import names
from operator_harness import Cluster, Kubectl, OperatorProcess, job_manifest, wait_seconds
from waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

FOUR = {
    "resources": {"numNodes": 4, "numProcPerNode": 4},
    "training": {"steps": 10, "globalBatchSize": 32, "microBatchSize": 2},
}


@pytest.fixture
def failing_webhook(kubectl: Kubectl, namespace: str) -> Iterator[str]:
    """A pod webhook that cannot be reached (failurePolicy Fail): the API server answers 500 to
    creates of pods 2 and 3 of the test's namespace. Yields its name (delete it to heal)."""
    name = f"meshrun-test-{uuid.uuid4().hex[:8]}"
    label = f"meshrun-test-webhook-{name}"
    kubectl("label", "namespace", namespace, f"{label}=on")
    webhook = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [
            {
                "name": "refuse.meshrun.dev",
                "clientConfig": {"url": "https://127.0.0.1:9/refuse"},
                "rules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE"],
                        "resources": ["pods"],
                    }
                ],
                "namespaceSelector": {"matchLabels": {label: "on"}},
                "objectSelector": {
                    "matchExpressions": [
                        {"key": names.LABEL_POD_INDEX, "operator": "In", "values": ["2", "3"]}
                    ]
                },
                "failurePolicy": "Fail",
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "timeoutSeconds": 2,
            }
        ],
    }
    kubectl("apply", "-f", "-", input=json.dumps(webhook))
    yield name
    kubectl("delete", "validatingwebhookconfiguration", name, "--ignore-not-found")


def test_a_5xx_and_a_killed_operator_leave_a_half_gang_that_is_completed_later(
    cluster: Cluster,
    failing_webhook: str,
    kubeconfig: str,
    namespace: str,
    crds_installed: list[str],
    tmp_path: Path,
) -> None:
    first = OperatorProcess(kubeconfig, namespace, tmp_path).start()
    try:
        cluster.apply(job_manifest("half", **FOUR))
        refused = wait_condition(cluster, "half", "CreationRefused", reason="ServerError")
        assert "half-2" in refused["message"]
        assert "failed calling webhook" in refused["message"]
        status = cluster.status("half")
        assert status["phase"] == "Pending" and status["restarts"] == 0
        assert "retrying at" in status["message"]
        # The Event is posted after the status that carries the condition: awaited.
        warnings = cluster.wait_events("half", "ServerError")
        assert warnings[0]["type"] == "Warning", warnings
        before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in cluster.pods("half")}
        assert sorted(before) == ["half-0", "half-1"]
        # The operator dies with the gang half created; the API server heals meanwhile.
        first.kill()
    finally:
        first.stop()
    cluster.kubectl("delete", "validatingwebhookconfiguration", failing_webhook)
    second = OperatorProcess(kubeconfig, namespace, tmp_path).start()
    try:
        cluster.wait_running_pods("half", 4)
        status = cluster.wait_phase("half", "Running")
        assert status["restarts"] == 0 and status["attempt"] == 0
        pods = one_pod_per_index(cluster, "half", 4, attempt=0)
        for pod in pods:  # the pods created before the crash were kept
            name = pod["metadata"]["name"]
            if name in before:
                assert pod["metadata"]["uid"] == before[name]
        assert cluster.condition("half", "CreationRefused")["status"] == "False"
        deleted_leaves_nothing(cluster, "half")
    finally:
        second.stop()


def quota(namespace: str, pods: int) -> str:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": "pods", "namespace": namespace},
            "spec": {"hard": {"pods": str(pods)}},
        }
    )


def test_a_quota_admits_part_of_the_gang_until_it_is_raised(
    cluster: Cluster, operator_process: OperatorProcess
) -> None:
    cluster.kubectl("apply", "-f", "-", input=quota(cluster.ns, 2))
    wait_for(
        lambda: (
            cluster.kubectl(
                "get",
                "resourcequota",
                "pods",
                "-n",
                cluster.ns,
                "-o",
                "jsonpath={.status.hard.pods}",
            ).stdout
            == "2"
        ),
        30,
        "the quota controller to account the quota",
    )
    cluster.apply(job_manifest("quota", **FOUR))
    refused = wait_condition(cluster, "quota", "CreationRefused", reason="QuotaExceeded")
    assert "exceeded quota" in refused["message"]
    status = cluster.status("quota")
    assert status["phase"] == "Pending" and status["restarts"] == 0
    assert len(cluster.pods("quota")) == 2
    warning = cluster.wait_events("quota", "QuotaExceeded")[0]  # posted after the status
    assert warning["type"] == "Warning" and "exceeded quota" in warning["message"]

    cluster.kubectl("apply", "-f", "-", input=quota(cluster.ns, 10))
    cluster.wait_running_pods("quota", 4, timeout=60)
    status = cluster.wait_phase("quota", "Running")
    assert status["restarts"] == 0 and status["attempt"] == 0
    one_pod_per_index(cluster, "quota", 4, attempt=0)
    assert cluster.condition("quota", "CreationRefused")["reason"] == "Created"
    deleted_leaves_nothing(cluster, "quota")


def test_podsecurity_refusal_is_a_condition_and_one_warning_not_a_silent_loop(
    cluster: Cluster, kubeconfig: str, namespace: str, tmp_path: Path
) -> None:
    # The operator lets every template through (its job pod policy would refuse hostNetwork
    # itself, test_cluster_ownership.py): the namespace's PodSecurity admission judges.
    extra = ["--job-pod-policy", "privileged"]
    operator = OperatorProcess(kubeconfig, namespace, tmp_path, extra=extra).start()
    try:
        refused_by_admission(cluster)
    finally:
        operator.stop()
        print(f"--- operator log ---\n{operator.log_tail(40)}")


def refused_by_admission(cluster: Cluster) -> None:
    cluster.kubectl(
        "label", "namespace", cluster.ns, "pod-security.kubernetes.io/enforce=restricted"
    )
    cluster.apply(job_manifest("hostnet", podTemplate={"spec": {"hostNetwork": True}}))
    refused = wait_condition(cluster, "hostnet", "CreationRefused", reason="PodSecurity")
    assert "violates PodSecurity" in refused["message"]
    assert "hostNetwork" in refused["message"]
    wait_seconds(4)  # several retries (backoff 1-2 s): still one Warning, still no pod
    status = cluster.status("hostnet")
    assert status["phase"] == "Pending" and status["restarts"] == 0
    assert "the API server refused" in status["message"]
    assert cluster.pods("hostnet") == []
    warnings = events_of(cluster, "hostnet", "PodSecurity")
    assert len(warnings) == 1 and warnings[0]["type"] == "Warning", warnings
    deleted_leaves_nothing(cluster, "hostnet")
