"""Kueue in the life cycle: the decisions about a job that names a queue (used by lifecycle).

While Kueue governs a job, its Workload (kueue.py) says whether pods may exist: none while the
Workload is queued or evicted (the job is ``Suspended``, its Suspended condition carrying
Kueue's reason and words), the gang once it is admitted, placed where the admission says. The
Workload outlives the job's attempts: a whole-gang restart keeps the admission, and an eviction
(a preemption, a PodsReady timeout) deletes the pods and re-queues the job without counting a
restart. What the operator tells Kueue back (PodsReady, the release after an eviction,
Finished) is computed here as a status patch of the Workload; runtime/actions.py sends it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from meshrun.api.spec import JobSpec
from meshrun_operator import jobstatus, names
from meshrun_operator.conditions import find
from meshrun_operator.jobstatus import ConditionType, EventType, Phase, Reason
from meshrun_operator.kueue import (
    KueueActions,
    QueueRef,
    WorkloadPhase,
    finished_patch,
    pods_ready_patch,
    read_workload,
    release_patch,
)
from meshrun_operator.lifecycle.phases import Draft
from meshrun_operator.seen.views import Observed


def queue_of(spec: JobSpec | None, metadata: Mapping[str, Any]) -> QueueRef | None:
    """Where Kueue queues the job: ``spec.scheduling.queueName``, else the job's
    ``kueue.x-k8s.io/queue-name`` label; None without one, and for volcano, whose own queues
    the name then names (it becomes the PodGroup's queue)."""
    if spec is None or spec.scheduling.scheduler_name == "volcano":
        return None
    labels = metadata.get("labels") or {}
    queue = spec.scheduling.queue_name or labels.get(names.KUEUE_QUEUE_LABEL)
    if not queue:
        return None
    priority = labels.get(names.PRIORITY_CLASS_LABEL)
    return QueueRef(str(queue), str(priority) if priority else None)


def held(draft: Draft, observed: Observed, ref: QueueRef) -> bool:
    """Decide what Kueue's verdict means for the job; True while it holds the job (no pods),
    False once the Workload is admitted and the gang may run."""
    view, queue = observed.kueue, ref.queue
    draft.kueue = KueueActions()
    if view is None:
        message = Reason.KUEUE_DISABLED.message(queue=queue)
        _queued(draft, observed, Reason.KUEUE_DISABLED, message, message, warn=True)
        return True
    if view.workload is None:
        if view.hold is not None:
            hold = view.hold
            _queued(draft, observed, hold.reason, hold.message, hold.message, warn=True)
            return True
        draft.kueue.create = ref
        message = Reason.QUEUED.message(workload="(being created)", queue=queue)
        status = jobstatus.QUEUED_IN.format(queue=queue, why=message)
        _queued(draft, observed, Reason.QUEUED, message, status)
        return True
    workload = view.workload
    name = str((workload.get("metadata") or {}).get("name", ""))
    state = read_workload(workload)
    if state.phase is WorkloadPhase.EVICTED:
        # Kueue took the admission back: the pods go, and the release (report) re-queues it.
        why = state.message or state.reason
        status = jobstatus.EVICTED_BY_KUEUE.format(reason=state.reason, why=why)
        _queued(draft, observed, state.reason, why, status, warn=True)
        return True
    if state.queued or state.phase is WorkloadPhase.FINISHED:
        if not state.active:
            why = f": {state.message}" if state.message else ""
            message = Reason.WORKLOAD_INACTIVE.message(workload=name, why=why)
            _queued(draft, observed, Reason.WORKLOAD_INACTIVE, message, message, warn=True)
            return True
        message = state.message or Reason.QUEUED.message(workload=name, queue=queue)
        status = jobstatus.QUEUED_IN.format(queue=queue, why=message)
        _queued(draft, observed, state.reason, message, status)
        return True
    draft.kueue.admitted = workload
    cluster_queue = (state.admission or {}).get("clusterQueue", "")
    admitted = Reason.ADMITTED.message(workload=name, cluster_queue=cluster_queue)
    draft.clear(ConditionType.SUSPENDED, Reason.ADMITTED, admitted)
    return False


def _queued(
    draft: Draft, observed: Observed, reason: str, why: str, status: str, warn: bool = False
) -> None:
    """No pods while Kueue holds the job: phase Suspended, the Suspended condition saying why.

    Pods of the attempt that ran are deleted and the next admission starts a new attempt (its
    trainer resumes from the last checkpoint): a disruption (``disruptions``), not a restart,
    so ``restarts`` and backoffLimit are untouched. Clocks stop as for a suspended job.
    """
    state = draft.state
    draft.delete.extend(p.name for p in observed.pods if not p.deleting)
    if state.attempt_start_time is not None or any(
        p.attempt == state.attempt for p in observed.pods
    ):
        state.attempt += 1
        state.disruptions += 1
    state.start_time = state.attempt_start_time = state.next_attempt_time = None
    state.active_since = None
    state.phase, state.message = Phase.SUSPENDED, status
    before = find(draft.conditions, ConditionType.SUSPENDED) or {}
    changed = before.get("status") != "True" or before.get("reason") != str(reason)
    if changed and (warn or draft.old_phase is Phase.SUSPENDED):
        # The phase change announces itself; a new reason while queued, or trouble, is told.
        draft.add_event(EventType.WARNING if warn else EventType.NORMAL, str(reason), status)
    draft.condition(ConditionType.SUSPENDED, True, str(reason), why)
    draft.clear(ConditionType.RUNNING, str(reason), why)


def report(draft: Draft, observed: Observed) -> None:
    """The Workload status patch this decision implies, if any: Finished when the job ended,
    the release once an evicted job's pods are all gone, PodsReady while admitted."""
    view = observed.kueue
    if view is None or view.workload is None:
        return
    workload, now = view.workload, draft.now
    state = read_workload(workload)
    phase = draft.state.phase
    patch: dict[str, Any] | None = None
    if phase is not None and phase.finished:
        patch = finished_patch(workload, phase is Phase.SUCCEEDED, draft.state.message, now)
    elif state.phase is WorkloadPhase.EVICTED:
        patch = None if observed.pods else release_patch(workload, now)
    elif state.phase is WorkloadPhase.ADMITTED:
        ready = phase is Phase.RUNNING
        attempt = draft.state.attempt
        message = (
            f"every pod of attempt {attempt} is running"
            if ready
            else f"waiting for every pod of attempt {attempt} to run"
        )
        patch = pods_ready_patch(workload, ready, message, now)
    if patch is not None:
        draft.kueue = draft.kueue or KueueActions()
        draft.kueue.status_patch = patch
