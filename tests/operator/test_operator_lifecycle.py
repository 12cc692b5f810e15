"""The job life cycle (lifecycle.decide / status.compute_status) scenario by scenario."""

from __future__ import annotations

import json
from typing import Any

import pytest
from meshrun_operator import names
from meshrun_operator.conditions import find
from meshrun_operator.lifecycle import Decision, Evaluation, Tuning, decide, evaluate
from meshrun_operator.observe import Observed
from meshrun_operator.status import compute_status
from operator_factories import at, make_job, make_pod, observe

from meshrun.errors import SpecError

pytestmark = pytest.mark.unit

TUNING = Tuning(backoff_base_seconds=10, backoff_max_seconds=60, missing_pod_grace_seconds=5)


def advance(job: dict[str, Any], decision: Decision) -> dict[str, Any]:
    """The job as the API server would hold it after the reconciler wrote the decision."""
    status = {k: v for k, v in decision.status.items() if v is not None}
    state = {k: v for k, v in decision.state.items() if v is not None}
    annotations = {names.ANNOTATION_STATE: json.dumps(state)}
    return {**job, "status": status, "metadata": {**job["metadata"], "annotations": annotations}}


def run(job: dict[str, Any], observed: Observed, seconds: float) -> tuple[dict[str, Any], Decision]:
    decision = decide(job, observed, at(seconds), TUNING)
    return advance(job, decision), decision


def reasons(decision: Decision) -> list[str]:
    return [e.reason for e in decision.events]


def condition(decision: Decision, kind: str) -> dict[str, Any]:
    found = find(decision.status["conditions"], kind)
    assert found is not None, f"no {kind} condition in {decision.status['conditions']}"
    return dict(found)


def started_job(**spec: Any) -> dict[str, Any]:
    """A job whose attempt-0 pods were created at t=0."""
    job, _ = run(make_job(**spec), observe(), 0)
    return job


def test_new_job_creates_every_pod_once() -> None:
    job, first = run(make_job(), observe(), 0)
    assert first.create_pods == (0, 1)
    assert first.status["phase"] == "Pending"
    assert first.status["plan"]["layout"] == "dp8 x pp1 x tp1"
    assert "PodsCreated" in reasons(first)
    # The pods are in flight but not yet in the watch cache: no second creation.
    _, again = run(job, observe(), 1)
    assert again.create_pods == ()


def test_all_pods_running_makes_the_job_running_with_placement() -> None:
    job = started_job()
    pods = (make_pod(0, node="a"), make_pod(1, node="b"))
    job, decision = run(job, observe(*pods), 2)
    assert decision.status["phase"] == "Running"
    assert decision.status["startTime"] == "2026-01-01T12:00:02Z"
    assert condition(decision, "Running")["status"] == "True"
    assert condition(decision, "Scheduled")["reason"] == "AllPodsBound"
    assert decision.status["placement"] == [
        {"pod": "job-0", "node": "a", "firstRank": 0, "lastRank": 3, "phase": "Running"},
        {"pod": "job-1", "node": "b", "firstRank": 4, "lastRank": 7, "phase": "Running"},
    ]
    assert "Running" in reasons(decision)
    # Steady state: nothing to do, nothing changes, no new event.
    _, steady = run(job, observe(*pods), 3)
    assert steady.status == job["status"] | {"observedGeneration": 1}
    assert steady.events == () and steady.create_pods == () and steady.delete_pods == ()


def test_gang_waits_then_tears_down_after_the_gang_timeout() -> None:
    job = started_job(scheduling={"gangTimeoutSeconds": 30})
    pods = (make_pod(0, node="a", phase="Pending"), make_pod(1, node=None, phase="Pending"))
    job, waiting = run(job, observe(*pods), 10)
    assert waiting.delete_pods == () and waiting.status["phase"] == "Pending"
    assert condition(waiting, "Scheduled")["message"] == "1 of 2 pods bound"
    job, timeout = run(job, observe(*pods), 31)
    assert timeout.delete_pods == ("job-0", "job-1")
    assert timeout.status["attempt"] == 1 and timeout.status["restarts"] == 0
    assert timeout.state["gangRetries"] == 1
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
    assert decision.state["lastFailure"]["reason"] == expected_reason
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
    pods = (make_pod(0, node="good"), make_pod(1, node="bad"))
    nodes = {"good": True} if node_state is None else {"good": True, "bad": False}
    observed = Observed(pods=pods, nodes=nodes)
    _, decision = run(job, observed, 5)
    assert decision.force_delete
    assert set(decision.delete_pods) == {"job-0", "job-1"}
    assert decision.state["lastFailure"]["reason"] == "NodeLost"
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


def progress(step: int) -> dict[str, Any]:
    return {
        "step": step,
        "totalSteps": 100,
        "loss": 2.5,
        "tokensPerSecond": 1000.0,
        "stepTimeSeconds": 0.5,
        "updatedAt": 1767268800.0,
    }


def test_progress_is_reported_and_a_hang_restarts_the_gang() -> None:
    job = started_job(runPolicy={"progressDeadlineSeconds": 20})
    job, first = run(job, observe(make_pod(0, progress=progress(1)), make_pod(1)), 5)
    assert first.status["progress"]["step"] == 1
    assert first.status["progress"]["etaSeconds"] == 49.5
    # The step advances at t=20: no restart at t=30 although 25 s passed since running.
    job, _ = run(job, observe(make_pod(0, progress=progress(2)), make_pod(1)), 20)
    job, fine = run(job, observe(make_pod(0, progress=progress(2)), make_pod(1)), 30)
    assert fine.status["phase"] == "Running"
    _, hung = run(job, observe(make_pod(0, progress=progress(2)), make_pod(1)), 40)
    assert hung.status["phase"] == "Restarting"
    assert hung.state["lastFailure"]["reason"] == "ProgressDeadlineExceeded"
    assert hung.delete_pods == ("job-0", "job-1")


def test_progress_from_the_endpoint_wins_over_the_annotation() -> None:
    job = started_job()
    observed = observe(make_pod(0, progress=progress(1)), make_pod(1), progress=progress(7))
    _, decision = run(job, observed, 5)
    assert decision.status["progress"]["step"] == 7


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


def test_a_pod_deleted_by_someone_restarts_the_gang_after_the_grace() -> None:
    job = started_job()
    _, within = run(job, observe(make_pod(0)), 3)
    assert within.status["restarts"] == 0 and within.create_pods == ()
    _, after = run(job, observe(make_pod(0)), 6)
    assert after.status["phase"] == "Restarting"
    assert after.state["lastFailure"]["reason"] == "PodDeleted"


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


def test_compute_status_is_the_status_of_the_decision() -> None:
    job = started_job()
    observed = observe(make_pod(0), make_pod(1))
    assert (
        compute_status(job, observed, at(2), TUNING) == decide(job, observed, at(2), TUNING).status
    )


def test_condition_transition_time_moves_only_when_status_flips() -> None:
    job = started_job()
    pods = (make_pod(0), make_pod(1))
    job, first = run(job, observe(*pods), 2)
    _, later = run(job, observe(*pods), 50)
    assert condition(later, "Running")["lastTransitionTime"] == "2026-01-01T12:00:02Z"
    assert condition(first, "Running") == condition(later, "Running")


def test_lost_bookkeeping_is_rebuilt_so_deadlines_still_apply() -> None:
    # Pods exist but the annotation recording their creation never got written.
    job = make_job(runPolicy={"activeDeadlineSeconds": 10})
    job, healed = run(job, observe(make_pod(0), make_pod(1)), 5)
    assert healed.create_pods == () and healed.state["activeSince"] == "2026-01-01T12:00:05Z"
    _, late = run(job, observe(make_pod(0), make_pod(1)), 15)
    assert late.status["phase"] == "Failed"


def test_progress_fields_of_the_wrong_type_are_dropped_not_sent() -> None:
    job = started_job()
    report = {**progress(4), "updatedAt": "yesterday", "loss": "nan?", "extra": 1}
    _, decision = run(job, observe(make_pod(0, progress=report), make_pod(1)), 5)
    shown = decision.status["progress"]
    assert shown["step"] == 4 and shown["tokensPerSecond"] == 1000.0
    assert "updatedAt" not in shown and "loss" not in shown and "extra" not in shown


def test_printer_columns_are_filled() -> None:
    _, decision = run(make_job(), observe(), 0)
    assert decision.status["strategy"] == "ddp"
    assert decision.status["layout"] == "dp8 x pp1 x tp1"
    assert decision.status["gpus"] == 8


def test_a_refused_pod_template_stays_invalid_until_the_spec_changes() -> None:
    job = make_job()
    refused = SpecError("spec.podTemplate", "Pod is invalid: cpu: 'lots'")
    evaluation = evaluate(job["spec"], "job")
    bad = Evaluation(spec=evaluation.spec, error=refused)
    job = advance(job, decide(job, observe(), at(0), TUNING, bad))
    _, again = run(job, observe(), 5)
    assert again.invalid and again.create_pods == () and again.events == ()
    job["metadata"]["generation"] = 2  # the user edited the spec: try again
    _, retried = run(job, observe(), 6)
    assert not retried.invalid and retried.create_pods == (0, 1)


def test_the_trainers_final_summary_becomes_the_final_progress() -> None:
    job = started_job()
    summary = {
        "status": "Succeeded",
        "steps": 20,
        "finalLoss": 2.125,
        "tokensPerSecond": 512.0,
        "losses": [3.0, 2.125],
    }
    done = (make_pod(0, phase="Succeeded", summary=summary), make_pod(1, phase="Succeeded"))
    _, decision = run(job, observe(*done), 9)
    assert decision.status["phase"] == "Succeeded"
    assert decision.status["progress"] == {
        "step": 20,
        "totalSteps": 20,
        "loss": 2.125,
        "tokensPerSecond": 512.0,
        "etaSeconds": 0.0,
    }


def test_the_trainers_error_message_reaches_the_failure() -> None:
    job = started_job()
    summary = {"status": "Failed", "rank": 3, "error": "ValueError: MESHRUN_TP: 3 must divide 4"}
    failed = make_pod(1, phase="Failed", exit_code=2, summary=summary)
    _, decision = run(job, observe(make_pod(0), failed), 5)
    failed_condition = condition(decision, "Failed")
    assert failed_condition["reason"] == "ConfigError"
    assert "MESHRUN_TP: 3 must divide 4" in failed_condition["message"]
