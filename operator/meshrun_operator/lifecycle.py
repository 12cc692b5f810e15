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

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from meshrun.api import with_defaults
from meshrun.errors import SpecError
from meshrun.planner import plan_job
from meshrun_operator import names
from meshrun_operator.conditions import parse_time
from meshrun_operator.failures import Failure, FailureClass, classify, node_lost
from meshrun_operator.jobspec import JobSettings, parse_settings
from meshrun_operator.observe import Observed, PodView
from meshrun_operator.phases import Draft, Event, Tuning
from meshrun_operator.summary import (
    final_progress,
    last_progress_time,
    merge_progress,
    placement,
)

__all__ = ["Decision", "Evaluation", "Event", "Tuning", "decide", "evaluate", "read_state"]

TERMINAL = ("Succeeded", "Failed")


@dataclass(frozen=True)
class Evaluation:
    """A spec checked once: defaults applied, settings parsed and planned, or the error."""

    spec: Mapping[str, Any]
    """The spec with the CRD's defaults applied."""
    settings: JobSettings | None = None
    """Run policy, scheduling and resources; None when the spec is invalid."""
    plan: Mapping[str, Any] | None = None
    """``Plan.to_dict()``; None when the spec is invalid."""
    plan_status: Mapping[str, Any] | None = None
    """``Plan.status_summary()``: what status.plan shows."""
    error: SpecError | None = None
    """Why the spec cannot run (names the field), or None."""


def evaluate(spec: Mapping[str, Any], name: str) -> Evaluation:
    """Default, parse and plan a spec; any problem becomes an Evaluation with ``error`` set."""
    try:
        defaulted = with_defaults(spec)
        settings = parse_settings(defaulted)
        names.check_job_name(name, settings.num_nodes)
        plan = plan_job(defaulted, name=name)
    except SpecError as error:
        return Evaluation(spec=spec, error=error)
    except (ValueError, TypeError, KeyError) as error:
        # A planner bug must not crash the reconcile loop; it surfaces in the Invalid condition.
        return Evaluation(spec=spec, error=SpecError("spec", f"could not be planned: {error!r}"))
    return Evaluation(
        spec=defaulted, settings=settings, plan=plan.to_dict(), plan_status=plan.status_summary()
    )


def read_state(job: Mapping[str, Any]) -> dict[str, Any]:
    """The operator's bookkeeping from the job's annotation ({} when absent or unreadable)."""
    annotations = (job.get("metadata") or {}).get("annotations") or {}
    try:
        state = json.loads(annotations.get(names.ANNOTATION_STATE) or "{}")
    except ValueError:
        return {}
    return state if isinstance(state, dict) else {}


@dataclass
class Decision:
    """The new status and the side effects that lead there."""

    status: dict[str, Any]
    """The complete status to write in one patch."""
    state: dict[str, Any] = field(default_factory=dict)
    """The operator's bookkeeping for the meshrun.dev/state annotation."""
    create_pods: tuple[int, ...] = ()
    """Pod indices to create for ``status['attempt']`` (with the Service and PodGroup)."""
    delete_pods: tuple[str, ...] = ()
    """Pod names to delete."""
    force_delete: bool = False
    """Delete with grace period 0 (pods on a lost node never confirm a graceful delete)."""
    delete_job: bool = False
    """ttlSecondsAfterFinished has passed: delete the job itself."""
    events: tuple[Event, ...] = ()
    """Kubernetes Events to post on the job."""
    invalid: bool = False
    """The spec is invalid (the create handler raises kopf.PermanentError)."""


def decide(
    job: Mapping[str, Any],
    observed: Observed,
    now: datetime,
    tuning: Tuning | None = None,
    evaluation: Evaluation | None = None,
) -> Decision:
    """Everything the operator should do about ``job`` given what it observes at ``now``."""
    metadata = job.get("metadata") or {}
    name = str(metadata.get("name", ""))
    ev = evaluation or evaluate(job.get("spec") or {}, name)
    draft = Draft(job.get("status") or {}, now, tuning or Tuning(), name, read_state(job))
    draft.status["observedGeneration"] = metadata.get("generation")
    ev = _still_refused(ev, draft.state, metadata.get("generation"))
    if ev.error is not None or ev.settings is None or ev.plan is None:
        draft.invalid(ev.error or SpecError("spec", "could not be evaluated"), observed.pods)
    else:
        plan = dict(ev.plan_status or {})
        draft.status["plan"] = plan
        # Printer columns (kubectl get ptj) read these top-level copies.
        draft.status.update(
            strategy=plan.get("strategy"), layout=plan.get("layout"), gpus=plan.get("gpus")
        )
        _run(draft, ev.settings, ev.plan, observed)
    draft.announce_phase()
    return Decision(
        status=draft.status,
        state=draft.state,
        create_pods=tuple(draft.create),
        delete_pods=tuple(dict.fromkeys(draft.delete)),
        force_delete=draft.force,
        delete_job=draft.delete_job,
        events=tuple(draft.events),
        invalid=draft.is_invalid,
    )


def _still_refused(ev: Evaluation, state: Mapping[str, Any], generation: object) -> Evaluation:
    """A pod template the API server refused stays refused until the spec changes.

    Only the API server can judge a pod template; without this, every resync would try to
    create the refused pod again.
    """
    if (
        ev.error is None
        and state.get("invalidField") == "spec.podTemplate"
        and state.get("invalidGeneration") == generation
    ):
        rule = str(state.get("message") or "").removeprefix("spec.podTemplate: ")
        return Evaluation(spec=ev.spec, error=SpecError("spec.podTemplate", rule))
    return ev


def _run(draft: Draft, settings: JobSettings, plan: Mapping[str, Any], observed: Observed) -> None:
    status, state, now = draft.status, draft.state, draft.now
    draft.revalidated()
    current = [p for p in observed.pods if p.attempt == draft.attempt and not p.deleting]
    stale = [p for p in observed.pods if p.attempt != draft.attempt or p.deleting]
    status["placement"] = placement(plan, current)
    policy = settings.run_policy

    if draft.old_phase in TERMINAL:
        draft.finished(policy, observed.pods)
        return
    if policy.suspend:
        draft.suspend(observed.pods)
        return
    draft.resumed()
    since = parse_time(state.get("activeSince"))
    deadline = policy.active_deadline_seconds
    if deadline is not None and since is not None and now >= since + timedelta(seconds=deadline):
        message = f"the job ran longer than activeDeadlineSeconds={deadline}"
        draft.fail("DeadlineExceeded", message, policy, observed.pods)
        return
    if stale:
        # The previous attempt (or a deleted pod) must be gone before a gang starts again.
        draft.delete.extend(p.name for p in stale if not p.deleting)
        draft.waiting(f"waiting for {len(stale)} pod(s) of an earlier attempt to go away")
        return
    if current and not state.get("attemptStartTime"):
        # Pods exist but the write that recorded their creation was lost (operator killed
        # between the two): start the clocks now rather than never.
        state["attemptStartTime"] = draft.stamp
        if not state.get("activeSince"):
            state["activeSince"] = draft.stamp
    next_attempt = parse_time(state.get("nextAttemptTime"))
    if next_attempt is not None and now < next_attempt:
        draft.waiting(f"backing off until {state.get('nextAttemptTime')}")
        return

    found = _first_failure(current, observed.nodes)
    if found is not None:
        draft.failure(found[0], found[1], settings, current)
        return
    if len(current) == settings.num_nodes and all(p.phase == "Succeeded" for p in current):
        pod0 = next((p for p in current if p.index == 0), None)
        final = final_progress(pod0.summary if pod0 else None)
        if final:
            status["progress"] = {**(status.get("progress") or {}), **final}
        draft.succeed(policy, current)
        return
    if _create_or_wait(draft, settings, current):
        return
    reported = observed.progress
    if reported is None:
        pod0 = next((p for p in current if p.index == 0), None)
        reported = pod0.progress if pod0 is not None else None
    progress = merge_progress(reported, state, draft.attempt, now)
    if progress is not None:
        status["progress"] = progress
    _schedule_and_run(draft, settings, current)


def _first_failure(
    current: list[PodView], nodes: Mapping[str, bool] | None
) -> tuple[Failure, PodView] | None:
    """The first lost or failed pod of the attempt (node loss first: it needs a force delete)."""
    if nodes is not None:
        for pod in current:
            if pod.node and pod.phase not in TERMINAL and not nodes.get(pod.node, False):
                return node_lost(pod.node, nodes.get(pod.node)), pod
    for pod in sorted(current, key=lambda p: p.index):
        if pod.phase == "Failed":
            failure = classify(pod.exit_code, pod.container_reason, pod.pod_reason)
            error = (pod.summary or {}).get("error")
            if isinstance(error, str) and error:
                # The trainer's own last words (termination message) say more than an exit code.
                failure = replace(failure, message=f"{failure.message}; trainer: {error[:300]}")
            return failure, pod
    return None


def _create_or_wait(draft: Draft, settings: JobSettings, current: list[PodView]) -> bool:
    """Create the attempt's missing pods, or notice pods that vanished; True when handled."""
    state, now = draft.state, draft.now
    present = {p.index for p in current}
    missing = [i for i in range(settings.num_nodes) if i not in present]
    if not missing:
        return False
    attempt_start = parse_time(state.get("attemptStartTime"))
    if attempt_start is None:
        draft.create.extend(missing)
        state.update(attemptStartTime=draft.stamp, nextAttemptTime=None)
        if not state.get("activeSince"):
            state["activeSince"] = draft.stamp
        message = f"creating {len(missing)} pod(s) for attempt {draft.attempt}"
        draft.add_event("Normal", "PodsCreated", message)
        draft.waiting(message)
        return True
    if now - attempt_start > timedelta(seconds=draft.tuning.missing_pod_grace_seconds):
        name = names.pod_name(draft.name, missing[0])
        vanished = Failure(FailureClass.RETRYABLE, "PodDeleted", f"pod {name} disappeared")
        draft.failure(vanished, None, settings, current)
        return True
    draft.waiting(f"waiting for {len(missing)} new pod(s) to appear")
    return True


def _schedule_and_run(draft: Draft, settings: JobSettings, current: list[PodView]) -> None:
    state, now = draft.state, draft.now
    total = settings.num_nodes
    unbound = [p for p in current if not p.node]
    if unbound:
        bound = total - len(unbound)
        draft.condition("Scheduled", False, "WaitingForGang", f"{bound} of {total} pods bound")
        attempt_start = parse_time(state.get("attemptStartTime")) or now
        timeout = settings.scheduling.gang_timeout_seconds
        if settings.scheduling.gang and now - attempt_start >= timedelta(seconds=timeout):
            draft.gang_timeout(timeout, bound, total, current)
            return
        draft.waiting(f"{len(unbound)} pod(s) not scheduled yet")
        return
    draft.condition("Scheduled", True, "AllPodsBound", f"all {total} pods bound to nodes")
    if not all(p.phase in ("Running", "Succeeded") for p in current):
        draft.waiting("pods are starting")
        return
    draft.running()
    deadline = settings.run_policy.progress_deadline_seconds
    if deadline is None:
        return
    running_since = parse_time(draft.status.get("startTime")) or now
    last = last_progress_time(state, draft.attempt)
    reference = max(running_since, last) if last is not None else running_since
    if now - reference >= timedelta(seconds=deadline):
        step = state.get("progressStep") if state.get("progressAttempt") == draft.attempt else None
        hang = Failure(
            FailureClass.RETRYABLE,
            "ProgressDeadlineExceeded",
            f"no new training step for {deadline}s (last step: {step}); the trainer looks hung",
        )
        draft.failure(hang, None, settings, current)
