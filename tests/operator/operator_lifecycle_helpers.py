"""Helpers of the life-cycle tests: run decide and apply its result like the reconciler."""

from __future__ import annotations

from typing import Any

from meshrun_operator.conditions import find
from meshrun_operator.jobstatus import ConditionType
from meshrun_operator.lifecycle.decide import Decision, decide
from meshrun_operator.plaindata import without_none
from meshrun_operator.seen.views import Observed
from meshrun_operator.timing import Timing
from operator_factories import at, make_job, make_pod, observe

TIMING = Timing(
    backoff_base_seconds=10,
    backoff_max_seconds=60,
    node_toleration_seconds=30,
    start_failure_seconds=60,
)


def advance(job: dict[str, Any], decision: Decision) -> dict[str, Any]:
    """The job as the API server would hold it after the reconciler wrote the decision."""
    return {**job, "status": without_none(decision.status)}


def run(job: dict[str, Any], observed: Observed, seconds: float) -> tuple[dict[str, Any], Decision]:
    decision = decide(job, observed, at(seconds), TIMING)
    return advance(job, decision), decision


def reasons(decision: Decision) -> list[str]:
    return [e.reason for e in decision.events]


def condition(decision: Decision, kind: str) -> dict[str, Any]:
    found = find(decision.status["conditions"], ConditionType(kind))
    assert found is not None, f"no {kind} condition in {decision.status['conditions']}"
    return dict(found)


def started_job(**spec: Any) -> dict[str, Any]:
    """A job whose attempt-0 pods were created at t=0."""
    job, _ = run(make_job(**spec), observe(), 0)
    return job


def running_job(**spec: Any) -> dict[str, Any]:
    """A job whose attempt-0 pods (on node-0) all ran at t=2."""
    job, _ = run(started_job(**spec), observe(make_pod(0), make_pod(1)), 2)
    return job


def failed(index: int, code: int, **fields: Any) -> Any:
    return make_pod(
        index, phase="Failed", exit_code=code, exit_codes=(("trainer", code),), **fields
    )
