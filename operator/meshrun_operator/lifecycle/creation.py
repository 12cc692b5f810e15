"""Creating an attempt's pods: what is missing, what is in flight, what the API server refused,
and whose pods still hold the names (decisions on a Draft, used by lifecycle.decide).

Creation tracks expectations the way the Job controller does: a pod whose create was sent but
which the watch has not shown yet is in flight (``Observed.expected``), not missing, so nothing
is created twice and nothing counts as vanished however long a large job takes to appear. A pod
missing with no create in flight was never created (the operator died between two creates, or
the API server refused it) and is created now, without counting a restart; only a pod missing
after the whole gang ran has vanished. Children are recognized by their controller reference
(the job's API group, kind, name and uid): pods with the job's name label but another owner (an
earlier job of the same name, or a controller of another kind) are waited for, and orphans (no
controller) are deleted and replaced, never adopted silently.
"""

from __future__ import annotations

from datetime import timedelta

from meshrun.api.spec import JobSpec
from meshrun.planner.ranks import compress_ranks
from meshrun.rules.names import pod_name
from meshrun_operator import jobstatus, names
from meshrun_operator.clock import format_time, parse_time
from meshrun_operator.conditions import find, is_true
from meshrun_operator.jobstatus import ConditionType, EventType, Reason
from meshrun_operator.lifecycle.failure.classes import Failure, FailureClass
from meshrun_operator.lifecycle.failure.policy import judge
from meshrun_operator.lifecycle.phases import Draft
from meshrun_operator.seen.views import Observed, PodView, Refusal


def predecessors(draft: Draft, observed: Observed) -> bool:
    """Delete orphans; True (and wait) while pods of another owner hold the job's names."""
    orphans = (p for p in observed.foreign if p.owner_uid is None and not p.other_controller)
    draft.delete.extend(p.name for p in orphans if not p.deleting)
    if not observed.foreign:
        return False
    message = jobstatus.WAITING_FOR_PREDECESSOR.format(count=len(observed.foreign), job=draft.name)
    draft.waiting(message)
    return True


def create_or_wait(draft: Draft, spec: JobSpec, current: list[PodView], observed: Observed) -> bool:
    """Create the attempt's missing pods, or wait for them; True when something is missing."""
    total = spec.resources.num_nodes
    present = {p.index for p in current}
    missing = [i for i in range(total) if i not in present]
    if not missing:
        if observed.refused is not None:
            # A child created again while the gang runs (restore) was refused: the job says so
            # and runs on; the next pass tries again.
            _child_refused(draft, observed.refused)
            return False
        draft.restore.extend(observed.missing_children)
        if is_true(draft.conditions, ConditionType.CREATION_REFUSED):
            done = Reason.CREATED.message(attempt=draft.attempt)
            draft.condition(ConditionType.CREATION_REFUSED, False, Reason.CREATED, done)
        return False
    if observed.refused is not None:
        refused(draft, observed.refused)
        return True
    unknown = [i for i in missing if pod_name(draft.name, i) not in observed.expected]
    if not unknown:
        draft.waiting(jobstatus.WAITING_FOR_NEW_PODS.format(count=len(missing)))
        return True
    if draft.state.start_time is not None:
        # The whole gang ran, and a pod is gone without a trace of its deletion (the operator
        # was down meanwhile): it vanished.
        pod = pod_name(draft.name, unknown[0])
        gone = Failure(
            FailureClass.RETRYABLE, Reason.POD_DELETED, Reason.POD_DELETED.message(pod=pod)
        )
        judged = judge(gone, None, spec.run_policy.pod_failure_policy)
        draft.failure(judged, None, spec, current)
        return True
    if predecessors(draft, observed) or _backing_off(draft) or _gang_expired(draft, spec, current):
        return True
    draft.creating(unknown)
    return True


def _backing_off(draft: Draft) -> bool:
    """True while a restart's backoff or a refused creation's retry delay runs."""
    until = draft.state.next_attempt_time
    if until is None or draft.now >= until:
        return False
    if is_true(draft.conditions, ConditionType.CREATION_REFUSED):
        draft.waiting(draft.state.message)  # it says what was refused and when it is retried
    else:
        draft.waiting(jobstatus.BACKING_OFF.format(until=format_time(until)))
    return True


def _gang_expired(draft: Draft, spec: JobSpec, current: list[PodView]) -> bool:
    """A partial gang (some pods refused) holds its nodes no longer than gangTimeoutSeconds."""
    start, scheduling = draft.state.attempt_start_time, spec.scheduling
    timeout = scheduling.gang_timeout_seconds
    if not scheduling.gang or start is None or draft.now - start < timedelta(seconds=timeout):
        return False
    bound = sum(1 for p in current if p.node)
    draft.gang_timeout(timeout, bound, spec.resources.num_nodes, current)
    return True


def refused(draft: Draft, refusal: Refusal) -> None:
    """The API server refused some creates of the last pass: the ones it created are in flight
    (the attempt started with them), the job says why in CreationRefused and a Warning Event,
    and the rest is retried after a delay that doubles with the time the refusal has lasted,
    and no sooner than the API server's Retry-After (capped like the restart backoff)."""
    created = [i for i in refusal.sent if i not in refusal.indices]
    state, now = draft.state, draft.now
    if created and state.attempt_start_time is None:
        state.attempt_start_time, state.attempt_generation = now, draft.generation
        state.active_since = state.active_since or now
    if created:
        message = Reason.PODS_CREATED.message(count=len(created), attempt=draft.attempt)
        draft.add_event(EventType.NORMAL, Reason.PODS_CREATED, message)
    what = _refused_what(draft, refusal)
    old = find(draft.conditions, ConditionType.CREATION_REFUSED)
    since = parse_time((old or {}).get("lastTransitionTime")) if old else None
    if old is None or old.get("status") != "True" or since is None:
        since = now
    timing = draft.timing
    lasted = (now - since).total_seconds()
    delay = min(
        max(lasted, timing.backoff_base_seconds, refusal.retry_after or 0.0),
        timing.backoff_max_seconds,
    )
    state.next_attempt_time = now + timedelta(seconds=delay)
    _tell_refusal(draft, refusal, what)
    until = format_time(state.next_attempt_time)
    if refusal.reason == Reason.NAME_CONFLICT:
        draft.waiting(jobstatus.NAME_TAKEN.format(why=refusal.message, until=until))
    else:
        draft.waiting(
            jobstatus.CREATION_REFUSED.format(what=what, why=refusal.message, until=until)
        )


NAMED_PODS = 8
"""A refusal of more pods than this names their indices as ranges, not each pod: a refused
gang of thousands would otherwise put every name in the condition, the status message and
the Event (hundreds of KB in the job's object)."""


def _refused_what(draft: Draft, refusal: Refusal) -> str:
    indices = refusal.indices
    if len(indices) > NAMED_PODS:
        return f"{len(indices)} pods of {draft.name} (indices {compress_ranks(indices)})"
    if indices:
        return f"pod(s) {', '.join(pod_name(draft.name, i) for i in indices)}"
    return refusal.what or f"Service {names.service_name(draft.name)}"


def _tell_refusal(draft: Draft, refusal: Refusal, what: str) -> None:
    """CreationRefused=True with the refusal's reason, and a Warning Event when it is news."""
    old = find(draft.conditions, ConditionType.CREATION_REFUSED)
    conflict = refusal.reason == Reason.NAME_CONFLICT
    text = refusal.message if conflict else f"{what}: {refusal.message}"
    if old is None or old.get("status") != "True" or old.get("message") != text:
        draft.add_event(EventType.WARNING, refusal.reason, text)
    draft.condition(ConditionType.CREATION_REFUSED, True, refusal.reason, text)


def _child_refused(draft: Draft, refusal: Refusal) -> None:
    """A child of a running gang could not be created again: said, the gang untouched."""
    _tell_refusal(draft, refusal, _refused_what(draft, refusal))
