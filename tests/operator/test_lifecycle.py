"""The job life cycle (lifecycle.decide) scenario by scenario."""

from __future__ import annotations

from dataclasses import replace

import pytest
from meshrun_operator.lifecycle.decide import decide
from meshrun_operator.lifecycle.evaluation import Evaluation, evaluate
from meshrun_operator.plaindata import without_none
from meshrun_operator.seen.views import Observed
from operator_factories import at, make_job, make_pod, observe
from operator_lifecycle_helpers import TIMING, advance, condition, reasons, run, started_job

from meshrun.api.errors import SpecError

pytestmark = pytest.mark.unit


def test_new_job_creates_every_pod_once() -> None:
    job, first = run(make_job(), observe(), 0)
    assert first.create_pods == (0, 1)
    assert first.status["phase"] == "Pending"
    assert first.status["plan"]["layout"] == "dp8 x pp1 x tp1"
    assert "PodsCreated" in reasons(first)
    # The pods are in flight (expected) but not yet in the watch cache: no second creation.
    in_flight = replace(observe(), expected=frozenset({"job-0", "job-1"}))
    job, again = run(job, in_flight, 1)
    assert again.create_pods == () and again.status["message"].startswith("waiting for 2")
    # An operator that died between two creates knows of no create in flight: the missing pod
    # is created, and no restart is counted.
    _, missing = run(job, observe(make_pod(0, phase="Pending")), 90)
    assert missing.create_pods == (1,) and missing.status["restarts"] == 0
    assert missing.status["attemptStartTime"] == "2026-01-01T12:00:00Z"


def test_all_pods_running_makes_the_job_running_with_placement() -> None:
    job = started_job()
    pods = (make_pod(0, node="a"), make_pod(1, node="b"))
    job, decision = run(job, observe(*pods), 2)
    assert decision.status["phase"] == "Running"
    assert decision.status["startTime"] == "2026-01-01T12:00:02Z"
    assert condition(decision, "Running")["status"] == "True"
    assert condition(decision, "Scheduled")["reason"] == "AllPodsBound"
    assert decision.status["placement"] == [
        {
            "pod": "job-0",
            "node": "a",
            "firstRank": 0,
            "lastRank": 3,
            "stage": 0,
            "phase": "Running",
        },
        {
            "pod": "job-1",
            "node": "b",
            "firstRank": 4,
            "lastRank": 7,
            "stage": 0,
            "phase": "Running",
        },
    ]
    # A first start is routine: PodsCreated told the launch, the status tells the rest.
    assert reasons(decision) == []
    # Steady state: nothing to do, nothing changes, no new event.
    _, steady = run(job, observe(*pods), 3)
    assert without_none(steady.status) == job["status"] | {"observedGeneration": 1}
    assert steady.events == () and steady.create_pods == () and steady.delete_pods == ()


def test_a_gang_that_runs_again_after_a_restart_is_announced() -> None:
    job = started_job()
    job, _ = run(job, observe(make_pod(0), make_pod(1)), 2)
    failed = make_pod(1, phase="Failed", exit_code=137)
    job, restart = run(job, observe(make_pod(0), failed), 5)
    assert "Restarting" in reasons(restart)
    job, again = run(job, observe(), 30)  # the old pods are gone and the backoff is over
    assert again.create_pods == (0, 1)
    pods = (make_pod(0, attempt=1), make_pod(1, attempt=1))
    _, recovered = run(job, observe(*pods), 31)
    assert recovered.status["phase"] == "Running" and "Running" in reasons(recovered)


def test_gang_waits_then_tears_down_after_the_gang_timeout() -> None:
    job = started_job(scheduling={"gangTimeoutSeconds": 30})
    pods = (make_pod(0, node="a", phase="Pending"), make_pod(1, node=None, phase="Pending"))
    job, waiting = run(job, observe(*pods), 10)
    assert waiting.delete_pods == () and waiting.status["phase"] == "Pending"
    assert condition(waiting, "Scheduled")["message"] == "1 of 2 pods bound"
    job, timeout = run(job, observe(*pods), 31)
    assert timeout.delete_pods == ("job-0", "job-1")
    assert timeout.status["attempt"] == 1 and timeout.status["restarts"] == 0
    assert timeout.state.gang_retries == 1
    assert "GangTimeout" in reasons(timeout)
    # Old pods still terminating: wait, create nothing.
    deleting = [make_pod(i, node="a", phase="Pending", deleting=True) for i in (0, 1)]
    job, wait = run(job, observe(*deleting), 32)
    assert wait.create_pods == () and wait.delete_pods == ()
    # Gone, but the backoff (10 s) has not passed yet.
    job, backoff = run(job, observe(), 35)
    assert backoff.create_pods == ()
    job, retry = run(job, observe(), 42)
    assert retry.create_pods == (0, 1)


def test_gang_off_never_times_out() -> None:
    job = started_job(scheduling={"gang": False, "gangTimeoutSeconds": 5})
    pods = (make_pod(0, node=None, phase="Pending"), make_pod(1, node="a", phase="Pending"))
    _, decision = run(job, observe(*pods), 100)
    assert decision.delete_pods == () and decision.status["phase"] == "Pending"


@pytest.mark.parametrize(
    ("exit_code", "container_reason", "expected_phase", "expected_reason"),
    [
        (137, None, "Restarting", "Killed"),
        (143, None, "Restarting", "Terminated"),
        (1, "Error", "Restarting", "Error"),
        (137, "OOMKilled", "Restarting", "OOMKilled"),
        (2, "Error", "Failed", "ConfigError"),
        (127, None, "Failed", "CommandNotFound"),
    ],
)
def test_a_failed_pod_restarts_the_whole_gang_or_fails(
    exit_code: int, container_reason: str | None, expected_phase: str, expected_reason: str
) -> None:
    job = started_job()
    failed = make_pod(1, phase="Failed", exit_code=exit_code, container_reason=container_reason)
    _, decision = run(job, observe(make_pod(0), failed), 20)
    assert decision.status["phase"] == expected_phase
    assert decision.state.last_failure is not None
    assert decision.state.last_failure.reason == expected_reason
    if expected_phase == "Restarting":
        assert decision.delete_pods == ("job-0", "job-1")
        assert decision.status["restarts"] == 1 and decision.status["attempt"] == 1
        assert condition(decision, "Restarting")["reason"] == expected_reason
    else:
        # Permanent: fail at once, stop the pod that still runs (cleanPodPolicy Running).
        assert decision.delete_pods == ("job-0",)
        assert condition(decision, "Failed")["reason"] == expected_reason
        assert decision.status["restarts"] == 0


def test_backoff_limit_turns_the_next_failure_into_failed() -> None:
    job = started_job(runPolicy={"backoffLimit": 1})
    job["status"]["restarts"] = 1
    failed = make_pod(0, phase="Failed", exit_code=137)
    _, decision = run(job, observe(failed, make_pod(1)), 5)
    assert decision.status["phase"] == "Failed"
    assert condition(decision, "Failed")["reason"] == "BackoffLimitExceeded"
    assert decision.delete_pods == ("job-1",)
    assert any(e.type == "Warning" and e.reason == "Failed" for e in decision.events)


@pytest.mark.parametrize("node_state", [False, None], ids=["not-ready", "deleted"])
def test_pods_on_a_lost_node_are_force_deleted_and_the_gang_restarts(
    node_state: bool | None,
) -> None:
    job = started_job()
    # The pods ran before the node went NotReady: the toleration counts from the node's fall.
    pods = tuple(make_pod(i, node=n, started_at=at(-60)) for i, n in enumerate(("good", "bad")))
    nodes = {"good": True} if node_state is None else {"good": True, "bad": False}
    observed = Observed(pods=pods, nodes=nodes, not_ready_since={"bad": at(-30)})
    _, decision = run(job, observed, 5)
    # Only the pod on the lost node is force-deleted; the other one may stop gracefully.
    assert decision.force_delete_pods == ("job-1",) and decision.delete_pods == ("job-0",)
    assert decision.state.last_failure is not None
    assert decision.state.last_failure.reason == "NodeLost"
    assert decision.status["phase"] == "Restarting"


def test_success_only_when_every_pod_succeeded() -> None:
    job = started_job(runPolicy={"cleanPodPolicy": "All"})
    job, partial = run(job, observe(make_pod(0, phase="Succeeded"), make_pod(1)), 5)
    assert partial.status["phase"] == "Running"
    done = (make_pod(0, phase="Succeeded"), make_pod(1, phase="Succeeded"))
    _, decision = run(job, observe(*done), 6)
    assert decision.status["phase"] == "Succeeded"
    assert decision.status["completionTime"] == "2026-01-01T12:00:06Z"
    assert decision.delete_pods == ("job-0", "job-1")  # cleanPodPolicy All


def test_clean_pod_policy_none_keeps_finished_pods_and_ttl_deletes_the_job() -> None:
    job = started_job(runPolicy={"cleanPodPolicy": "None", "ttlSecondsAfterFinished": 30})
    done = (make_pod(0, phase="Succeeded"), make_pod(1, phase="Succeeded"))
    job, finished = run(job, observe(*done), 10)
    assert finished.delete_pods == () and not finished.delete_job
    job, early = run(job, observe(*done), 39)
    assert not early.delete_job and early.events == ()
    _, late = run(job, observe(*done), 40)
    assert late.delete_job


def test_active_deadline_fails_the_job_and_stops_its_pods() -> None:
    job = started_job(runPolicy={"activeDeadlineSeconds": 60})
    _, decision = run(job, observe(make_pod(0), make_pod(1)), 61)
    assert decision.status["phase"] == "Failed"
    assert condition(decision, "Failed")["reason"] == "DeadlineExceeded"
    assert decision.delete_pods == ("job-0", "job-1")


def test_suspend_deletes_pods_and_creates_nothing_until_resumed() -> None:
    job = started_job()
    job, _ = run(job, observe(make_pod(0), make_pod(1)), 5)
    job["spec"]["runPolicy"] = {"suspend": True}
    job, suspended = run(job, observe(make_pod(0), make_pod(1)), 6)
    assert suspended.status["phase"] == "Suspended"
    assert suspended.delete_pods == ("job-0", "job-1") and suspended.create_pods == ()
    assert condition(suspended, "Suspended")["status"] == "True"
    job, still = run(job, observe(), 7)
    assert still.create_pods == ()
    job["spec"]["runPolicy"] = {"suspend": False}
    _, resumed = run(job, observe(), 8)
    assert resumed.create_pods == (0, 1)
    assert condition(resumed, "Suspended")["status"] == "False"


def test_a_suspended_new_job_never_creates_pods() -> None:
    _, decision = run(make_job(runPolicy={"suspend": True}), observe(), 0)
    assert decision.create_pods == () and decision.status["phase"] == "Suspended"


def test_a_pod_gone_without_a_trace_after_the_gang_ran_restarts_it() -> None:
    job, _ = run(started_job(), observe(make_pod(0), make_pod(1)), 2)
    _, after = run(job, observe(make_pod(0)), 3)
    assert after.status["phase"] == "Restarting" and after.status["restarts"] == 1
    assert after.state.last_failure is not None
    assert after.state.last_failure.reason == "PodDeleted"


def test_invalid_spec_gets_a_condition_naming_the_field_and_no_pods() -> None:
    job = make_job(strategy={"type": "tensor", "tensorParallel": 3})
    job, decision = run(job, observe(), 0)
    assert decision.invalid and decision.create_pods == ()
    invalid = condition(decision, "Invalid")
    assert invalid["status"] == "True"
    assert "spec.strategy.tensorParallel" in invalid["message"]
    assert decision.status["phase"] == "Failed"
    assert [e.type for e in decision.events if e.reason == "InvalidSpec"] == ["Warning"]
    _, again = run(job, observe(), 1)
    assert again.events == ()  # one Warning, not one per resync


def test_a_too_long_name_is_invalid_with_the_metadata_field() -> None:
    _, decision = run(make_job(name="x" * 62), observe(), 0)
    assert decision.invalid
    assert condition(decision, "Invalid")["message"].startswith("metadata.name:")


def test_the_same_job_children_and_time_give_the_same_status() -> None:
    job = started_job()
    observed = observe(make_pod(0), make_pod(1))
    assert (
        decide(job, observed, at(2), TIMING).status == decide(job, observed, at(2), TIMING).status
    )


def test_condition_transition_time_moves_only_when_status_flips() -> None:
    job = started_job()
    pods = (make_pod(0), make_pod(1))
    job, first = run(job, observe(*pods), 2)
    _, later = run(job, observe(*pods), 50)
    assert condition(later, "Running")["lastTransitionTime"] == "2026-01-01T12:00:02Z"
    assert condition(first, "Running") == condition(later, "Running")


def test_lost_bookkeeping_is_rebuilt_so_deadlines_still_apply() -> None:
    # Pods exist but the status write recording their creation never happened.
    job = make_job(runPolicy={"activeDeadlineSeconds": 10})
    job, healed = run(job, observe(make_pod(0), make_pod(1)), 5)
    assert healed.create_pods == () and healed.state.active_since == at(5)
    _, late = run(job, observe(make_pod(0), make_pod(1)), 15)
    assert late.status["phase"] == "Failed"


def test_a_refused_pod_template_stays_invalid_until_the_spec_changes() -> None:
    job = make_job()
    refused = SpecError("spec.podTemplate", "Pod is invalid: cpu: 'lots'")
    evaluation = evaluate(job["spec"], "job")
    bad = Evaluation(raw_spec=evaluation.raw_spec, error=refused)
    job = advance(job, decide(job, observe(), at(0), TIMING, bad))
    _, again = run(job, observe(), 5)
    assert again.invalid and again.create_pods == () and again.events == ()
    job["metadata"]["generation"] = 2  # the user edited the spec: try again
    _, retried = run(job, observe(), 6)
    assert not retried.invalid and retried.create_pods == (0, 1)


def test_a_deleted_node_is_lost_at_once_even_for_a_pod_that_just_came() -> None:
    # The node was NotReady a moment before it was deleted; no toleration is left to give.
    job = started_job()
    pods = (make_pod(0, node="good", started_at=at(4)), make_pod(1, node="bad", started_at=at(4)))
    observed = Observed(pods=pods, nodes={"good": True}, not_ready_since={"bad": at(3)})
    _, decision = run(job, observed, 5)
    assert decision.force_delete_pods == ("job-1",) and decision.status["phase"] == "Restarting"
