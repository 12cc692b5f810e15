"""Which status changes are written at once, and which wait to be written with the next
(writes.py); a spec evaluated once per generation (evaluation.Evaluations)."""

from __future__ import annotations

from typing import Any

import pytest
from meshrun_operator.lifecycle.evaluation import Evaluations
from meshrun_operator.lifecycle.writes import at_once
from operator_harness import job_manifest

pytestmark = pytest.mark.unit


def status(phase: str | None = "Pending", **fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "phase": phase,
        "attempt": 0,
        "restarts": 0,
        "observedGeneration": 1,
        "message": "creating 2 pod(s) for attempt 0",
        "conditions": [],
        "placement": [],
    }
    return {k: v for k, v in {**base, **fields}.items() if v is not None}


def scheduled(reason: str, status: str = "False") -> dict[str, str]:
    return {"type": "Scheduled", "status": status, "reason": reason, "message": "m"}


@pytest.mark.parametrize(
    ("old", "new", "now"),
    [
        # A new job's launch in progress waits (one write when its gang runs).
        ({}, status(conditions=[scheduled("WaitingForGang")]), False),
        # ... but not a job that starts suspended, or is refused its pods.
        ({}, status("Suspended"), True),
        (
            {},
            status(conditions=[{"type": "CreationRefused", "status": "True", "reason": "Q"}]),
            True,
        ),
        # Placement, messages, the gang's own progress: wait.
        (status(), status(message="waiting", placement=[{"pod": "a", "node": "n"}]), False),
        (
            status(conditions=[scheduled("WaitingForGang")]),
            status(conditions=[scheduled("AllPodsBound", "True")]),
            False,
        ),
        (status("Running"), status("Running", progress={"step": 3}), False),
        # A phase, a counter, a condition, the generation decided on: at once.
        (status(), status("Running"), True),
        (status("Running"), status("Running", restarts=1), True),
        (status(), status(conditions=[scheduled("GangTimeout")]), True),
        (status(), status(observedGeneration=2), True),
    ],
)
def test_which_status_changes_are_written_at_once(
    old: dict[str, Any], new: dict[str, Any], now: bool
) -> None:
    assert at_once(old, new) is now


def test_a_spec_is_evaluated_once_per_generation() -> None:
    evaluations = Evaluations()
    spec = job_manifest("job")["spec"]
    first = evaluations.of("uid-1", spec, "job", 1)
    assert evaluations.of("uid-1", dict(spec), "job", 1) is first
    # A new generation (an edited spec) is evaluated again, and so is another job.
    edited = {
        **spec,
        "resources": {"numNodes": 4, "numProcPerNode": 4},
        "training": {"steps": 10, "globalBatchSize": 32, "microBatchSize": 2},
    }
    second = evaluations.of("uid-1", edited, "job", 2)
    assert second is not first and second.plan is not None and second.plan.world_size == 16
    assert evaluations.of("uid-2", spec, "job", 1) is not first
    # Without a generation (a body from elsewhere), only an equal spec is the same spec.
    assert evaluations.of("uid-3", spec, "job", None) is evaluations.of("uid-3", spec, "job", None)
    again = evaluations.of("uid-3", edited, "job", None)
    assert again.plan is not None and again.plan.world_size == 16
    evaluations.forget("uid-1")
    assert evaluations.of("uid-1", spec, "job", 1) is not first
