"""The life cycle under faults, decision by decision: the failure policy and disruptions, lost
nodes, pods that never start, partial and refused creation, children of another owner
(lifecycle.decide, no cluster). Spec edits: test_lifecycle_specedits.py."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from meshrun_operator.lifecycle.decide import decide
from meshrun_operator.lifecycle.failure.classes import Failure, FailureClass
from meshrun_operator.lifecycle.failure.policy import judge
from meshrun_operator.seen.views import Observed, Refusal, node_view, pod_view
from operator_factories import at, make_job, make_pod, observe
from operator_lifecycle_helpers import (
    TIMING,
    advance,
    condition,
    failed,
    run,
    running_job,
    started_job,
)

from meshrun.api.read import read_spec

pytestmark = pytest.mark.unit

POLICY = {
    "podFailurePolicy": {
        "rules": [
            {"action": "RestartJob", "onExitCodes": {"operator": "In", "values": [42]}},
            {"action": "Ignore", "onExitCodes": {"operator": "In", "values": [7]}},
            {
                "action": "FailJob",
                "onExitCodes": {"containerName": "trainer", "operator": "In", "values": [1]},
            },
            {"action": "RestartJob", "onReasons": ["ErrImagePull"]},
        ]
    }
}


def test_pod_view_reads_what_faults_are_judged_by() -> None:
    view = pod_view(
        {
            "metadata": {"name": "job-0", "uid": "u0"},
            "status": {
                "phase": "Pending",
                "startTime": "2026-01-01T12:00:05Z",
                "conditions": [
                    {
                        "type": "DisruptionTarget",
                        "status": "True",
                        "reason": "EvictionByEvictionAPI",
                        "message": "Eviction API: evicting",
                    },
                ],
                "initContainerStatuses": [
                    {"name": "init", "state": {"terminated": {"exitCode": 0}}}
                ],
                "containerStatuses": [
                    {
                        "name": "trainer",
                        "state": {"waiting": {"reason": "ErrImagePull", "message": "not found"}},
                    }
                ],
            },
        }
    )
    assert view.uid == "u0" and view.started_at == at(5)
    assert view.waiting == ("ErrImagePull", "container trainer: not found")
    assert view.disruption == "EvictionByEvictionAPI: Eviction API: evicting"
    assert ("DisruptionTarget", "True") in view.conditions and view.exit_codes == (("init", 0),)
    creating = {
        "containerStatuses": [{"name": "t", "state": {"waiting": {"reason": "ContainerCreating"}}}]
    }
    assert pod_view({"status": creating}).waiting is None
    since = {"type": "Ready", "status": "False", "lastTransitionTime": "2026-01-01T12:00:00Z"}
    assert node_view({"status": {"conditions": [since]}}) == node_view(
        {"status": {"conditions": [since]}}
    )
    assert node_view({"status": {"conditions": [since]}}).since == at(0)


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        (42, FailureClass.RETRYABLE),  # the table says permanent; the policy restarts
        (7, FailureClass.IGNORED),
        (1, FailureClass.PERMANENT),  # the table says retryable; the policy fails
        (3, FailureClass.PERMANENT),  # no rule matches: the table decides
    ],
)
def test_the_failure_policy_decides_by_exit_code(code: int, kind: FailureClass) -> None:
    policy = read_spec({**make_job(runPolicy=POLICY)["spec"]}).run_policy.pod_failure_policy
    table = Failure(FailureClass.PERMANENT if code != 1 else FailureClass.RETRYABLE, "X", "x")
    assert judge(table, failed(0, code), policy).kind is kind


def test_policy_patterns_exit_zero_container_names_conditions_and_reasons() -> None:
    spec = make_job(
        runPolicy={
            "podFailurePolicy": {
                "rules": [
                    {"action": "Ignore", "onExitCodes": {"operator": "NotIn", "values": [5]}},
                ]
            }
        }
    )["spec"]
    policy = read_spec(spec).run_policy.pod_failure_policy
    base = Failure(FailureClass.RETRYABLE, "Error", "x")
    clean = make_pod(0, exit_codes=(("sidecar", 0), ("trainer", 5)))
    assert judge(base, clean, policy).kind is FailureClass.RETRYABLE  # 0 never matches
    other = make_pod(0, exit_codes=(("trainer", 6),))
    assert judge(base, other, policy).kind is FailureClass.IGNORED
    assert "podFailurePolicy rule 0: Ignore" in judge(base, other, policy).message
    by_condition = read_spec(
        make_job(
            runPolicy={
                "podFailurePolicy": {
                    "rules": [
                        {"action": "RestartJob", "onPodConditions": [{"type": "DisruptionTarget"}]}
                    ]
                }
            }
        )["spec"]
    ).run_policy.pod_failure_policy
    disrupted = make_pod(0, conditions=(("DisruptionTarget", "True"),))
    ignored = Failure(FailureClass.IGNORED, "Disrupted", "x")
    assert judge(ignored, disrupted, by_condition).kind is FailureClass.RETRYABLE
    assert judge(ignored, None, by_condition).kind is FailureClass.IGNORED


@pytest.mark.parametrize(
    ("code", "phase", "restarts", "disruptions"),
    [(42, "Restarting", 1, 0), (7, "Restarting", 0, 1), (1, "Failed", 0, 0)],
)
def test_decide_follows_the_policy(code: int, phase: str, restarts: int, disruptions: int) -> None:
    job = running_job(runPolicy=POLICY)
    _, decision = run(job, observe(make_pod(0), failed(1, code)), 5)
    assert decision.status["phase"] == phase
    assert (decision.status["restarts"], decision.status["disruptions"]) == (restarts, disruptions)
    assert decision.state.last_failure is not None
    expected = "Ignored" if code == 7 else ("Permanent" if code == 1 else "Retryable")
    assert decision.status["lastFailure"]["class"] == expected


@pytest.mark.parametrize(
    "how",
    [
        "deleting-target",
        "gone-target",
        "evicted-failed",
        "drained-failed",
        "node-shutdown",
        "node-deleted",
        "node-not-ready",
        "gone-with-its-node",
        "gone-plain",
    ],
)
def test_disruptions_restart_without_counting_and_deletions_count(how: str) -> None:
    # Infrastructure losses (preemption, eviction, a node deleted, shut down or NotReady past
    # the toleration) are disruptions, as the Job controller's DisruptionTarget says; only a
    # pod deleted by someone for no such reason counts against backoffLimit.
    job = running_job(runPolicy={"backoffLimit": 0})
    target = "EvictionByEvictionAPI: Eviction API: evicting"
    pods = [make_pod(0)]
    gone: tuple[Any, ...] = ()
    nodes: dict[str, bool] = {}
    if how == "deleting-target":
        pods.append(make_pod(1, deleting=True, disruption=target))
    elif how == "gone-target":
        gone = (make_pod(1, disruption=target),)
    elif how == "evicted-failed":
        pods.append(make_pod(1, phase="Failed", pod_reason="Evicted"))
    elif how == "drained-failed":  # the drain's SIGTERM ended it before it was deleted
        pods.append(make_pod(1, phase="Failed", exit_code=143, disruption=target))
    elif how == "node-shutdown":
        pods.append(make_pod(1, phase="Failed", exit_code=143, pod_reason="Terminated"))
    elif how == "node-deleted":
        pods.append(make_pod(1, node="dead", started_at=at(-60)))
    elif how == "node-not-ready":
        pods.append(make_pod(1, node="down", started_at=at(-60)))
        nodes = {"down": False}
    elif how == "gone-with-its-node":  # the pod garbage collector removed it with its node
        gone = (make_pod(1, node="dead"),)
    else:
        gone = (make_pod(1),)
    observed = observe(*pods, nodes=nodes)
    known = {node: ready for node, ready in (observed.nodes or {}).items() if node != "dead"}
    observed = replace(observed, gone=gone, nodes=known, not_ready_since={"down": at(-40)})
    _, decision = run(job, observed, 5)
    if how == "gone-plain":
        # Deleted with no DisruptionTarget: counted, and backoffLimit 0 is used up.
        assert decision.status["phase"] == "Failed"
        assert condition(decision, "Failed")["reason"] == "BackoffLimitExceeded"
        return
    assert decision.status["phase"] == "Restarting" and decision.status["attempt"] == 1
    assert decision.status["restarts"] == 0 and decision.status["disruptions"] == 1
    assert decision.state.last_failure is not None
    assert decision.state.last_failure.kind is FailureClass.IGNORED
    if how.startswith("node-") or how == "gone-with-its-node":
        assert decision.state.last_failure.reason in ("NodeLost", "Terminated")


def test_a_node_blip_shorter_than_the_toleration_kills_nothing() -> None:
    job = running_job()
    pods = (make_pod(0, node="a"), make_pod(1, node="b"))
    blip = replace(observe(*pods, nodes={"b": False}), not_ready_since={"b": at(3)})
    _, during = run(job, blip, 32)  # NotReady for 29 s of a 30 s toleration
    assert during.status["phase"] == "Running" and during.delete_pods == ()
    assert during.force_delete_pods == ()
    _, lost = run(job, blip, 33)
    assert lost.status["phase"] == "Restarting" and lost.force_delete_pods == ("job-1",)
    assert lost.delete_pods == ("job-0",)
    assert "NotReady for 30s" in condition(lost, "Restarting")["message"]


def test_terminating_pods_on_a_lost_node_are_force_deleted_whoever_deletes_them() -> None:
    job = running_job()
    job["status"]["attempt"] = 1  # attempt 0 is being torn down
    old = (make_pod(0, node="a", deleting=True), make_pod(1, node="dead"))
    gone_node = Observed(pods=old, nodes={"a": True})
    _, decision = run(job, gone_node, 5)
    assert decision.force_delete_pods == ("job-1",) and decision.delete_pods == ()
    assert decision.create_pods == ()  # the new gang waits until the old pods are gone


def test_a_pod_that_cannot_start_ends_the_job_within_the_start_timeout() -> None:
    job = started_job()
    stuck = make_pod(
        1, phase="Pending", started_at=at(1), waiting=("ErrImagePull", "container trainer: no")
    )
    _, early = run(job, observe(make_pod(0, phase="Pending"), stuck), 60)
    assert early.status["phase"] == "Pending" and early.delete_pods == ()
    _, late = run(job, observe(make_pod(0, phase="Pending"), stuck), 61)
    assert late.status["phase"] == "Failed" and late.status["restarts"] == 0
    failed_condition = condition(late, "Failed")
    assert failed_condition["reason"] == "ErrImagePull" and "job-1" in failed_condition["message"]
    assert set(late.delete_pods) == {"job-0", "job-1"}  # no pod keeps holding a node
    assert any(e.type == "Warning" and e.reason == "Failed" for e in late.events)
    hopeless = replace(stuck, waiting=("InvalidImageName", "container trainer: bad"))
    _, at_once = run(job, observe(make_pod(0, phase="Pending"), hopeless), 2)
    assert at_once.status["phase"] == "Failed"
    # The policy can make it a restart of the attempt instead.
    policy_job = started_job(runPolicy=POLICY)
    _, restarted = run(policy_job, observe(make_pod(0, phase="Pending"), stuck), 61)
    assert restarted.status["phase"] == "Restarting" and restarted.status["restarts"] == 1


def test_refused_creation_says_why_backs_off_and_creates_the_rest_later() -> None:
    job = make_job()
    first = decide(job, observe(), at(0), TIMING)
    assert first.create_pods == (0, 1)
    # The pass that sent both creates wrote nothing; the next one decides on the refusal, with
    # job-0 in flight.
    message = 'pods "job-1" is forbidden: exceeded quota: q'
    refusal = Refusal((1,), "QuotaExceeded", message, sent=first.create_pods)
    in_flight = replace(observe(), expected=frozenset({"job-0"}), refused=refusal)
    refused = decide(job, in_flight, at(0), TIMING)
    job = advance(job, refused)
    cond = condition(refused, "CreationRefused")
    assert cond["status"] == "True" and cond["reason"] == "QuotaExceeded"
    assert "exceeded quota" in cond["message"] and refused.status["phase"] == "Pending"
    assert ("Warning", "QuotaExceeded") in {(e.type, e.reason) for e in refused.events}
    assert refused.status["nextAttemptTime"] == "2026-01-01T12:00:10Z"
    assert refused.status["attemptStartTime"] == "2026-01-01T12:00:00Z"  # job-0 was created
    assert ("PodsCreated", "creating 1 pod(s) for attempt 0") in {
        (e.reason, e.message) for e in refused.events
    }
    pod0 = make_pod(0, phase="Pending", node=None)
    job, waiting = run(job, observe(pod0), 5)
    assert waiting.create_pods == () and "refused" in waiting.status["message"]
    job, retry = run(job, observe(pod0), 10)
    assert retry.create_pods == (1,) and retry.status["restarts"] == 0
    _, done = run(job, observe(pod0, make_pod(1, phase="Pending", node=None)), 11)
    assert condition(done, "CreationRefused")["status"] == "False"


def test_a_refused_creation_waits_as_long_as_the_api_server_asks() -> None:
    job, _ = run(make_job(), observe(), 0)
    # 429 with Retry-After: 45 (priority and fairness throttling): longer than the first delay.
    throttled = Refusal((0, 1), "TooManyRequests", "too many requests", retry_after=45)
    refused = decide(job, replace(observe(), refused=throttled), at(0), TIMING)
    assert refused.status["nextAttemptTime"] == "2026-01-01T12:00:45Z"
    # ... but never past the longest backoff (60 s here).
    ages = replace(throttled, retry_after=3600)
    assert (
        decide(job, replace(observe(), refused=ages), at(0), TIMING).status["nextAttemptTime"]
        == "2026-01-01T12:01:00Z"
    )


def test_a_partial_gang_is_released_after_the_gang_timeout() -> None:
    job = started_job(scheduling={"gangTimeoutSeconds": 30})
    job["status"]["nextAttemptTime"] = None
    _, decision = run(job, observe(make_pod(0, phase="Pending")), 31)
    assert decision.delete_pods == ("job-0",) and decision.create_pods == ()
    assert condition(decision, "Scheduled")["reason"] == "GangTimeout"


def test_pods_of_an_earlier_job_of_the_same_name_are_waited_for_and_orphans_replaced() -> None:
    old = make_pod(0, node=None, owner_uid="uid-0", deleting=True)
    orphan = make_pod(1, node=None, owner_uid=None)
    job, decision = run(make_job(), replace(observe(), foreign=(old, orphan)), 0)
    assert decision.create_pods == () and decision.delete_pods == ("job-1",)
    assert "earlier job named job" in decision.status["message"]
    _, later = run(job, observe(), 1)
    assert later.create_pods == (0, 1)


def test_a_resume_while_the_old_pods_terminate_waits_and_counts_nothing() -> None:
    job = running_job()
    job["spec"]["runPolicy"] = {"suspend": True}
    job, suspended = run(job, observe(make_pod(0), make_pod(1)), 5)
    assert suspended.status["attempt"] == 1 and suspended.delete_pods == ("job-0", "job-1")
    job["spec"]["runPolicy"] = {"suspend": False}
    terminating = observe(make_pod(0, deleting=True), make_pod(1, deleting=True))
    _, resumed = run(job, terminating, 6)
    assert resumed.status["restarts"] == 0 and resumed.create_pods == ()
    assert "earlier attempt" in resumed.status["message"]


def test_a_pod_that_came_to_a_not_ready_node_gets_the_whole_toleration() -> None:
    # The node went NotReady long ago; the pod was bound to it at t=20 (the node's return may
    # reach the operator after the pod's binding). It is given up 30 s after its own start.
    job = started_job()
    pods = (make_pod(0, node="a", started_at=at(20)), make_pod(1, node="b", started_at=at(20)))
    node = replace(observe(*pods, nodes={"b": False}), not_ready_since={"b": at(-100)})
    _, fresh = run(job, node, 49)
    assert fresh.status["phase"] == "Running" and fresh.status["restarts"] == 0
    _, lost = run(job, node, 50)
    assert lost.status["disruptions"] == 1 and lost.force_delete_pods == ("job-1",)
