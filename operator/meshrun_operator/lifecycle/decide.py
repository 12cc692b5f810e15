"""The job's life cycle as one pure function: (job, observed children, now) -> decision.

``decide`` returns the complete new status and the side effects that move the world towards it
(pods to create or delete, the job to delete). The reconciler only executes the decision and
writes the status in one patch, so every rule below is unit-tested without a cluster
(jobset's single status write per reconcile).

The attempt is the unit of restart: a whole gang of pods shares one attempt number (a label);
restarting deletes every pod of the attempt and creates the next one only after they are gone,
so two gangs never hold GPUs at once and the stable pod names (DNS) never clash.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from meshrun.api.errors import SpecError
from meshrun.api.spec import JobSpec
from meshrun.planner.plan import Plan
from meshrun_operator import jobstatus
from meshrun_operator.jobstatus import ConditionType, EventType, PodPhase, Reason
from meshrun_operator.kueue import KueueActions, QueueRef
from meshrun_operator.lifecycle import creation, elastic, queueing, specedits
from meshrun_operator.lifecycle.columns import display, running_size
from meshrun_operator.lifecycle.evaluation import Evaluation, evaluate, still_refused
from meshrun_operator.lifecycle.failure import detect
from meshrun_operator.lifecycle.failure.classes import Failure, FailureClass
from meshrun_operator.lifecycle.failure.policy import judge
from meshrun_operator.lifecycle.phases import Draft, Event
from meshrun_operator.lifecycle.scheduling import WHY_MAX, missing_product, scheduler_says
from meshrun_operator.lifecycle.state import JobState
from meshrun_operator.lifecycle.summary import (
    final_progress,
    last_step_time,
    placement,
    progress_status,
    step_change,
)
from meshrun_operator.lifecycle.throughput import judge_throughput
from meshrun_operator.seen.views import Observed, PodView
from meshrun_operator.timing import Timing


@dataclass
class Decision:
    """The new status and the side effects that lead there."""

    status: dict[str, Any]
    """The complete status to write in one patch (None values remove a field)."""
    state: JobState
    """The bookkeeping inside ``status``, typed."""
    create_pods: tuple[int, ...] = ()
    """Pod indices to create for ``state.attempt`` (with the Service and PodGroup)."""
    delete_pods: tuple[str, ...] = ()
    """Pod names to delete gracefully."""
    force_delete_pods: tuple[str, ...] = ()
    """Pod names to delete with grace period 0 (on a lost node no kubelet confirms a graceful
    delete)."""
    restore: tuple[str, ...] = ()
    """Kinds of children (Service, NetworkPolicy) to create again while the gang runs."""
    delete_job: bool = False
    """ttlSecondsAfterFinished has passed: delete the job itself."""
    events: tuple[Event, ...] = ()
    """Kubernetes Events to post on the job."""
    invalid: bool = False
    """The spec is invalid: no pods, the Invalid condition names the field."""
    build: Evaluation | None = None
    """The evaluated spec the attempt's pods are built from (the attempt's, while it runs)."""
    kueue: KueueActions | None = None
    """The job's Kueue Workload: create it, place the new pods by its admission, patch it."""


def decide(
    job: Mapping[str, Any],
    observed: Observed,
    now: datetime,
    timing: Timing | None = None,
    evaluation: Evaluation | None = None,
    running: specedits.Running | None = None,
) -> Decision:
    """Everything the operator should do about ``job`` given what it observes at ``now``;
    ``running``: the evaluated spec the current attempt's pods were built from, if known."""
    metadata = job.get("metadata") or {}
    name = str(metadata.get("name", ""))
    generation = metadata.get("generation")
    ev = evaluation or evaluate(job.get("spec") or {}, name)
    state = JobState.from_job(job)
    draft = Draft(job.get("status") or {}, state, now, timing or Timing(), name)
    draft.derived["observedGeneration"] = generation
    current = still_refused(ev, state.invalid_spec, generation)
    draft.generation = known = generation if isinstance(generation, int) else None
    ev = specedits.choose(draft, current, running, observed)
    if ev.error is not None or ev.spec is None:
        draft.invalid(ev.error or SpecError("spec", "could not be evaluated"), known, observed.pods)
    else:
        if ev.plan is not None:
            summary = ev.plan.status_summary()
            draft.derived["plan"] = summary
            # Printer columns (kubectl get ptj) read these top-level copies.
            draft.derived.update(strategy=summary["strategy"], **running_size(ev.plan))
        queue = queueing.queue_of(ev.spec, metadata)
        # An elastic job runs at status.dataParallel; a resize restarts the gang right here.
        ev, resizing = elastic.sized(draft, ev, observed, queued=queue is not None)
        if not resizing and ev.spec is not None:
            _run(draft, ev.spec, ev.plan, observed, queue)
        if ev.plan is None and draft.create:
            # The running attempt's pods cannot be rebuilt under a spec that is refused.
            draft.create.clear()
            draft.invalid(current.error or SpecError("spec", "no plan"), known, observed.pods)
    queueing.report(draft, observed)
    draft.announce_phase()
    force = detect.force_deletes(observed, draft.delete, draft.timing, draft.now)
    status = draft.status()
    status["display"] = display(status)
    return Decision(
        status=status,
        state=draft.state,
        create_pods=tuple(draft.create),
        delete_pods=tuple(n for n in dict.fromkeys(draft.delete) if n not in force),
        force_delete_pods=tuple(sorted(force)),
        build=ev if ev.plan is not None else None,
        restore=tuple(draft.restore),
        delete_job=draft.delete_job,
        events=tuple(draft.events),
        invalid=draft.is_invalid,
        kueue=draft.kueue,
    )


def _run(
    draft: Draft,
    spec: JobSpec,
    plan: Plan | None,
    observed: Observed,
    queue: QueueRef | None,
) -> None:
    state, now = draft.state, draft.now
    draft.revalidated()
    current = [p for p in observed.pods if p.attempt == draft.attempt and not p.deleting]
    # Pods of the attempt that someone else deletes end the attempt (failure/detect.py).
    stale = [p for p in observed.pods if p.attempt != draft.attempt]
    if plan is not None:  # else the attempt's placement, as the status has it
        draft.derived["placement"] = placement(plan, current, observed.domains)
    policy = spec.run_policy

    if draft.old_phase is not None and draft.old_phase.finished:
        draft.finished(policy, observed.pods)
        return
    if policy.suspend:
        draft.suspend(observed.pods)
        return
    if queue and queueing.held(draft, observed, queue):
        return
    draft.resumed()
    since, deadline = state.active_since, policy.active_deadline_seconds
    if deadline is not None and since is not None and now >= since + timedelta(seconds=deadline):
        message = Reason.DEADLINE_EXCEEDED.message(deadline=deadline)
        draft.fail(Reason.DEADLINE_EXCEEDED, message, policy, observed.pods)
        return
    if stale:
        # The previous attempt (or a deleted pod) must be gone before a gang starts again.
        draft.delete.extend(p.name for p in stale if not p.deleting)
        draft.waiting(jobstatus.WAITING_FOR_OLD_PODS.format(count=len(stale)))
        return
    if current and state.attempt_start_time is None:
        draft.pods_seen()

    failures = spec.run_policy.pod_failure_policy
    start = state.attempt_start_time
    found = detect.first_failure(
        draft.attempt, current, observed, failures, draft.timing, now, start
    )
    if found is not None:
        draft.failure(found[0], found[1], spec, current)
        return
    pod0 = next((p for p in current if p.index == 0), None)
    done = all(p.phase == PodPhase.SUCCEEDED for p in current)
    if len(current) == spec.resources.num_nodes and done:
        final = final_progress(pod0.summary if pod0 else None)
        if final:
            _set_progress(draft, {**(draft.derived.get("progress") or {}), **final})
        draft.succeed(policy, current)
        return
    if creation.create_or_wait(draft, spec, current, observed):
        return
    reported = observed.progress
    if reported is None and pod0 is not None:
        reported = pod0.progress
    if reported is not None:
        progress = progress_status(reported)
        predicted = _predicted(plan)
        if predicted is not None:  # beside the measured tokensPerSecond
            progress["predictedTokensPerSecond"] = predicted
        _set_progress(draft, progress)
        state.last_step_change = step_change(state.last_step_change, reported, draft.attempt, now)
        verdict = judge_throughput(predicted, progress)
        if verdict is not None and verdict[0]:
            draft.condition(
                ConditionType.BELOW_PREDICTION, True, Reason.BELOW_PREDICTION, verdict[1]
            )
        elif verdict is not None:
            draft.clear(ConditionType.BELOW_PREDICTION, Reason.AS_PREDICTED, verdict[1])
    _schedule_and_run(draft, spec, current, observed.products)


def _predicted(plan: Plan | None) -> float | None:
    """The plan's predicted tokens/s of the whole job."""
    return None if plan is None else plan.predicted_tokens_per_second()


def _set_progress(draft: Draft, progress: dict[str, Any]) -> None:
    """status.progress, and a Warning Event when the trainer's report has numbers no JSON can
    carry (NaN, infinite): left out of the status, named once per change."""
    old = (draft.derived.get("progress") or {}).get("nonFinite")
    draft.derived["progress"] = progress
    dropped = progress.get("nonFinite")
    if dropped and dropped != old:
        fields = ", ".join(f"status.progress.{name}" for name in dropped)
        message = Reason.NON_FINITE_VALUE.message(fields=fields)
        draft.add_event(EventType.WARNING, Reason.NON_FINITE_VALUE, message)


def _schedule_and_run(
    draft: Draft,
    spec: JobSpec,
    current: list[PodView],
    products: Collection[str] | None = None,
) -> None:
    state, now = draft.state, draft.now
    total = spec.resources.num_nodes
    unbound = [p for p in current if not p.node]
    if unbound:
        bound = total - len(unbound)
        missing = missing_product(spec, products)
        why = scheduler_says(unbound)
        if missing is not None:
            draft.condition(ConditionType.SCHEDULED, False, Reason.NO_NODE_WITH_PRODUCT, missing)
        else:
            message = Reason.WAITING_FOR_GANG.message(bound=bound, total=total)
            reason = Reason.WAITING_FOR_GANG.value
            if why is not None:
                # The scheduler's own words on the first pod it cannot place (Unschedulable, a
                # scheduling gate): the user sees why at once, not after the gang timeout.
                reason, message = why[1].partition(":")[0], f"{message}; pod {why[0]}: {why[1]}"
            draft.condition(ConditionType.SCHEDULED, False, reason, message)
        attempt_start = state.attempt_start_time or now
        timeout = spec.scheduling.gang_timeout_seconds
        # Under Kueue, its waitForPodsReady is the gang timeout (tearing down a gang Kueue
        # counts as admitted would fight it).
        governed = draft.kueue is not None
        if (
            spec.scheduling.gang
            and not governed
            and now - attempt_start >= timedelta(seconds=timeout)
        ):
            draft.gang_timeout(timeout, bound, total, current)
            return
        waiting = jobstatus.NOT_SCHEDULED.format(count=len(unbound))
        draft.waiting(f"{waiting}; pod {why[0]}: {why[1]}" if why else waiting)
        return
    message = Reason.ALL_PODS_BOUND.message(total=total)
    draft.condition(ConditionType.SCHEDULED, True, Reason.ALL_PODS_BOUND, message)
    if not all(p.phase in (PodPhase.RUNNING, PodPhase.SUCCEEDED) for p in current):
        stuck = next((p for p in sorted(current, key=lambda p: p.index) if p.waiting), None)
        if stuck is not None and stuck.waiting is not None:
            # An image that cannot be pulled, a missing Secret: said at once, long before the
            # start timeout counts it as a failure (failure/detect.py).
            kubelet, said = stuck.waiting[0], stuck.waiting[1][:WHY_MAX]
            draft.condition(ConditionType.RUNNING, False, kubelet, f"pod {stuck.name}: {said}")
            draft.waiting(jobstatus.POD_WAITS.format(pod=stuck.name, reason=kubelet, why=said))
            return
        draft.waiting(jobstatus.PODS_STARTING)
        return
    draft.running()
    deadline = spec.run_policy.progress_deadline_seconds
    if deadline is None:
        return
    running_since = state.start_time or now
    last = last_step_time(state.last_step_change, draft.attempt)
    reference = max(running_since, last) if last is not None else running_since
    if now - reference >= timedelta(seconds=deadline):
        seen = state.last_step_change
        step = seen.step if seen is not None and seen.attempt == draft.attempt else None
        message = Reason.PROGRESS_DEADLINE_EXCEEDED.message(deadline=deadline, step=step)
        hang = Failure(FailureClass.RETRYABLE, Reason.PROGRESS_DEADLINE_EXCEEDED, message)
        judged = judge(hang, None, spec.run_policy.pod_failure_policy)
        draft.failure(judged, None, spec, current)
