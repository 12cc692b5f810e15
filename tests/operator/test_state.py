"""The operator's bookkeeping (state.JobState): one serialization, declared in the CRD's status,
carried over from the annotation older operators wrote, and out of users' reach."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest
from meshrun_operator.jobstatus import Phase
from meshrun_operator.lifecycle.failure.classes import FailureClass
from meshrun_operator.lifecycle.state import InvalidSpec, JobState, LastFailure, StepChange
from meshrun_operator.plaindata import with_unwritten, without_none
from operator_factories import at, make_job, make_pod, observe
from operator_lifecycle_helpers import run, started_job

from meshrun.api.crd import VERSION, crd, validate_status

pytestmark = pytest.mark.unit

FULL = JobState(
    phase=Phase.RESTARTING,
    attempt=2,
    restarts=1,
    message="pod job-1: exit code 137; restarting the whole gang",
    start_time=None,
    completion_time=None,
    attempt_start_time=at(10),
    active_since=at(0),
    next_attempt_time=at(30),
    gang_retries=1,
    last_failure=LastFailure(
        pod="job-1",
        reason="Killed",
        message="exit code 137",
        kind=FailureClass.RETRYABLE,
        exit_code=137,
        time=at(20),
    ),
    last_step_change=StepChange(attempt=1, step=7, time=at(15)),
    invalid_spec=InvalidSpec(field="spec.podTemplate", rule="Pod is invalid", generation=3),
)


def status_schema() -> Mapping[str, Any]:
    version = next(v for v in crd()["spec"]["versions"] if v["name"] == VERSION)
    schema: Mapping[str, Any] = version["schema"]["openAPIV3Schema"]["properties"]["status"]
    return schema


def undeclared(value: Mapping[str, Any], schema: Mapping[str, Any], path: str) -> list[str]:
    """Keys of ``value`` the structural ``schema`` would prune."""
    missing = []
    properties = schema.get("properties") or {}
    for key, item in value.items():
        declared = properties.get(key) or schema.get("additionalProperties")
        if declared is None and not schema.get("x-kubernetes-preserve-unknown-fields"):
            missing.append(f"{path}.{key}")
        elif isinstance(item, Mapping) and isinstance(declared, Mapping):
            missing += undeclared(item, declared, f"{path}.{key}")
    return missing


def test_the_state_survives_its_own_serialization() -> None:
    status = without_none(FULL.to_status())
    assert JobState.from_job({"status": status}) == FULL
    assert JobState.from_job({"status": {}}) == JobState()


def test_the_bookkeeping_keys_stay() -> None:
    status = FULL.to_status()
    assert list(status) == [
        "phase",
        "attempt",
        "restarts",
        "disruptions",
        "attemptGeneration",
        "message",
        "startTime",
        "completionTime",
        "attemptStartTime",
        "activeSince",
        "nextAttemptTime",
        "gangRetries",
        "lastFailure",
        "lastStepChange",
        "invalidSpec",
    ]
    assert status["lastFailure"] == {
        "pod": "job-1",
        "reason": "Killed",
        "message": "exit code 137",
        "class": "Retryable",
        "exitCode": 137,
        "time": "2026-01-01T12:00:20Z",
    }
    assert status["lastStepChange"] == {"attempt": 1, "step": 7, "time": "2026-01-01T12:00:15Z"}
    assert status["startTime"] is None and status["phase"] == "Restarting"
    validate_status(status)


def test_every_bookkeeping_field_is_declared_in_the_crd_status() -> None:
    # The API server prunes what a structural schema does not declare: the clocks would vanish.
    assert undeclared(without_none(FULL.to_status()), status_schema(), "status") == []
    _, decision = run(make_job(), observe(), 0)
    assert undeclared(without_none(decision.status), status_schema(), "status") == []


def test_a_job_cannot_bring_its_own_clocks_in_an_annotation() -> None:
    # Only the status, which users cannot write, carries the bookkeeping.
    job = make_job(status={"phase": "Running", "attempt": 1})
    forged = {"activeSince": "2099-01-01T00:00:00Z", "gangRetries": 9}
    job["metadata"]["annotations"] = {"meshrun.dev/state": json.dumps(forged)}
    state = JobState.from_job(job)
    assert state.active_since is None and state.gang_retries == 0


def test_a_lost_write_is_carried_into_the_next_pass() -> None:
    job = started_job()
    failed = make_pod(1, phase="Failed", exit_code=137)
    _, restart = run(job, observe(make_pod(0), failed), 20)
    assert restart.state.restarts == 1
    # The write of that decision lost a race with a label edit: same status, newer metadata.
    newer = {**job, "metadata": {**job["metadata"], "labels": {"team": "a"}}}
    unwritten = (job["status"], restart.status)
    carried = with_unwritten(newer, unwritten)
    assert carried["metadata"]["labels"] == {"team": "a"}
    assert carried["status"] == without_none(restart.status)
    gone = [make_pod(i, deleting=True) for i in (0, 1)]
    _, after = run(carried, observe(*gone), 21)
    assert after.state.restarts == 1 and after.state.attempt == 1
    # Someone else changed the status meanwhile: their status stands.
    changed = {**newer, "status": {**job["status"], "restarts": 5}}
    assert with_unwritten(changed, unwritten) is changed
