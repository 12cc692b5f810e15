"""The job says why it waits: the scheduler's and the kubelet's words on the first pod that waits
reach the job's message and a condition at once, long before the wait counts as a failure."""

from __future__ import annotations

from dataclasses import replace

import pytest
from meshrun_operator.seen.views import Refusal, pod_view
from operator_factories import make_job, make_pod, observe
from operator_lifecycle_helpers import TIMING, condition, run, started_job

pytestmark = pytest.mark.unit

SCHEDULER = "0/8 nodes are available: 8 Insufficient nvidia.com/gpu."


def test_pod_view_reads_the_schedulers_verdict() -> None:
    body = {
        "metadata": {"name": "job-0", "labels": {}},
        "status": {
            "phase": "Pending",
            "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                 "message": SCHEDULER},
            ],
        },
    }  # fmt: skip
    assert pod_view(body).unschedulable == f"Unschedulable: {SCHEDULER}"
    body["status"]["conditions"][0]["status"] = "True"  # type: ignore[index]
    assert pod_view(body).unschedulable is None


def test_an_unschedulable_pod_is_named_with_the_schedulers_words() -> None:
    said = f"Unschedulable: {SCHEDULER}"
    pods = (make_pod(0, node=None, phase="Pending"), make_pod(1, node=None, phase="Pending",
                                                              unschedulable=said))  # fmt: skip
    _, decision = run(started_job(), observe(*pods), 5)
    scheduled = condition(decision, "Scheduled")
    assert (scheduled["status"], scheduled["reason"]) == ("False", "Unschedulable")
    assert scheduled["message"] == f"0 of 2 pods bound; pod job-1: {said}"
    assert decision.status["message"] == f"2 pod(s) not scheduled yet; pod job-1: {said}"
    assert decision.status["phase"] == "Pending" and decision.delete_pods == ()
    # Without the scheduler's word, the count alone.
    quiet = (make_pod(0, node=None, phase="Pending"), make_pod(1, node=None, phase="Pending"))
    _, plain = run(started_job(), observe(*quiet), 5)
    assert condition(plain, "Scheduled")["reason"] == "WaitingForGang"


@pytest.mark.parametrize(
    ("reason", "message"),
    [
        ("ImagePullBackOff", 'container trainer: Back-off pulling image "registry/missing:1"'),
        ("ErrImagePull", 'container trainer: failed to pull image "registry/missing:1"'),
        ("CreateContainerConfigError", 'container trainer: secret "hf-token" not found'),
        ("CreateContainerConfigError", "container fetch: container has runAsNonRoot and image "
         "will run as root"),
    ],
)  # fmt: skip
def test_a_pod_that_cannot_start_is_named_at_once_with_the_kubelets_words(
    reason: str, message: str
) -> None:
    waiting = make_pod(1, phase="Pending", waiting=(reason, message))
    _, decision = run(started_job(), observe(make_pod(0), waiting), 5)
    running = condition(decision, "Running")
    assert (running["status"], running["reason"]) == ("False", reason)
    assert running["message"] == f"pod job-1: {message}"
    assert decision.status["message"] == f"pod job-1 waits: {reason}: {message}"
    # Well before the start timeout (60 s here): a wait, not a failure.
    assert decision.status["phase"] == "Pending" and decision.status["restarts"] == 0
    assert "Failed" not in {c["type"] for c in decision.status["conditions"]}
    # Past it, the same wait is the job's failure (lifecycle/failure/detect.py).
    _, late = run(started_job(), observe(make_pod(0), waiting), TIMING.start_failure_seconds + 1)
    assert late.status["phase"] == "Failed" and condition(late, "Failed")["reason"] == reason


def test_a_quota_refusal_names_the_pods_at_once() -> None:
    job, _ = run(make_job(), observe(), 0)
    refusal = Refusal((0, 1), "QuotaExceeded", 'pods "job-0" is forbidden: exceeded quota: gpus')
    _, refused = run(job, replace(observe(), refused=refusal), 1)
    cond = condition(refused, "CreationRefused")
    assert cond["reason"] == "QuotaExceeded" and cond["message"].startswith("pod(s) job-0, job-1")
    assert "exceeded quota: gpus" in refused.status["message"]


def test_a_refused_gang_of_thousands_is_said_in_a_line() -> None:
    job, _ = run(make_job(), observe(), 0)
    indices = tuple(i for i in range(4096) if i != 7)
    refusal = Refusal(indices, "QuotaExceeded", "exceeded quota: gpus")
    _, refused = run(job, replace(observe(), refused=refusal), 1)
    cond = condition(refused, "CreationRefused")
    assert cond["message"] == "4095 pods of job (indices 0-6,8-4095): exceeded quota: gpus"
    assert len(refused.status["message"]) < 300
    assert all(len(e.message) < 300 for e in refused.events)
