"""On the real control plane: invalid specs, suspend, deadlines, TTL and gang timeout."""

from __future__ import annotations

import json
from typing import Any

import pytest
from meshrun_operator import names
from operator_harness import Cluster, OperatorProcess, job_manifest, wait_seconds
from waiting import wait_established, wait_for

from meshrun.api.crd import PLURAL

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

PROGRESS_DEADLINE = "ProgressDeadlineExceeded"


def test_the_api_server_rejects_a_bad_spec_and_an_immutable_change(cluster: Cluster) -> None:
    bad = job_manifest("bad", runPolicy={"cleanPodPolicy": "Sometimes"})
    result = cluster.apply(bad, check=False)
    assert result.returncode != 0 and "cleanPodPolicy" in result.stderr

    cluster.apply(job_manifest("fixed"))
    changed = job_manifest("fixed", resources={"numNodes": 4, "numProcPerNode": 4})
    result = cluster.apply(changed, check=False)
    assert result.returncode != 0, "changing resources of an existing job must be refused"
    assert "resources" in result.stderr


def test_a_spec_accepted_but_impossible_gets_invalid_and_no_pods(
    cluster: Cluster, operator_process: OperatorProcess
) -> None:
    # The CRD's rules allow 3 data-parallel replicas of 8 ranks with only that degree given;
    # the planner finds no layout for it.
    name = "impossible"
    strategy = {"type": "hybrid", "dataParallel": 3}
    training = {"steps": 10, "globalBatchSize": 12, "microBatchSize": 2}
    cluster.apply(job_manifest(name, strategy=strategy, training=training))
    status = cluster.wait_phase(name, "Failed")
    invalid = cluster.condition(name, "Invalid")
    assert invalid["status"] == "True" and invalid["message"].startswith("spec.strategy:")
    assert status.get("placement", []) == []
    # The Event is posted after the status that says Failed: awaited.
    invalid_events = cluster.wait_events(name, "InvalidSpec")
    assert any(
        e["type"] == "Warning" and "spec.strategy" in e["message"] for e in invalid_events
    ), invalid_events
    assert cluster.pods(name) == []


def test_suspend_creates_nothing_and_resume_starts_the_gang(
    cluster: Cluster, operator_process: OperatorProcess
) -> None:
    cluster.apply(job_manifest("paused", runPolicy={"suspend": True}))
    cluster.wait_phase("paused", "Suspended")
    wait_seconds(2)  # several resyncs: still nothing may be created
    assert cluster.pods("paused") == []

    cluster.kubectl(
        "patch",
        PLURAL,
        "paused",
        "-n",
        cluster.ns,
        "--type=merge",
        "-p",
        '{"spec": {"runPolicy": {"suspend": false}}}',
    )
    cluster.wait_running_pods("paused", 2)
    cluster.wait_phase("paused", "Running")

    cluster.kubectl(
        "patch",
        PLURAL,
        "paused",
        "-n",
        cluster.ns,
        "--type=merge",
        "-p",
        '{"spec": {"runPolicy": {"suspend": true}}}',
    )
    cluster.wait_phase("paused", "Suspended")
    wait_for(lambda: cluster.pods("paused") == [], 30, "pods deleted on suspend")
    assert cluster.condition("paused", "Suspended")["status"] == "True"


def test_active_deadline_fails_the_job(cluster: Cluster, operator_process: OperatorProcess) -> None:
    cluster.apply(job_manifest("late", runPolicy={"activeDeadlineSeconds": 3}))
    cluster.wait_phase("late", "Failed", timeout=60)
    assert cluster.condition("late", "Failed")["reason"] == "DeadlineExceeded"
    wait_for(lambda: cluster.live_pods("late") == [], 30, "pods deleted after the deadline")


def test_no_progress_restarts_the_gang(cluster: Cluster, operator_process: OperatorProcess) -> None:
    policy = {"progressDeadlineSeconds": 3, "backoffLimit": 2}
    cluster.apply(job_manifest("hung", runPolicy=policy))
    cluster.wait_running_pods("hung", 2)

    def restarted() -> dict[str, Any] | None:
        # One read: the Restarting condition says why only until the new attempt runs (then
        # it is False with reason Recovered, a second or two after the restart).
        status = cluster.status("hung")
        conditions = {c.get("type"): c for c in status.get("conditions") or []}
        reason = (conditions.get("Restarting") or {}).get("reason")
        return status if status.get("restarts", 0) >= 1 and reason == PROGRESS_DEADLINE else None

    status = wait_for(
        restarted,
        60,
        "a restart after 3 s without progress, with its reason",
        describe=lambda: {k: v for k, v in cluster.status("hung").items() if k != "plan"},
    )
    assert status["lastFailure"]["reason"] == PROGRESS_DEADLINE, status["lastFailure"]


def test_ttl_deletes_the_finished_job_and_its_pods(
    cluster: Cluster, operator_process: OperatorProcess
) -> None:
    cluster.apply(job_manifest("brief", runPolicy={"ttlSecondsAfterFinished": 2}))
    cluster.wait_running_pods("brief", 2)
    for pod in ("brief-0", "brief-1"):
        cluster.finish(pod, "Succeeded")
    cluster.wait_phase("brief", "Succeeded")
    gone = cluster.kubectl
    wait_for(
        lambda: gone("get", PLURAL, "brief", "-n", cluster.ns, check=False).returncode != 0,
        60,
        "the job deleted by its TTL",
    )
    # The garbage collector removes the children through their owner references.
    wait_for(lambda: cluster.pods("brief") == [], 60, "pods garbage-collected with the job")


def test_gang_timeout_releases_a_partial_gang(
    cluster: Cluster, operator_process: OperatorProcess
) -> None:
    # Both pods want all 8 GPUs of the same node: one can be bound, the other never.
    template = {"spec": {"nodeSelector": {"kubernetes.io/hostname": "gpu-node-0007"}}}
    cluster.apply(
        job_manifest(
            "partial",
            resources={"numNodes": 2, "numProcPerNode": 8},
            podTemplate=template,
            training={"steps": 10, "globalBatchSize": 32, "microBatchSize": 2},
            scheduling={"gangTimeoutSeconds": 3},
        )
    )
    wait_for(
        lambda: cluster.condition("partial", "Scheduled").get("reason") == "GangTimeout",
        60,
        "Scheduled=False with reason GangTimeout",
    )
    status = cluster.status("partial")
    assert status["restarts"] == 0 and status["attempt"] >= 1
    assert status["phase"] == "Pending"
    # The event is posted after the condition is written.
    wait_for(
        lambda: any(e["reason"] == "GangTimeout" for e in cluster.events("partial")),
        30,
        "a GangTimeout event",
    )


def test_a_pod_template_the_api_server_refuses_becomes_invalid(
    cluster: Cluster, operator_process: OperatorProcess
) -> None:
    # The CRD's schema types the template (a quantity's form, not its sign): a negative limit
    # passes it, and the pod itself is what is refused.
    template = {
        "spec": {"containers": [{"name": "trainer", "resources": {"limits": {"cpu": "-1"}}}]}
    }
    cluster.apply(job_manifest("badpod", podTemplate=template))
    cluster.wait_phase("badpod", "Failed")
    invalid = cluster.condition("badpod", "Invalid")
    assert invalid["status"] == "True"
    assert invalid["message"].startswith("spec.podTemplate:"), invalid["message"]
    assert cluster.live_pods("badpod") == []


def test_a_missing_gang_scheduler_is_reported_and_pods_still_wait_for_it(
    cluster: Cluster, operator_process: OperatorProcess
) -> None:
    cluster.apply(job_manifest("volcano", scheduling={"schedulerName": "volcano"}))
    pods = wait_for(
        lambda: len(cluster.pods("volcano")) == 2 and cluster.pods("volcano"),
        60,
        "two pods for the volcano scheduler",
    )
    assert {p["spec"]["schedulerName"] for p in pods} == {"volcano"}
    assert all(
        p["metadata"]["annotations"][names.VOLCANO_GROUP_ANNOTATION] == "volcano" for p in pods
    )
    wait_for(
        lambda: any(
            e["reason"] == "PodGroupUnavailable" and e["type"] == "Warning"
            for e in cluster.events("volcano")
        ),
        30,
        "a PodGroupUnavailable Warning",
    )
    # A launch in progress is written within the status interval (10 s), not at every step.
    cluster.wait_phase("volcano", "Pending", timeout=30)


COSCHEDULING_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "podgroups.scheduling.x-k8s.io"},
    "spec": {
        "group": "scheduling.x-k8s.io",
        "names": {"kind": "PodGroup", "plural": "podgroups", "singular": "podgroup"},
        "scope": "Namespaced",
        "versions": [
            {
                "name": "v1alpha1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "x-kubernetes-preserve-unknown-fields": True,
                    }
                },
            }
        ],
    },
}


def test_scheduler_plugins_get_a_podgroup_of_the_whole_gang(
    cluster: Cluster, operator_process: OperatorProcess
) -> None:
    # A stand-in for the coscheduling plugin's CRD (kubernetes-sigs/scheduler-plugins): enough
    # for the API server to store PodGroups; no scheduler acts on them here.
    cluster.apply(COSCHEDULING_CRD)
    wait_established(cluster.kubectl, "podgroups.scheduling.x-k8s.io")
    scheduling = {"schedulerName": "scheduler-plugins-scheduler", "gangTimeoutSeconds": 120}
    cluster.apply(job_manifest("cosched", scheduling=scheduling))
    group = wait_for(
        lambda: json.loads(
            cluster.kubectl(
                "get", "podgroups.scheduling.x-k8s.io", "cosched", "-n", cluster.ns, "-o", "json"
            ).stdout
        ),
        60,
        "the PodGroup of job cosched",
    )
    assert group["spec"] == {"minMember": 2, "scheduleTimeoutSeconds": 120}
    assert group["metadata"]["ownerReferences"][0]["name"] == "cosched"
    pods = wait_for(
        lambda: len(cluster.pods("cosched")) == 2 and cluster.pods("cosched"),
        60,
        "the two pods of job cosched",
    )
    assert all(p["metadata"]["labels"][names.COSCHEDULING_GROUP_LABEL] == "cosched" for p in pods)
