"""Kueue, pure part two: what a job's Workload says, and the status patches the operator writes.

Kueue owns the queueing conditions (QuotaReserved, Admitted, Evicted, Preempted); the job's
controller, here the operator, owns the rest of the conversation (Kueue's jobframework does
the same for built-in jobs): ``PodsReady`` while the gang starts or recovers, clearing the
admission once an evicted gang's pods are gone (which re-queues the Workload), and
``Finished`` when the job ends, which gives the quota back. Each patch is a JSON merge patch of
the Workload's ``/status`` carrying the resourceVersion it was computed from, so a patch that
crossed one of Kueue's own writes is refused (409) instead of undoing it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from meshrun_operator.conditions import format_time

# Condition types and reasons of kueue.x-k8s.io/v1beta2 Workloads (apis/kueue/v1beta2).
QUOTA_RESERVED = "QuotaReserved"
ADMITTED = "Admitted"
EVICTED = "Evicted"
PREEMPTED = "Preempted"
REQUEUED = "Requeued"
PODS_READY = "PodsReady"
FINISHED = "Finished"
# Evicted reasons after which the Workload is queued again at once (the rest back off).
REQUEUED_AT_ONCE = ("Preempted", "NodeFailures")
# PodsReady reasons: waiting for the first start, started, waiting to recover, recovered.
WAIT_FOR_START = "WaitForStart"
STARTED = "Started"
WAIT_FOR_RECOVERY = "WaitForRecovery"
RECOVERED = "Recovered"
# Kueue truncates condition messages to this many characters (api.TruncateConditionMessage).
MAX_MESSAGE = 32 * 1024


class WorkloadPhase(StrEnum):
    """Where a Workload stands, the operator's reading of Kueue's conditions."""

    PENDING = "Pending"
    """Queued: no quota yet (or Kueue has not seen it yet)."""
    QUOTA_RESERVED = "QuotaReserved"
    """Quota reserved, admission checks still running: no pods yet."""
    ADMITTED = "Admitted"
    """Admitted: the pods may run, placed as ``status.admission`` says."""
    EVICTED = "Evicted"
    """Kueue took the admission back (preemption, PodsReady timeout, deactivation, ...): the
    pods must go, then the admission is cleared and the Workload waits in the queue again."""
    FINISHED = "Finished"
    """The job ended and said so; the quota is released."""


@dataclass(frozen=True)
class WorkloadState:
    """One reading of a Workload's status."""

    phase: WorkloadPhase
    """See WorkloadPhase."""
    reason: str
    """Kueue's reason for that phase, e.g. ``Pending``, ``Inadmissible``, ``Preempted``,
    ``PodsReadyTimeout``, ``Succeeded``."""
    message: str
    """Kueue's words, e.g. why the Workload does not fit (for the job's condition)."""
    preempted_by: str | None = None
    """For a preemption, the Preempted condition's reason (``InClusterQueue``,
    ``InCohortReclamation``, ...): another Workload needed the quota."""
    active: bool = True
    """False when ``spec.active`` is false (Kueue deactivates a Workload that exceeded its
    re-queueing limit): it is never admitted again."""
    requeue_at: str | None = None
    """When a backing-off Workload may be admitted again (``status.requeueState``)."""
    admission: Mapping[str, Any] | None = None
    """``status.admission`` (cluster queue, per pod set flavors and topology) while reserved."""

    @property
    def queued(self) -> bool:
        """Waiting for Kueue: no pod may exist."""
        return self.phase in (WorkloadPhase.PENDING, WorkloadPhase.QUOTA_RESERVED)

    @property
    def preempted(self) -> bool:
        """Evicted to make room for another Workload: not the job's fault, no restart counted."""
        return self.phase is WorkloadPhase.EVICTED and self.preempted_by is not None


def condition(workload: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    """The Workload's condition of type ``kind``, or None."""
    for item in (workload.get("status") or {}).get("conditions") or []:
        if item.get("type") == kind:
            return item  # type: ignore[no-any-return]
    return None


def _true(workload: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    found = condition(workload, kind)
    return found if found is not None and found.get("status") == "True" else None


def _state(
    phase: WorkloadPhase, found: Mapping[str, Any] | None, default_reason: str, **extra: Any
) -> WorkloadState:
    reason = str((found or {}).get("reason") or default_reason)
    return WorkloadState(phase, reason, str((found or {}).get("message") or ""), **extra)


def read_workload(workload: Mapping[str, Any]) -> WorkloadState:
    """The state of a Workload; the first that holds wins: Finished, Evicted (still holding
    its admission), Admitted, QuotaReserved, else Pending."""
    status = workload.get("status") or {}
    common = {
        "active": (workload.get("spec") or {}).get("active", True) is not False,
        "requeue_at": (status.get("requeueState") or {}).get("requeueAt"),
        "admission": status.get("admission"),
    }
    if found := _true(workload, FINISHED):
        return _state(WorkloadPhase.FINISHED, found, "Finished", **common)
    evicted = _true(workload, EVICTED)
    if evicted and _true(workload, QUOTA_RESERVED):
        preempted = _true(workload, PREEMPTED)
        reason = str(preempted.get("reason")) if preempted else None
        return _state(WorkloadPhase.EVICTED, evicted, "Evicted", preempted_by=reason, **common)
    if found := _true(workload, ADMITTED):
        return _state(WorkloadPhase.ADMITTED, found, "Admitted", **common)
    if found := _true(workload, QUOTA_RESERVED):
        return _state(WorkloadPhase.QUOTA_RESERVED, found, "QuotaReserved", **common)
    return _state(WorkloadPhase.PENDING, condition(workload, QUOTA_RESERVED), "Pending", **common)


def _with_conditions(
    workload: Mapping[str, Any], updates: Sequence[tuple[str, bool, str, str]], now: datetime
) -> list[dict[str, Any]]:
    """The Workload's conditions with ``updates`` (type, status, reason, message) set the way
    apimachinery's SetStatusCondition does: the transition time moves only when the status
    flips, and the others stay as they are."""
    generation = (workload.get("metadata") or {}).get("generation")
    result = [dict(c) for c in (workload.get("status") or {}).get("conditions") or []]
    for kind, status, reason, message in updates:
        new = {
            "type": kind,
            "status": "True" if status else "False",
            "reason": reason,
            "message": message[:MAX_MESSAGE],
            "lastTransitionTime": format_time(now),
        }
        if generation is not None:
            new["observedGeneration"] = generation
        for index, old in enumerate(result):
            if old.get("type") == kind:
                if old.get("status") == new["status"] and old.get("lastTransitionTime"):
                    new["lastTransitionTime"] = old["lastTransitionTime"]
                result[index] = new
                break
        else:
            result.append(new)
    return result


def _status_patch(workload: Mapping[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    metadata = workload.get("metadata") or {}
    return {"metadata": {"resourceVersion": metadata.get("resourceVersion")}, "status": status}


def pods_ready_patch(
    workload: Mapping[str, Any], ready: bool, message: str, now: datetime
) -> dict[str, Any] | None:
    """The PodsReady condition Kueue's waitForPodsReady watches, or None when it already says so.

    ``ready``: every pod of the gang is running. The reason follows Kueue: ``Started`` /
    ``WaitForStart`` before the gang first ran since admission, ``Recovered`` /
    ``WaitForRecovery`` after (a whole-gang restart keeps the admission; Kueue's
    recoveryTimeout then bounds how long the gang may take to come back).
    """
    current = condition(workload, PODS_READY)
    was_ready = current is not None and current.get("status") == "True"
    ran_before = was_ready or (current or {}).get("reason") in (WAIT_FOR_RECOVERY, RECOVERED)
    if ready:
        if was_ready:
            return None
        reason = RECOVERED if ran_before else STARTED
    else:
        reason = WAIT_FOR_RECOVERY if ran_before else WAIT_FOR_START
        if current is not None and not was_ready and current.get("reason") == reason:
            return None
    conditions = _with_conditions(workload, [(PODS_READY, ready, reason, message)], now)
    return _status_patch(workload, {"conditions": conditions})


def finished_patch(
    workload: Mapping[str, Any], succeeded: bool, message: str, now: datetime
) -> dict[str, Any] | None:
    """``Finished=True`` (reason Succeeded or Failed): Kueue releases the quota at once. None
    when the Workload already finished."""
    if _true(workload, FINISHED):
        return None
    reason = "Succeeded" if succeeded else "Failed"
    conditions = _with_conditions(workload, [(FINISHED, True, reason, message)], now)
    return _status_patch(workload, {"conditions": conditions})


def release_patch(workload: Mapping[str, Any], now: datetime) -> dict[str, Any] | None:
    """After an eviction, once the gang's pods are gone: clear the admission so the Workload
    queues again (what Kueue's jobframework does for its own jobs once they are stopped).

    Sets QuotaReserved and Admitted false, ``Requeued`` (true for a preemption or node
    failures, which queue again at once; false otherwise, e.g. a PodsReady timeout backs off),
    PodsReady back to WaitForStart, and removes ``status.admission``. None unless the Workload
    is evicted and holds quota.
    """
    evicted = _true(workload, EVICTED)
    if evicted is None or _true(workload, QUOTA_RESERVED) is None:
        return None
    reason, message = str(evicted.get("reason") or ""), str(evicted.get("message") or "")
    updates = [
        (REQUEUED, reason in REQUEUED_AT_ONCE, reason, message),
        (QUOTA_RESERVED, False, "Pending", message),
        (ADMITTED, False, "NoReservation", "The workload has no reservation"),
    ]
    if condition(workload, PODS_READY) is not None:
        # The next admission starts from scratch, not as a recovery of this one.
        updates.append((PODS_READY, False, WAIT_FOR_START, "Not all pods are ready or succeeded"))
    conditions = _with_conditions(workload, updates, now)
    return _status_patch(workload, {"conditions": conditions, "admission": None})


@dataclass(frozen=True)
class Hold:
    """Why a job that names a queue has no Workload, for its condition (Kueue not served, a
    missing WorkloadPriorityClass, a Workload Kueue refused)."""

    reason: str
    """CamelCase reason (vocabulary.Reason)."""
    message: str
    """What to do about it, in one sentence."""


@dataclass(frozen=True)
class KueueView:
    """What the operator sees of Kueue for one job: its Workload, or why it has none."""

    workload: Mapping[str, Any] | None = None
    """The job's Workload as last seen (watch or the operator's own last write), or None."""
    hold: Hold | None = None
    """Set when the Workload cannot be created for now; tried again later."""


@dataclass(frozen=True)
class QueueRef:
    """Where a job queues: what its Workload is created with."""

    queue: str
    """The LocalQueue (``spec.scheduling.queueName``, else the queue-name label)."""
    priority_class: str | None = None
    """The job's ``kueue.x-k8s.io/priority-class`` label: a WorkloadPriorityClass, or None."""


@dataclass
class KueueActions:
    """The Kueue side effects of one decision."""

    create: QueueRef | None = None
    """Create the job's Workload in this queue (built from the plan and the pods of attempt 0)."""
    admitted: Mapping[str, Any] | None = None
    """The admitted Workload whose admission the pods created now follow."""
    status_patch: dict[str, Any] | None = None
    """A patch of the Workload's status (PodsReady, the release after an eviction, Finished)."""
