"""Reading a Workload's state and the status patches the operator writes (kueue_state)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from kueue_factories import condition, make_workload
from meshrun_operator import kueue as ks
from meshrun_operator.kueue import WorkloadPhase

pytestmark = pytest.mark.unit

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
ADMISSION = {"clusterQueue": "gpus", "podSetAssignments": [{"name": "stage-0", "count": 2}]}
NO_QUOTA = (
    "couldn't assign flavors to pod set stage-1: insufficient unused quota for nvidia.com/gpu in "
    "flavor h200-pool, 16 more needed"
)
RESERVED = condition(ks.QUOTA_RESERVED, True, "QuotaReserved", "Quota reserved in gpus")
ADMITTED = condition(ks.ADMITTED, True, "Admitted", "The workload is admitted")
PREEMPTED_MSG = "Preempted to accommodate a workload (UID: 1) due to prioritization in the CQ"


@pytest.mark.parametrize(
    ("conditions", "phase", "reason", "message"),
    [
        ([], WorkloadPhase.PENDING, "Pending", ""),
        (
            [condition(ks.QUOTA_RESERVED, False, "Pending", NO_QUOTA)],
            WorkloadPhase.PENDING,
            "Pending",
            NO_QUOTA,
        ),
        (
            [
                condition(
                    ks.QUOTA_RESERVED, False, "Inadmissible", "LocalQueue team-z doesn't exist"
                )
            ],
            WorkloadPhase.PENDING,
            "Inadmissible",
            "LocalQueue team-z doesn't exist",
        ),
        ([RESERVED], WorkloadPhase.QUOTA_RESERVED, "QuotaReserved", "Quota reserved in gpus"),
        ([RESERVED, ADMITTED], WorkloadPhase.ADMITTED, "Admitted", "The workload is admitted"),
        (
            [RESERVED, ADMITTED, condition(ks.EVICTED, True, "PodsReadyTimeout", "timeout")],
            WorkloadPhase.EVICTED,
            "PodsReadyTimeout",
            "timeout",
        ),
        # Evicted but the admission already cleared: queued again.
        (
            [
                condition(ks.QUOTA_RESERVED, False, "Pending", "requeued"),
                condition(ks.EVICTED, True, "Preempted", PREEMPTED_MSG),
            ],
            WorkloadPhase.PENDING,
            "Pending",
            "requeued",
        ),
        (
            [RESERVED, ADMITTED, condition(ks.FINISHED, True, "Succeeded", "done")],
            WorkloadPhase.FINISHED,
            "Succeeded",
            "done",
        ),
    ],
)
def test_the_phase_and_kueues_reason_are_read_from_the_conditions(
    conditions: list[dict[str, Any]], phase: WorkloadPhase, reason: str, message: str
) -> None:
    state = ks.read_workload(make_workload(*conditions))
    assert (state.phase, state.reason, state.message) == (phase, reason, message)
    assert state.queued == (phase in (WorkloadPhase.PENDING, WorkloadPhase.QUOTA_RESERVED))
    assert not state.preempted


def test_a_preemption_is_told_apart_from_other_evictions() -> None:
    preempted = make_workload(
        RESERVED,
        ADMITTED,
        condition(ks.EVICTED, True, "Preempted", PREEMPTED_MSG),
        condition(ks.PREEMPTED, True, "InClusterQueue", PREEMPTED_MSG),
        admission=ADMISSION,
    )
    state = ks.read_workload(preempted)
    assert state.phase is WorkloadPhase.EVICTED
    assert state.preempted and state.preempted_by == "InClusterQueue"
    assert state.admission == ADMISSION
    timeout = make_workload(RESERVED, condition(ks.EVICTED, True, "PodsReadyTimeout", "late"))
    assert not ks.read_workload(timeout).preempted


def test_deactivation_and_backoff_are_reported() -> None:
    workload = make_workload(
        condition(ks.QUOTA_RESERVED, False, "Pending", "backoff"), active=False
    )
    workload["status"]["requeueState"] = {"count": 3, "requeueAt": "2026-01-01T12:05:00Z"}
    state = ks.read_workload(workload)
    assert not state.active
    assert state.requeue_at == "2026-01-01T12:05:00Z"
    assert ks.read_workload(make_workload()).active


def _condition(patch: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in patch["status"]["conditions"] if c["type"] == kind)


def test_pods_ready_goes_through_kueues_reasons_start_then_recovery() -> None:
    workload = make_workload(RESERVED, ADMITTED, admission=ADMISSION)
    steps = [
        (False, "WaitForStart", "False"),
        (True, "Started", "True"),
        (False, "WaitForRecovery", "False"),
        (True, "Recovered", "True"),
        (False, "WaitForRecovery", "False"),
    ]
    for ready, reason, status in steps:
        patch = ks.pods_ready_patch(workload, ready, f"ready={ready}", NOW)
        assert patch is not None
        assert patch["metadata"] == {"resourceVersion": "42"}
        got = _condition(patch, ks.PODS_READY)
        assert (got["status"], got["reason"], got["message"]) == (status, reason, f"ready={ready}")
        assert got["observedGeneration"] == 1
        # Kueue's own conditions ride along untouched.
        assert _condition(patch, ks.ADMITTED) == ADMITTED
        workload["status"]["conditions"] = patch["status"]["conditions"]
        assert ks.pods_ready_patch(workload, ready, "again", NOW) is None


def test_a_condition_keeps_its_transition_time_unless_its_status_flips() -> None:
    workload = make_workload(condition(ks.PODS_READY, False, "WaitForStart"))
    later = datetime(2026, 1, 2, tzinfo=UTC)
    same = ks.pods_ready_patch(workload, False, "x", later)
    assert same is None
    flipped = ks.pods_ready_patch(workload, True, "all running", later)
    assert flipped is not None
    assert _condition(flipped, ks.PODS_READY)["lastTransitionTime"] == "2026-01-02T00:00:00Z"


def test_finished_gives_the_quota_back_once() -> None:
    workload = make_workload(RESERVED, ADMITTED, admission=ADMISSION)
    patch = ks.finished_patch(workload, False, "BackoffLimitExceeded: 3 restarts", NOW)
    assert patch is not None
    got = _condition(patch, ks.FINISHED)
    assert (got["status"], got["reason"]) == ("True", "Failed")
    assert got["lastTransitionTime"] == "2026-01-01T12:00:00Z"
    assert "admission" not in patch["status"]
    succeeded = ks.finished_patch(workload, True, "done", NOW)
    assert succeeded is not None and _condition(succeeded, ks.FINISHED)["reason"] == "Succeeded"
    workload["status"]["conditions"] = patch["status"]["conditions"]
    assert ks.finished_patch(workload, True, "again", NOW) is None


@pytest.mark.parametrize(
    ("reason", "requeued"), [("Preempted", "True"), ("PodsReadyTimeout", "False")]
)
def test_release_after_eviction_clears_the_admission(reason: str, requeued: str) -> None:
    workload = make_workload(
        RESERVED,
        ADMITTED,
        condition(ks.PODS_READY, True, "Started"),
        condition(ks.EVICTED, True, reason, "why"),
        admission=ADMISSION,
    )
    patch = ks.release_patch(workload, NOW)
    assert patch is not None
    assert patch["status"]["admission"] is None
    assert patch["metadata"] == {"resourceVersion": "42"}
    assert _condition(patch, ks.QUOTA_RESERVED)["status"] == "False"
    assert _condition(patch, ks.QUOTA_RESERVED)["reason"] == "Pending"
    assert _condition(patch, ks.ADMITTED)["status"] == "False"
    assert _condition(patch, ks.REQUEUED)["status"] == requeued
    assert _condition(patch, ks.REQUEUED)["reason"] == reason
    assert _condition(patch, ks.EVICTED)["status"] == "True"
    ready = _condition(patch, ks.PODS_READY)
    assert (ready["status"], ready["reason"]) == ("False", "WaitForStart")


def test_release_is_only_for_an_evicted_workload_that_holds_quota() -> None:
    assert ks.release_patch(make_workload(RESERVED, ADMITTED), NOW) is None
    released = make_workload(
        condition(ks.QUOTA_RESERVED, False, "Pending", ""), condition(ks.EVICTED, True, "X", "")
    )
    assert ks.release_patch(released, NOW) is None
