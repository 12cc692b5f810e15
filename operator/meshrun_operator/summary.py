"""Pure summaries for status: the placement of ranks on nodes, and training progress."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from meshrun.api import VERSION, crd
from meshrun.planner import Plan
from meshrun_operator.children import pod_ranks, pod_stage
from meshrun_operator.observe import PodView
from meshrun_operator.state import StepChange


def placement(
    plan: Plan, pods: Iterable[PodView], domains: Mapping[str, str] | None = None
) -> list[dict[str, Any]]:
    """Pod -> node -> ranks for the pods of the current attempt, in pod order, with each pod's
    pipeline stage and its node's topology domain (``domains``: node -> value of the job's
    topologyKey), so a stage kept in one rack shows as one domain."""
    rows = []
    for pod in sorted(pods, key=lambda p: p.index):
        ranks = pod_ranks(plan, pod.index)
        row: dict[str, Any] = {
            "pod": pod.name,
            "node": pod.node or "",
            "firstRank": ranks[0],
            "lastRank": ranks[-1],
            "stage": pod_stage(plan, pod.index),
            "phase": pod.phase,
        }
        domain = (domains or {}).get(pod.node or "")
        if domain:
            row["domain"] = domain
        rows.append(row)
    return rows


def step_change(
    seen: StepChange | None, reported: Mapping[str, Any], attempt: int, now: datetime
) -> StepChange:
    """When the step last changed, given the trainer's latest report; hang detection compares
    its time to progressDeadlineSeconds.

    The operator's own clock decides, not the trainer's ``updatedAt``: pods' clocks may drift.
    """
    step = reported.get("step")
    step = step if isinstance(step, int) else None
    if seen is None or seen.attempt != attempt or seen.step != step:
        return StepChange(attempt=attempt, step=step, time=now)
    return seen


def last_step_time(seen: StepChange | None, attempt: int) -> datetime | None:
    """When the step last changed in this attempt, or None."""
    return seen.time if seen is not None and seen.attempt == attempt else None


def progress_status(reported: Mapping[str, Any]) -> dict[str, Any]:
    """status.progress from the trainer's latest report, with an ETA."""
    step = reported.get("step")
    progress: dict[str, Any] = dict(reported)
    total = reported.get("totalSteps")
    step_time = reported.get("stepTimeSeconds")
    if isinstance(total, int) and isinstance(step, int) and isinstance(step_time, (int, float)):
        progress["etaSeconds"] = round(max(total - step, 0) * float(step_time), 1)
    return conform(progress, _progress_schema())


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "integer": (int,),
    "number": (int, float),
    "string": (str,),
    "boolean": (bool,),
}


def conform(values: Mapping[str, Any], schema: Mapping[str, Any]) -> dict[str, Any]:
    """Keep only the fields the schema declares, with the declared JSON type.

    The trainer's report is outside the operator's control; one field of the wrong type would
    make the API server reject the whole status patch (422), so it is dropped instead.
    """
    properties = schema.get("properties") or {}
    kept: dict[str, Any] = {}
    for key, value in values.items():
        expected = _JSON_TYPES.get(str((properties.get(key) or {}).get("type")))
        if expected is None or isinstance(value, bool) != (bool in expected):
            continue
        if isinstance(value, expected):
            kept[key] = value
    return kept


@functools.cache
def _progress_schema() -> Mapping[str, Any]:
    """status.progress of the CRD (the single source of truth, shipped in meshrun.api)."""
    version = next(v for v in crd()["spec"]["versions"] if v["name"] == VERSION)
    schema: Mapping[str, Any] = version["schema"]["openAPIV3Schema"]["properties"]["status"]
    return dict(schema["properties"]["progress"])


def final_progress(summary: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """status.progress from the trainer's final summary: the last step, the final loss and the
    last validation (evalLoss, evalStep).

    A short job can end between two resyncs, before any progress was read; the summary in the
    termination message still reaches status.
    """
    if not summary or summary.get("status") != "Succeeded":
        return None
    steps = summary.get("steps")
    evals = summary.get("eval")
    last = evals[-1] if isinstance(evals, list) and evals and isinstance(evals[-1], dict) else {}
    progress = {
        "step": steps,
        "totalSteps": steps,
        "loss": summary.get("finalLoss"),
        "tokensPerSecond": summary.get("tokensPerSecond"),
        "etaSeconds": 0.0,
        "evalLoss": last.get("loss"),
        "evalStep": last.get("step"),
    }
    return conform({k: v for k, v in progress.items() if v is not None}, _progress_schema())
