"""On the real control plane: disruptions are not failures, and the failure policy decides.

``kubectl drain`` (the Eviction API) and a preemption by the scheduler take a job's pods away
with a DisruptionTarget condition: the gang restarts without touching backoffLimit (0 here). A
podFailurePolicy turns exit codes into a counted restart, an uncounted one, or the end of the job.
"""

from __future__ import annotations

import json
import uuid

import pytest
from faults_support import deleted_leaves_nothing, one_pod_per_index
from operator_harness import Cluster, Kubectl, OperatorProcess, job_manifest, on_node
from waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]


def start_pinned(cluster: Cluster, name: str, node: str) -> None:
    """A job on ``node`` with backoffLimit 0, running."""
    cluster.apply(job_manifest(name, podTemplate=on_node(node), runPolicy={"backoffLimit": 0}))
    cluster.wait_running_pods(name, 2)
    cluster.wait_phase(name, "Running")


def disrupted(cluster: Cluster, job: str) -> None:
    """The gang was restarted once, uncounted."""
    status = wait_for(
        lambda: (s := cluster.status(job)).get("disruptions") == 1 and s,
        60,
        f"job {job} restarted by the disruption",
    )
    assert status["restarts"] == 0 and status["attempt"] == 1
    assert status["lastFailure"]["class"] == "Ignored"
    # The restart's Event is posted after the status that counts it: awaited.
    cluster.wait_events(job, status["lastFailure"]["reason"])


def runs_again_uncounted(cluster: Cluster, job: str) -> None:
    """Once the node has room again the new attempt runs; the end of every fault test."""
    cluster.wait_running_pods(job, 2, attempt=1)
    status = cluster.wait_phase(job, "Running")
    assert (status["restarts"], status["disruptions"], status["attempt"]) == (0, 1, 1)
    one_pod_per_index(cluster, job, 2, attempt=1)
    deleted_leaves_nothing(cluster, job)


def test_a_drain_restarts_the_gang_without_counting(
    cluster: Cluster, private_node: str, operator_process: OperatorProcess
) -> None:
    start_pinned(cluster, "drained", private_node)
    cluster.kubectl(
        "drain", private_node, "--delete-emptydir-data", "--ignore-daemonsets", "--timeout=60s"
    )
    disrupted(cluster, "drained")
    assert cluster.status("drained")["lastFailure"]["reason"] == "Disrupted"
    assert "EvictionByEvictionAPI" in cluster.status("drained")["lastFailure"]["message"]
    cluster.kubectl("uncordon", private_node)
    runs_again_uncounted(cluster, "drained")


def test_a_preemption_restarts_the_gang_without_counting(
    cluster: Cluster, kubectl: Kubectl, private_node: str, operator_process: OperatorProcess
) -> None:
    start_pinned(cluster, "preempted", private_node)
    priority = f"meshrun-test-{uuid.uuid4().hex[:8]}"
    kubectl(
        "apply",
        "-f",
        "-",
        input=json.dumps(
            {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": priority},
                "value": 1000000,
            }
        ),
    )
    try:
        template = on_node(private_node)["spec"]
        preemptor = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "preemptor", "namespace": cluster.ns},
            "spec": {
                **template,
                "priorityClassName": priority,
                "containers": [
                    {
                        "name": "big",
                        "image": "meshrun/trainer:test",
                        "resources": {"limits": {"nvidia.com/gpu": "8"}},
                    }
                ],
            },
        }
        cluster.kubectl("apply", "-f", "-", input=json.dumps(preemptor))
        disrupted(cluster, "preempted")
        assert "PreemptionByScheduler" in cluster.status("preempted")["lastFailure"]["message"]
        cluster.kubectl("delete", "pod", "preemptor", "-n", cluster.ns, "--wait=true")
    finally:
        kubectl("delete", "priorityclass", priority, "--ignore-not-found")
    runs_again_uncounted(cluster, "preempted")


def test_the_failure_policy_decides_by_exit_code(
    cluster: Cluster, operator_process: OperatorProcess
) -> None:
    rules = [
        {"action": "RestartJob", "onExitCodes": {"operator": "In", "values": [42]}},
        {"action": "Ignore", "onExitCodes": {"operator": "In", "values": [7]}},
        {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [1]}},
    ]
    cluster.apply(
        job_manifest("policy", runPolicy={"backoffLimit": 1, "podFailurePolicy": {"rules": rules}})
    )
    cluster.wait_running_pods("policy", 2)
    # 42 (permanent by the built-in table): a counted restart.
    cluster.finish("policy-1", "Failed", exit_code=42)
    cluster.wait_running_pods("policy", 2, attempt=1)
    status = cluster.wait_phase("policy", "Running")
    assert (status["restarts"], status["disruptions"]) == (1, 0)
    # 7: restarted without counting, although backoffLimit 1 is used up.
    cluster.finish("policy-0", "Failed", exit_code=7)
    cluster.wait_running_pods("policy", 2, attempt=2)
    status = cluster.wait_phase("policy", "Running")
    assert (status["restarts"], status["disruptions"]) == (1, 1)
    one_pod_per_index(cluster, "policy", 2, attempt=2)
    # 1 (retryable by the built-in table): the job fails at once.
    cluster.finish("policy-1", "Failed", exit_code=1)
    status = cluster.wait_phase("policy", "Failed")
    assert (status["restarts"], status["disruptions"], status["attempt"]) == (1, 1, 2)
    failed = cluster.condition("policy", "Failed")
    assert failed["reason"] == "Error" and "podFailurePolicy rule 2: FailJob" in failed["message"]
    deleted_leaves_nothing(cluster, "policy")
