"""Kubernetes-style conditions and timestamps (type, status, reason, message, lastTransitionTime).

Conventions from the Kubernetes API guidelines: a condition's lastTransitionTime changes only
when its status flips, reasons are CamelCase, and times are RFC 3339 in UTC.
https://github.com/kubernetes/community/blob/master/contributors/devel/sig-architecture/api-conventions.md#typical-status-properties
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from meshrun_operator.clock import format_time
from meshrun_operator.vocabulary import ConditionType

# The order in which conditions are listed in status (stable, so no spurious status patches).
_ORDER = {kind.value: i for i, kind in enumerate(ConditionType)}


def find(conditions: Sequence[Mapping[str, Any]], kind: ConditionType) -> Mapping[str, Any] | None:
    """The condition of type ``kind``, or None."""
    return next((c for c in conditions if c.get("type") == kind), None)


def is_true(conditions: Sequence[Mapping[str, Any]], kind: ConditionType) -> bool:
    """True when the condition exists with status "True"."""
    found = find(conditions, kind)
    return found is not None and found.get("status") == "True"


def set_condition(
    conditions: list[dict[str, Any]],
    kind: ConditionType,
    status: bool,
    reason: str,
    message: str,
    now: datetime,
) -> None:
    """Insert or update one condition in place, keeping lastTransitionTime unless it flips."""
    value = "True" if status else "False"
    reason = str(reason)  # a vocabulary.Reason is written as its plain value
    for condition in conditions:
        if condition.get("type") == kind:
            if condition.get("status") != value:
                condition["lastTransitionTime"] = format_time(now)
            condition.update(status=value, reason=reason, message=message)
            break
    else:
        conditions.append(
            {
                "type": kind.value,
                "status": value,
                "reason": reason,
                "message": message,
                "lastTransitionTime": format_time(now),
            }
        )
    conditions.sort(key=lambda c: _ORDER.get(str(c.get("type")), len(_ORDER)))


def clear_condition(
    conditions: list[dict[str, Any]],
    kind: ConditionType,
    reason: str,
    message: str,
    now: datetime,
) -> None:
    """Set an existing condition to False; a condition never set stays absent."""
    if find(conditions, kind) is not None:
        set_condition(conditions, kind, False, reason, message, now)
