"""The operator's timing knobs (its command-line flags), which no job spec sets."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Timing:
    """Operator-wide timing knobs (command-line flags), not part of any job spec."""

    backoff_base_seconds: float = 10.0
    """Delay before the first retry; doubles with every further retry."""
    backoff_max_seconds: float = 300.0
    """Upper bound of the retry delay."""
    expectations_timeout_seconds: float = 60.0
    """How long a create or delete may stay unseen by the watch before it is taken as lost
    (until then a just-created pod missing from the watch cache is in flight, not missing)."""
    node_toleration_seconds: float = 300.0
    """How long a node may be NotReady before its pods are given up (Kubernetes' default
    not-ready toleration); a shorter blip kills nothing."""
    start_failure_seconds: float = 120.0
    """How long a container may wait in a reason that needs a change to clear (ErrImagePull,
    CreateContainerConfigError, ...) before the pod counts as failed."""
    error_backoff_base_seconds: float = 2.0
    """Delay before a job whose reconcile failed is reconciled again; doubles with every
    further failure in a row."""
    error_backoff_max_seconds: float = 300.0
    """Upper bound of that delay."""

    def backoff(self, retries: int) -> float:
        """Exponential backoff: base * 2^(retries-1), capped (retries counts from 1)."""
        return _doubled(retries, self.backoff_base_seconds, self.backoff_max_seconds)

    def error_backoff(self, failures: int) -> float:
        """The delay after ``failures`` failed reconciles of a job in a row (from 1)."""
        return _doubled(failures, self.error_backoff_base_seconds, self.error_backoff_max_seconds)


def _doubled(times: int, base: float, cap: float) -> float:
    """base * 2^(times-1), at most ``cap``."""
    return float(min(base * 2 ** max(times - 1, 0), cap))
