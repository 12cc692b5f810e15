"""What went wrong with the running attempt, if anything: the first failure, classified.

In order: a pod of the attempt deleted by someone else (a disruption when it was a
DisruptionTarget), a pod whose node is gone or NotReady for longer than the toleration, a failed
pod (the exit-code table), a pod whose containers cannot start (an image that cannot be pulled,
a missing Secret, runAsNonRoot with a root image) for longer than the start timeout. The job's
podFailurePolicy then decides the class (policy.py).

Also here: which nodes count as lost, so that pods on them that must go are force-deleted (no
kubelet will confirm a graceful deletion there).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from datetime import datetime

from meshrun.api.policyspec import PodFailurePolicy
from meshrun_operator.jobstatus import PodPhase, Reason
from meshrun_operator.lifecycle.failure.classes import (
    CANNOT_START,
    HOPELESS,
    Failure,
    FailureClass,
    cannot_start,
    classify,
    deleted,
    disruption,
    from_trainer,
    node_lost,
)
from meshrun_operator.lifecycle.failure.policy import judge
from meshrun_operator.seen.views import Observed, PodView
from meshrun_operator.timing import Timing

Found = tuple[Failure, PodView]


def first_failure(
    attempt: int,
    current: list[PodView],
    observed: Observed,
    policy: PodFailurePolicy | None,
    timing: Timing,
    now: datetime,
    attempt_start: datetime | None,
) -> Found | None:
    """The first thing that ends the attempt, with its pod, judged by the job's policy."""
    lost = lost_nodes(observed, timing, now)
    found = (
        _deleted(attempt, observed, lost)
        or _lost(current, observed, lost, timing, now, attempt_start)
        or _failed(current)
        or _stuck(current, timing, now, attempt_start)
    )
    if found is None:
        return None
    failure, pod = found
    return judge(failure, pod, policy), pod


def _deleted(attempt: int, observed: Observed, lost: dict[str, Failure]) -> Found | None:
    """A pod of the attempt that someone else deleted (the operator deletes the pods of an
    attempt only as it ends the attempt), still terminating or already gone. One whose node is
    lost went with its node (the taint manager or the pod garbage collector cleaning up)."""
    pods = [p for p in observed.pods if p.attempt == attempt and p.deleting]
    pods += [p for p in observed.gone if p.attempt == attempt]
    for pod in sorted(pods, key=lambda p: p.index):
        if pod.phase == PodPhase.SUCCEEDED:
            continue
        if pod.phase == PodPhase.FAILED:
            return _classified(pod), pod
        failure = classify(None, None, pod.pod_reason)
        target = pod.disruption or (failure.reason if failure.kind.value == "Ignored" else None)
        if target is None and pod.node in lost:
            return lost[pod.node], pod
        return deleted(target), pod
    return None


def lost_nodes(observed: Observed, timing: Timing, now: datetime) -> dict[str, Failure]:
    """Nodes of the job's pods (deleted ones included) that are given up: deleted, or NotReady
    for at least ``timing.node_toleration_seconds`` (a shorter blip kills nothing)."""
    if observed.nodes is None:
        return {}
    lost = {}
    for pod in (*observed.pods, *observed.foreign, *observed.gone):
        node = pod.node
        if not node or node in lost:
            continue
        ready = observed.nodes.get(node)
        if ready is None:
            lost[node] = node_lost(node, None)
        elif not ready:
            waited = (now - observed.not_ready_since.get(node, now)).total_seconds()
            if waited >= timing.node_toleration_seconds:
                lost[node] = node_lost(node, False, waited)
    return lost


def force_deletes(
    observed: Observed, deletes: Iterable[str], timing: Timing, now: datetime
) -> set[str]:
    """Pods to delete with grace period 0: those on lost nodes that are being deleted (by
    anyone) or that this decision deletes. Anything else deletes gracefully."""
    lost = lost_nodes(observed, timing, now)
    going = set(deletes)
    return {
        p.name
        for p in (*observed.pods, *observed.foreign)
        if p.node in lost and (p.deleting or p.name in going)
    }


def _lost(
    current: list[PodView],
    observed: Observed,
    lost: dict[str, Failure],
    timing: Timing,
    now: datetime,
    attempt_start: datetime | None,
) -> Found | None:
    """A pod of the attempt on a ``lost`` node. A pod that came to a node already NotReady
    gets the whole toleration from its own start (as the taint manager counts it): the node's
    return may reach the operator after the pod's binding does."""
    finished = (PodPhase.SUCCEEDED, PodPhase.FAILED)
    for pod in sorted(current, key=lambda p: p.index):
        if pod.node not in lost or pod.phase in finished:
            continue
        if observed.nodes is not None and pod.node not in observed.nodes:
            return lost[pod.node], pod  # a deleted node: nothing to wait for
        since = observed.not_ready_since.get(pod.node)
        arrived = pod.started_at or attempt_start
        waited = (now - max(since, arrived)).total_seconds() if since and arrived else None
        if waited is not None and waited < timing.node_toleration_seconds:
            continue
        return lost[pod.node], pod
    return None


def _classified(pod: PodView) -> Failure:
    failure = classify(pod.exit_code, pod.container_reason, pod.pod_reason)
    if failure.kind == FailureClass.RETRYABLE:  # the trainer knows better than exit 1
        failure = from_trainer(pod.summary) or failure
    if pod.disruption is not None and failure.kind == FailureClass.RETRYABLE:
        # The cluster was taking the pod away (a drain's SIGTERM, a node shutting down): the
        # exit it caused is a disruption. A permanent verdict stands: a restart would repeat it.
        failure = disruption(Reason.DISRUPTED, Reason.DISRUPTED.message(why=pod.disruption))
    error = (pod.summary or {}).get("error")
    if isinstance(error, str) and error:
        # The trainer's own last words (termination message) say more than an exit code.
        failure = replace(failure, message=f"{failure.message}; trainer: {error[:300]}")
    return failure


def _failed(current: list[PodView]) -> Found | None:
    for pod in sorted(current, key=lambda p: p.index):
        if pod.phase == PodPhase.FAILED:
            return _classified(pod), pod
    return None


def _stuck(
    current: list[PodView], timing: Timing, now: datetime, attempt_start: datetime | None
) -> Found | None:
    """A pod whose container waits in a reason that needs a change to clear, for longer than
    ``timing.start_failure_seconds`` since the kubelet took it on (at once for a hopeless one)."""
    for pod in sorted(current, key=lambda p: p.index):
        if pod.waiting is None or pod.waiting[0] not in CANNOT_START:
            continue
        reason, message = pod.waiting
        since = pod.started_at or attempt_start or now
        waited = max((now - since).total_seconds(), 0.0)
        if reason in HOPELESS or waited >= timing.start_failure_seconds:
            return cannot_start(reason, message, waited), pod
    return None
