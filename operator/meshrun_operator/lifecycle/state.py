"""The operator's bookkeeping of one job, typed, and its one serialization to and from status.

Clocks and attempt counters live in declared fields of the job's status: only the operator (with
the ``/status`` subresource) writes there, so a user who can edit the spec cannot move a deadline.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from meshrun.api.read import write_section
from meshrun_operator.clock import parse_time
from meshrun_operator.jobstatus import Phase
from meshrun_operator.lifecycle.failure.classes import FailureClass


@dataclass(frozen=True)
class LastFailure:
    """The failure that caused the last restart or the end of the job."""

    pod: str | None
    """The pod that failed, or None (a hang or a vanished pod)."""
    reason: str
    """CamelCase reason (the failure table's, or one of jobstatus.Reason)."""
    message: str
    """One sentence for people."""
    kind: FailureClass = field(metadata={"key": "class"})
    """Retryable or Permanent."""
    exit_code: int | None
    """The trainer container's exit code, when it had one."""
    time: datetime
    """When the operator saw it."""


@dataclass(frozen=True)
class StepChange:
    """When the operator last saw the training step change (hang detection)."""

    attempt: int
    """The attempt the step belongs to."""
    step: int | None
    """The step rank 0 reported."""
    time: datetime
    """The operator's clock when the step changed (pods' clocks may drift)."""


@dataclass(frozen=True)
class InvalidSpec:
    """The spec error behind the Invalid condition, and the generation it was found in."""

    field: str
    """The offending field, e.g. ``spec.podTemplate``."""
    rule: str
    """What is wrong with it."""
    generation: int | None
    """metadata.generation of the refused spec: a new generation is judged again."""


@dataclass
class JobState:
    """Everything the operator carries from one reconcile of a job to the next."""

    phase: Phase | None = None
    """The job's phase; None before the first reconcile."""
    attempt: int = 0
    """The current attempt (0 first); every pod is labelled with it."""
    restarts: int = 0
    """Whole-gang restarts so far (counted against backoffLimit)."""
    disruptions: int = 0
    """Whole-gang restarts not counted against backoffLimit (preemption, eviction, drain, a
    lost node, podFailurePolicy Ignore)."""
    attempt_generation: int | None = None
    """The spec generation the current attempt's pods were built from."""
    message: str = ""
    """What the job is doing or waiting for, in one sentence."""
    start_time: datetime | None = None
    """When every pod of the current attempt ran."""
    completion_time: datetime | None = None
    """When the job succeeded or failed."""
    attempt_start_time: datetime | None = None
    """When the current attempt's pods were created (gang timeout, vanished pods)."""
    active_since: datetime | None = None
    """When the job first had pods since it was created or resumed (activeDeadlineSeconds)."""
    next_attempt_time: datetime | None = None
    """The next attempt starts no earlier (exponential backoff)."""
    gang_retries: int = 0
    """Attempts torn down because the gang was not bound in time."""
    last_failure: LastFailure | None = None
    """The failure behind the last restart or the end of the job."""
    last_step_change: StepChange | None = None
    """When the training step last changed."""
    invalid_spec: InvalidSpec | None = None
    """The spec error the Invalid condition reports, if any."""

    def to_status(self) -> dict[str, Any]:
        """The status fields this state owns, each field under its CRD key (the camelCase of
        its name); None removes a field in the merge patch."""
        status: dict[str, Any] = write_section(self, nulls=True)
        return status

    @classmethod
    def from_job(cls, job: Mapping[str, Any]) -> JobState:
        """The state in the job's status."""
        status = job.get("status") or {}
        state = cls(
            phase=_phase(status.get("phase")),
            attempt=_int(status.get("attempt")) or 0,
            restarts=_int(status.get("restarts")) or 0,
            start_time=parse_time(status.get("startTime")),
            completion_time=parse_time(status.get("completionTime")),
        )
        _read(state, status)
        return state


def _read(state: JobState, source: Mapping[str, Any]) -> None:
    message = source.get("message")
    state.message = message if isinstance(message, str) else ""
    state.attempt_start_time = parse_time(source.get("attemptStartTime"))
    state.active_since = parse_time(source.get("activeSince"))
    state.next_attempt_time = parse_time(source.get("nextAttemptTime"))
    state.gang_retries = _int(source.get("gangRetries")) or 0
    state.disruptions = _int(source.get("disruptions")) or 0
    state.attempt_generation = _int(source.get("attemptGeneration"))
    state.last_failure = _last_failure(source.get("lastFailure"))
    state.last_step_change = _step_change(source.get("lastStepChange"))
    state.invalid_spec = _invalid_spec(source.get("invalidSpec"))


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _phase(value: object) -> Phase | None:
    try:
        return Phase(str(value))
    except ValueError:
        return None


def _last_failure(value: object) -> LastFailure | None:
    if not isinstance(value, Mapping):
        return None
    time, reason = parse_time(value.get("time")), _str(value.get("reason"))
    if time is None or reason is None:
        return None
    try:
        kind = FailureClass(value.get("class"))
    except ValueError:
        kind = FailureClass.RETRYABLE
    return LastFailure(
        pod=_str(value.get("pod")),
        reason=reason,
        message=_str(value.get("message")) or "",
        kind=kind,
        exit_code=_int(value.get("exitCode")),
        time=time,
    )


def _step_change(value: object) -> StepChange | None:
    if not isinstance(value, Mapping):
        return None
    attempt, time = _int(value.get("attempt")), parse_time(value.get("time"))
    if attempt is None or time is None:
        return None
    return StepChange(attempt=attempt, step=_int(value.get("step")), time=time)


def _invalid_spec(value: object) -> InvalidSpec | None:
    if not isinstance(value, Mapping):
        return None
    field, rule = _str(value.get("field")), _str(value.get("rule"))
    if field is None or rule is None:
        return None
    return InvalidSpec(field=field, rule=rule, generation=_int(value.get("generation")))
