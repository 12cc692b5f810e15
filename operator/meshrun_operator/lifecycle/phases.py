"""The draft of a new status and the phase transitions that edit it (used by lifecycle.decide).

Each method is one transition: it sets the phase, the conditions, the bookkeeping and the side
effects together, so a phase is written in exactly one place per transition. The draft edits the
typed :class:`JobState` and the conditions; :meth:`Draft.status` puts them back together with the
rest of the status (plan, placement, progress) for the one status patch.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from meshrun.api.errors import SpecError
from meshrun.api.spec import JobSpec, RunPolicy
from meshrun_operator import jobstatus
from meshrun_operator.conditions import JOB_ORDER, clear_condition, is_true, set_condition
from meshrun_operator.jobstatus import ConditionType, EventType, Phase, PodPhase, Reason
from meshrun_operator.kueue import KueueActions
from meshrun_operator.lifecycle.failure.classes import Failure, FailureClass
from meshrun_operator.lifecycle.state import InvalidSpec, JobState, LastFailure
from meshrun_operator.seen.views import PodView
from meshrun_operator.timing import Timing


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event to post on the job."""

    type: EventType
    """Normal or Warning."""
    reason: str
    """CamelCase reason."""
    message: str
    """One sentence for people."""


class Draft:
    """A status being edited during one decision, plus the side effects it implies."""

    def __init__(
        self,
        old_status: Mapping[str, Any],
        state: JobState,
        now: datetime,
        timing: Timing,
        job_name: str = "",
    ) -> None:
        # Only the conditions are edited in place (every other key is replaced whole), so they
        # alone are copied: a deep copy of a large job's status costs more than its decision.
        self.derived: dict[str, Any] = dict(old_status)
        self.conditions: list[dict[str, Any]] = [
            dict(c) for c in self.derived.get("conditions") or []
        ]
        self.derived["conditions"] = self.conditions
        self.state = replace(state, phase=state.phase or Phase.PENDING)
        self.old_phase: Phase | None = state.phase
        # Status times have second precision; the clocks keep exactly what is written.
        self.now = now.replace(microsecond=0)
        self.timing = timing
        self.name = job_name
        self.generation: int | None = None
        self.create: list[int] = []
        self.delete: list[str] = []
        self.restore: list[str] = []
        self.delete_job = False
        self.events: list[Event] = []
        self.is_invalid = False
        # Set while Kueue governs the job (queue.py): its Workload's side effects.
        self.kueue: KueueActions | None = None

    # -- small helpers ---------------------------------------------------------------------
    @property
    def attempt(self) -> int:
        return self.state.attempt

    def status(self) -> dict[str, Any]:
        """The complete status: what was derived this time plus the bookkeeping."""
        return {**self.derived, **self.state.to_status()}

    def condition(self, kind: ConditionType, value: bool, reason: str, message: str) -> None:
        set_condition(self.conditions, kind, value, reason, message, self.now, order=JOB_ORDER)

    def clear(self, kind: ConditionType, reason: str, message: str) -> None:
        """Turn a condition False if it exists (never adds a False condition out of nowhere)."""
        clear_condition(self.conditions, kind, reason, message, self.now, order=JOB_ORDER)

    def add_event(self, kind: EventType, reason: str, message: str) -> None:
        self.events.append(Event(kind, str(reason), message))

    def announce_phase(self) -> None:
        """One Event per phase transition, but for a launch's routine ones: Pending (the
        PodsCreated Event tells it) and a job's first Running (its status and Running condition
        tell it; a gang that runs again after a restart or a resume is announced)."""
        phase, state = self.state.phase, self.state
        if phase is None or phase == self.old_phase or phase == Phase.PENDING:
            return
        first_run = phase == Phase.RUNNING and self.old_phase in (None, Phase.PENDING)
        if first_run and state.attempt == state.restarts == state.disruptions == 0:
            return
        warn = phase in (Phase.FAILED, Phase.RESTARTING)
        kind = EventType.WARNING if warn else EventType.NORMAL
        self.add_event(kind, phase.value, self.state.message or phase.value)

    def _delete_all(self, pods: Iterable[PodView], unfinished_only: bool = False) -> None:
        finished = (PodPhase.SUCCEEDED, PodPhase.FAILED)
        for pod in pods:
            if pod.deleting or (unfinished_only and pod.phase in finished):
                continue
            self.delete.append(pod.name)

    def _clean(self, policy: RunPolicy, pods: Iterable[PodView], failed: bool) -> None:
        """cleanPodPolicy after the end: None keeps pods, Running deletes unfinished, All all.

        A failed job never keeps running pods whatever the policy: they would hold GPUs.
        """
        if policy.clean_pod_policy == "All":
            self._delete_all(pods)
        elif policy.clean_pod_policy == "Running" or failed:
            self._delete_all(pods, unfinished_only=True)

    # -- transitions -----------------------------------------------------------------------
    def invalid(self, error: SpecError, generation: int | None, pods: Iterable[PodView]) -> None:
        """A spec that cannot run: no pods, Invalid=True naming the field, phase Failed."""
        self.is_invalid = True
        message = str(error)
        if not is_true(self.conditions, ConditionType.INVALID) or self.state.message != message:
            self.add_event(EventType.WARNING, Reason.INVALID_SPEC, message)
        self.condition(ConditionType.INVALID, True, Reason.INVALID_SPEC, message)
        self.condition(ConditionType.FAILED, True, Reason.INVALID_SPEC, message)
        self.state.phase = Phase.FAILED
        self.state.message = message
        self.state.invalid_spec = InvalidSpec(error.field, error.rule, generation)
        if self.state.completion_time is None:
            self.state.completion_time = self.now
        self._delete_all(pods)

    def revalidated(self) -> None:
        """A spec that was invalid and is now valid starts afresh."""
        if not is_true(self.conditions, ConditionType.INVALID):
            return
        valid = Reason.VALID.message()
        self.condition(ConditionType.INVALID, False, Reason.VALID, valid)
        self.condition(ConditionType.FAILED, False, Reason.VALID, valid)
        self.state.phase, self.state.completion_time = Phase.PENDING, None
        self.state.message, self.state.invalid_spec = "", None
        self.old_phase = None
        self._fresh_attempt(())

    def _fresh_attempt(self, pods: Iterable[PodView]) -> None:
        """The next pods start a new attempt: the current one's, if it started, are going."""
        state = self.state
        if state.attempt_start_time is not None or any(p.attempt == state.attempt for p in pods):
            state.attempt += 1
        state.start_time = state.attempt_start_time = None

    def pods_seen(self) -> None:
        """Pods exist but the write that recorded their creation was lost (the operator was
        killed between the two): start the clocks now rather than never."""
        self.state.attempt_start_time = self.now
        self.state.active_since = self.state.active_since or self.now

    def creating(self, indices: list[int]) -> None:
        """Create the attempt's missing pods; the attempt's first creation starts its clocks and
        fixes the spec generation it runs."""
        self.create.extend(indices)
        if self.state.attempt_start_time is None:
            self.state.attempt_start_time = self.now
            self.state.attempt_generation = self.generation
        self.state.next_attempt_time = None
        self.state.active_since = self.state.active_since or self.now
        message = Reason.PODS_CREATED.message(count=len(indices), attempt=self.attempt)
        self.add_event(EventType.NORMAL, Reason.PODS_CREATED, message)
        self.waiting(message)

    def waiting(self, message: str) -> None:
        if self.state.phase != Phase.RUNNING:
            self.state.phase = Phase.RESTARTING if self.state.restarts else Phase.PENDING
        self.state.message = message

    def running(self) -> None:
        message = Reason.ALL_PODS_RUNNING.message()
        self.state.phase, self.state.message = Phase.RUNNING, message
        self.state.start_time = self.state.start_time or self.now
        self.condition(ConditionType.RUNNING, True, Reason.ALL_PODS_RUNNING, message)
        if is_true(self.conditions, ConditionType.RESTARTING):
            recovered = Reason.RECOVERED.message()
            self.condition(ConditionType.RESTARTING, False, Reason.RECOVERED, recovered)

    def succeed(self, policy: RunPolicy, pods: list[PodView]) -> None:
        message = Reason.COMPLETED.message(count=len(pods))
        self.state.phase, self.state.completion_time = Phase.SUCCEEDED, self.now
        self.state.message = message
        self.clear(ConditionType.RUNNING, Reason.COMPLETED, message)
        self.condition(ConditionType.SUCCEEDED, True, Reason.COMPLETED, message)
        self._clean(policy, pods, failed=False)

    def fail(self, reason: str, message: str, policy: RunPolicy, pods: Iterable[PodView]) -> None:
        self.state.phase, self.state.completion_time = Phase.FAILED, self.now
        self.state.message = message
        self.clear(ConditionType.RUNNING, reason, message)
        self.clear(ConditionType.RESTARTING, reason, message)
        self.condition(ConditionType.FAILED, True, reason, message)
        self._clean(policy, pods, failed=True)

    def finished(self, policy: RunPolicy, pods: Iterable[PodView]) -> None:
        """After Succeeded/Failed: keep applying cleanPodPolicy, then honour the TTL."""
        self._clean(policy, pods, failed=self.state.phase == Phase.FAILED)
        ttl = policy.ttl_seconds_after_finished
        done = self.state.completion_time
        if ttl is not None and done is not None and self.now >= done + timedelta(seconds=ttl):
            self.delete_job = True

    def suspend(self, pods: Iterable[PodView]) -> None:
        """Suspended (by a user or Kueue): no pods at all; the deadline clock stops, and a
        resume starts a new attempt (the old pods may still be terminating then)."""
        pods = list(pods)
        self._delete_all(pods)
        self._fresh_attempt(pods)
        message = jobstatus.JOB_SUSPENDED
        self.state.phase, self.state.message = Phase.SUSPENDED, message
        self.state.active_since = self.state.next_attempt_time = None
        self.condition(ConditionType.SUSPENDED, True, Reason.SUSPENDED, Reason.SUSPENDED.message())
        self.clear(ConditionType.RUNNING, Reason.SUSPENDED, message)

    def resumed(self) -> None:
        if is_true(self.conditions, ConditionType.SUSPENDED):
            resumed = Reason.RESUMED.message()
            self.condition(ConditionType.SUSPENDED, False, Reason.RESUMED, resumed)

    def failure(
        self, failure: Failure, pod: PodView | None, spec: JobSpec, current: list[PodView]
    ) -> None:
        """A failed, lost or hung pod: restart the whole gang, or fail the job."""
        self.state.last_failure = LastFailure(
            pod=pod.name if pod else None,
            reason=str(failure.reason),
            message=failure.message,
            kind=failure.kind,
            exit_code=pod.exit_code if pod else None,
            time=self.now,
        )
        policy = spec.run_policy
        restarts = self.state.restarts
        described = f"pod {pod.name}: {failure.message}" if pod else failure.message
        if failure.kind is FailureClass.PERMANENT:
            message = jobstatus.PERMANENT_FAILURE.format(failure=described)
            self.fail(failure.reason, message, policy, current)
            return
        if failure.kind is FailureClass.IGNORED:
            # A disruption: the gang restarts, and backoffLimit is not charged.
            self.state.disruptions += 1
            self._restart(failure, described, 1, current)
            return
        if restarts >= policy.backoff_limit:
            limit = policy.backoff_limit
            message = Reason.BACKOFF_LIMIT_EXCEEDED.message(failure=described, limit=limit)
            self.fail(Reason.BACKOFF_LIMIT_EXCEEDED, message, policy, current)
            return
        self.state.restarts = restarts + 1
        self._restart(failure, described, restarts + 1, current)

    def _restart(
        self, failure: Failure, described: str, retries: int, current: list[PodView]
    ) -> None:
        self._next_attempt(retries, current)
        restarting = jobstatus.RESTARTING_GANG.format(failure=described)
        self.state.phase, self.state.message = Phase.RESTARTING, restarting
        self.condition(ConditionType.RESTARTING, True, failure.reason, described)
        self.clear(ConditionType.RUNNING, failure.reason, described)
        self.add_event(EventType.WARNING, failure.reason, restarting)

    def _next_attempt(self, retries: int, current: list[PodView]) -> None:
        """Tear the attempt down; the next one starts after an exponential backoff."""
        self._delete_all(current)
        delay = self.timing.backoff(retries)
        self.state.attempt, self.state.start_time = self.attempt + 1, None
        self.state.attempt_start_time = None
        self.state.next_attempt_time = self.now + timedelta(seconds=delay)

    def gang_timeout(self, timeout: int, bound: int, total: int, current: list[PodView]) -> None:
        """Not every pod was bound in time: free the bound ones and retry (not a restart)."""
        self.state.gang_retries += 1
        message = Reason.GANG_TIMEOUT.message(bound=bound, total=total, timeout=timeout)
        self._next_attempt(self.state.gang_retries, current)
        self.state.message = message
        self.condition(ConditionType.SCHEDULED, False, Reason.GANG_TIMEOUT, message)
        self.add_event(EventType.WARNING, Reason.GANG_TIMEOUT, message)
