"""Kubernetes-style conditions (type, status, reason, message, lastTransitionTime): the job's
and a Kueue Workload's, read and set one way.

Conventions from the Kubernetes API guidelines: a condition's lastTransitionTime changes only
when its status flips, reasons are CamelCase, and times are RFC 3339 in UTC; a condition is set
the way apimachinery's ``meta.SetStatusCondition`` sets it.
https://github.com/kubernetes/community/blob/master/contributors/devel/sig-architecture/api-conventions.md#typical-status-properties
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from meshrun_operator.clock import format_time
from meshrun_operator.jobstatus import ConditionType

JOB_ORDER = tuple(ConditionType)
"""The order in which the job's conditions are listed in status (stable, so no spurious status
patches)."""


def find(conditions: Sequence[Mapping[str, Any]], kind: str) -> Mapping[str, Any] | None:
    """The condition of type ``kind``, or None."""
    return next((c for c in conditions if c.get("type") == kind), None)


def find_true(conditions: Sequence[Mapping[str, Any]], kind: str) -> Mapping[str, Any] | None:
    """The condition of type ``kind`` when its status is "True", else None."""
    found = find(conditions, kind)
    return found if found is not None and found.get("status") == "True" else None


def is_true(conditions: Sequence[Mapping[str, Any]], kind: str) -> bool:
    """True when the condition exists with status "True"."""
    return find_true(conditions, kind) is not None


def set_condition(
    conditions: list[dict[str, Any]],
    kind: str,
    status: bool,
    reason: str,
    message: str,
    now: datetime,
    *,
    generation: int | None = None,
    order: Sequence[str] = (),
) -> None:
    """Insert or replace one condition in place, keeping its lastTransitionTime unless the
    status flips; ``generation``: its observedGeneration; ``order``: the types in the order the
    list keeps them (others after them, as they came)."""
    value = "True" if status else "False"
    new: dict[str, Any] = {
        "type": str(kind),
        "status": value,
        "reason": str(reason),  # a jobstatus.Reason is written as its plain value
        "message": message,
        "lastTransitionTime": format_time(now),
    }
    if generation is not None:
        new["observedGeneration"] = generation
    for index, old in enumerate(conditions):
        if old.get("type") == kind:
            if old.get("status") == value and old.get("lastTransitionTime"):
                new["lastTransitionTime"] = old["lastTransitionTime"]
            conditions[index] = new
            break
    else:
        conditions.append(new)
    if order:
        rank = {str(name): i for i, name in enumerate(order)}
        conditions.sort(key=lambda c: rank.get(str(c.get("type")), len(rank)))


def clear_condition(
    conditions: list[dict[str, Any]],
    kind: str,
    reason: str,
    message: str,
    now: datetime,
    *,
    order: Sequence[str] = (),
) -> None:
    """Set an existing condition to False; a condition never set stays absent."""
    if find(conditions, kind) is not None:
        set_condition(conditions, kind, False, reason, message, now, order=order)
