"""Which status changes are written at once, and which may wait to be written with the next.

A launch changes a job's status with nearly every pod event: the placement row of each pod as
it is bound and starts, the count in the gang's condition message, the one-sentence message.
Written one by one, that is a status patch (and an update sent to every watcher of the job) per
pod event. So a change is written at once only when it says something new: a change of phase
(the first Pending of a new job excepted), of a condition's status or reason (the gang's own
progress excepted), of a counter (attempt, restarts, disruptions, gang retries), of the last
failure, the spec error, the completion, the next attempt's time or the generation decided on.
The rest (placement, progress, messages, the launch's clocks) is written at most every
``--status-interval-seconds``, or with the next change that is written at once: a job whose
pods all run within that interval gets one status write for its whole launch.

Until a waiting change is written the operator decides on it (``OperatorContext.unwritten``),
so nothing it carries is lost between two passes; if the operator stops meanwhile, the clocks
restart from the moment pods are seen, as after any lost write.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from meshrun_operator.jobstatus import ConditionType, Phase, Reason

SAID_AT_ONCE = (
    "attempt",
    "restarts",
    "disruptions",
    "gangRetries",
    "lastFailure",
    "invalidSpec",
    "completionTime",
    "nextAttemptTime",
    "observedGeneration",
    "attemptGeneration",
)
"""Status fields whose change is written at once."""

LAUNCH_PROGRESS = {
    (ConditionType.SCHEDULED.value, Reason.WAITING_FOR_GANG.value),
    (ConditionType.SCHEDULED.value, Reason.ALL_PODS_BOUND.value),
}
"""(condition, reason) pairs that only tell how far a launch got."""


def at_once(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether the change from status ``old`` (as stored) to ``new`` is written now."""
    old_phase, new_phase = old.get("phase"), new.get("phase")
    if old_phase is None:
        # Never written: a launch in progress (Pending, its gang on the way) may wait.
        return new_phase not in (None, Phase.PENDING.value) or bool(_conditions(new))
    if old_phase != new_phase:
        return True
    if any(old.get(key) != new.get(key) for key in SAID_AT_ONCE):
        return True
    return _conditions(old) != _conditions(new)


def _conditions(status: Mapping[str, Any]) -> set[tuple[str, str, str]]:
    """The conditions' (type, status, reason), the launch's own progress left out."""
    found = set()
    for condition in status.get("conditions") or []:
        kind, reason = str(condition.get("type")), str(condition.get("reason"))
        if (kind, reason) not in LAUNCH_PROGRESS:
            found.add((kind, str(condition.get("status")), reason))
    return found
