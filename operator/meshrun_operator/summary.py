"""Pure summaries for status: the placement of ranks on nodes, and training progress."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from meshrun_operator.builders import pod_ranks
from meshrun_operator.conditions import format_time, parse_time
from meshrun_operator.observe import PodView


def placement(plan: Mapping[str, Any], pods: Iterable[PodView]) -> list[dict[str, Any]]:
    """Pod -> node -> ranks for the pods of the current attempt, in pod order."""
    rows = []
    for pod in sorted(pods, key=lambda p: p.index):
        ranks = pod_ranks(plan, pod.index)
        rows.append(
            {
                "pod": pod.name,
                "node": pod.node or "",
                "firstRank": min(ranks, default=0),
                "lastRank": max(ranks, default=0),
                "phase": pod.phase,
            }
        )
    return rows


def merge_progress(
    reported: Mapping[str, Any] | None, state: dict[str, Any], attempt: int, now: datetime
) -> dict[str, Any] | None:
    """status.progress from the trainer's latest report; notes in ``state`` when the step last
    advanced (``lastProgressTime``), which hang detection compares to progressDeadlineSeconds.

    The operator's own clock decides, not the trainer's ``updatedAt``: pods' clocks may drift.
    """
    if reported is None:
        return None
    step = reported.get("step")
    if state.get("progressAttempt") != attempt or state.get("progressStep") != step:
        state.update(progressAttempt=attempt, progressStep=step, lastProgressTime=format_time(now))
    progress: dict[str, Any] = dict(reported)
    total = reported.get("totalSteps")
    step_time = reported.get("stepTimeSeconds")
    if isinstance(total, int) and isinstance(step, int) and isinstance(step_time, (int, float)):
        progress["etaSeconds"] = round(max(total - step, 0) * float(step_time), 1)
    return progress


def last_progress_time(state: Mapping[str, Any], attempt: int) -> datetime | None:
    """When the step last advanced in this attempt, or None."""
    if state.get("progressAttempt") != attempt:
        return None
    return parse_time(state.get("lastProgressTime"))
