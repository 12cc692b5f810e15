"""The draft of a new status and the phase transitions that edit it (used by lifecycle.decide).

Each method is one transition: it sets the phase, the conditions, the bookkeeping and the side
effects together, so a phase string is written in exactly one place per transition.

Two dicts are edited: ``status`` holds only what the CRD's status schema declares (anything else
would be pruned by the API server), and ``state`` holds the operator's own bookkeeping (attempt
start, backoff deadline, last progress), stored in the job's ``meshrun.dev/state`` annotation the
way kopf keeps its handler progress in annotations.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from meshrun.errors import SpecError
from meshrun_operator.conditions import (
    clear_condition,
    format_time,
    is_true,
    parse_time,
    set_condition,
)
from meshrun_operator.failures import Failure, FailureClass
from meshrun_operator.jobspec import JobSettings, RunPolicy
from meshrun_operator.observe import PodView


@dataclass(frozen=True)
class Tuning:
    """Operator-wide timing knobs (command-line flags), not part of any job spec."""

    backoff_base_seconds: float = 10.0
    """Delay before the first retry; doubles with every further retry."""
    backoff_max_seconds: float = 300.0
    """Upper bound of the retry delay."""
    missing_pod_grace_seconds: float = 10.0
    """How long a just-created pod may be missing from the watch cache before it counts as
    deleted (the cache lags the create call by milliseconds to seconds)."""

    def backoff(self, retries: int) -> float:
        """Exponential backoff: base * 2^(retries-1), capped (retries counts from 1)."""
        delay = self.backoff_base_seconds * 2 ** max(retries - 1, 0)
        return float(min(delay, self.backoff_max_seconds))


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event to post on the job."""

    type: str
    """Normal or Warning."""
    reason: str
    """CamelCase reason."""
    message: str
    """One sentence for people."""


class Draft:
    """A status being edited during one decision, plus the side effects it implies."""

    def __init__(
        self,
        old: Mapping[str, Any],
        now: datetime,
        tuning: Tuning,
        job_name: str = "",
        state: Mapping[str, Any] | None = None,
    ) -> None:
        self.status: dict[str, Any] = copy.deepcopy(dict(old))
        self.state: dict[str, Any] = copy.deepcopy(dict(state or {}))
        self.conditions: list[dict[str, Any]] = self.status.setdefault("conditions", [])
        self.old_phase: str | None = old.get("phase")
        self.now = now
        self.stamp = format_time(now)
        self.tuning = tuning
        self.name = job_name
        self.create: list[int] = []
        self.delete: list[str] = []
        self.force = False
        self.delete_job = False
        self.events: list[Event] = []
        self.is_invalid = False
        self.status.setdefault("phase", "Pending")
        self.status.setdefault("attempt", 0)
        self.status.setdefault("restarts", 0)

    # -- small helpers ---------------------------------------------------------------------
    @property
    def attempt(self) -> int:
        return int(self.status.get("attempt") or 0)

    def condition(self, kind: str, value: bool, reason: str, message: str) -> None:
        set_condition(self.conditions, kind, value, reason, message, self.now)

    def clear(self, kind: str, reason: str, message: str) -> None:
        """Turn a condition False if it exists (never adds a False condition out of nowhere)."""
        clear_condition(self.conditions, kind, reason, message, self.now)

    def add_event(self, kind: str, reason: str, message: str) -> None:
        self.events.append(Event(kind, reason, message))

    def announce_phase(self) -> None:
        """One Event per phase transition (the issue asks for an Event on every transition)."""
        phase = self.status.get("phase")
        if phase != self.old_phase:
            kind = "Warning" if phase in ("Failed", "Restarting") else "Normal"
            self.add_event(kind, str(phase), str(self.state.get("message") or phase))

    def _delete_all(self, pods: Iterable[PodView], unfinished_only: bool = False) -> None:
        for pod in pods:
            if pod.deleting or (unfinished_only and pod.phase in ("Succeeded", "Failed")):
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
    def invalid(self, error: SpecError, pods: Iterable[PodView]) -> None:
        """A spec that cannot run: no pods, Invalid=True naming the field, phase Failed."""
        self.is_invalid = True
        message = str(error)
        if not is_true(self.conditions, "Invalid") or self.state.get("message") != message:
            self.add_event("Warning", "InvalidSpec", message)
        self.condition("Invalid", True, "InvalidSpec", message)
        self.condition("Failed", True, "InvalidSpec", message)
        self.status["phase"] = "Failed"
        self.state.update(
            message=message,
            invalidField=error.field,
            invalidGeneration=self.status.get("observedGeneration"),
        )
        if not self.status.get("completionTime"):
            self.status["completionTime"] = self.stamp
        self._delete_all(pods)

    def revalidated(self) -> None:
        """A spec that was invalid and is now valid starts afresh."""
        if not is_true(self.conditions, "Invalid"):
            return
        self.condition("Invalid", False, "Valid", "the spec is valid")
        self.condition("Failed", False, "Valid", "the spec is valid")
        self.status.update(phase="Pending", completionTime=None)
        self.state.update(message="", invalidField=None, invalidGeneration=None)
        self.old_phase = None

    def waiting(self, message: str) -> None:
        if self.status.get("phase") != "Running":
            self.status["phase"] = "Restarting" if self.status.get("restarts") else "Pending"
        self.state["message"] = message

    def running(self) -> None:
        self.status["phase"] = "Running"
        self.state["message"] = "all pods are running"
        if not self.status.get("startTime"):
            self.status["startTime"] = self.stamp
        self.condition("Running", True, "AllPodsRunning", "all pods are running")
        if is_true(self.conditions, "Restarting"):
            self.condition("Restarting", False, "Recovered", "the new attempt is running")

    def succeed(self, policy: RunPolicy, pods: list[PodView]) -> None:
        message = f"all {len(pods)} pods completed successfully"
        self.status.update(phase="Succeeded", completionTime=self.stamp)
        self.state["message"] = message
        self.clear("Running", "Completed", message)
        self.condition("Succeeded", True, "Completed", message)
        self._clean(policy, pods, failed=False)

    def fail(self, reason: str, message: str, policy: RunPolicy, pods: Iterable[PodView]) -> None:
        self.status.update(phase="Failed", completionTime=self.stamp)
        self.state.update(message=message, reason=reason)
        self.clear("Running", reason, message)
        self.clear("Restarting", reason, message)
        self.condition("Failed", True, reason, message)
        self._clean(policy, pods, failed=True)

    def finished(self, policy: RunPolicy, pods: Iterable[PodView]) -> None:
        """After Succeeded/Failed: keep applying cleanPodPolicy, then honour the TTL."""
        self._clean(policy, pods, failed=self.status.get("phase") == "Failed")
        ttl = policy.ttl_seconds_after_finished
        done = parse_time(self.status.get("completionTime"))
        if ttl is not None and done is not None and self.now >= done + timedelta(seconds=ttl):
            self.delete_job = True

    def suspend(self, pods: Iterable[PodView]) -> None:
        """Suspended (by a user or Kueue): no pods at all; the deadline clock stops."""
        self._delete_all(pods)
        self.status.update(phase="Suspended", startTime=None)
        self.state.update(
            message="the job is suspended",
            activeSince=None,
            attemptStartTime=None,
            nextAttemptTime=None,
        )
        self.condition("Suspended", True, "Suspended", "spec.runPolicy.suspend is true")
        self.clear("Running", "Suspended", "the job is suspended")

    def resumed(self) -> None:
        if is_true(self.conditions, "Suspended"):
            self.condition("Suspended", False, "Resumed", "spec.runPolicy.suspend is false")

    def failure(
        self, failure: Failure, pod: PodView | None, settings: JobSettings, current: list[PodView]
    ) -> None:
        """A failed, lost or hung pod: restart the whole gang, or fail the job."""
        self.state["lastFailure"] = {
            "pod": pod.name if pod else None,
            "reason": failure.reason,
            "message": failure.message,
            "class": failure.kind.value,
            "exitCode": pod.exit_code if pod else None,
            "time": self.stamp,
        }
        policy = settings.run_policy
        restarts = int(self.status.get("restarts") or 0)
        where = f"pod {pod.name}: " if pod else ""
        if failure.kind is FailureClass.PERMANENT:
            self.fail(failure.reason, f"{where}{failure.message} (permanent)", policy, current)
            return
        if restarts >= policy.backoff_limit:
            message = (
                f"{where}{failure.message}; the backoffLimit of {policy.backoff_limit} "
                "restart(s) is used up"
            )
            self.fail("BackoffLimitExceeded", message, policy, current)
            return
        self.force = self.force or failure.reason == "NodeLost"
        self.status["restarts"] = restarts + 1
        self._next_attempt(restarts + 1, current)
        message = f"{where}{failure.message}"
        self.status["phase"] = "Restarting"
        self.state["message"] = f"{message}; restarting the whole gang"
        self.condition("Restarting", True, failure.reason, message)
        self.clear("Running", failure.reason, message)
        self.add_event("Warning", failure.reason, f"{message}; restarting the whole gang")

    def _next_attempt(self, retries: int, current: list[PodView]) -> None:
        """Tear the attempt down; the next one starts after an exponential backoff."""
        self._delete_all(current)
        delay = self.tuning.backoff(retries)
        self.status.update(attempt=self.attempt + 1, startTime=None)
        self.state.update(
            attemptStartTime=None,
            nextAttemptTime=format_time(self.now + timedelta(seconds=delay)),
        )

    def gang_timeout(self, timeout: int, bound: int, total: int, current: list[PodView]) -> None:
        """Not every pod was bound in time: free the bound ones and retry (not a restart)."""
        retries = int(self.state.get("gangRetries") or 0) + 1
        self.state["gangRetries"] = retries
        message = (
            f"only {bound} of {total} pods were bound within gangTimeoutSeconds={timeout}; "
            "released them to retry later"
        )
        self._next_attempt(retries, current)
        self.state["message"] = message
        self.condition("Scheduled", False, "GangTimeout", message)
        self.add_event("Warning", "GangTimeout", message)
