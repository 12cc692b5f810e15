"""Pure summaries for status: the placement of ranks on nodes, and training progress."""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from meshrun.api.crd import VERSION, crd
from meshrun.planner.plan import Plan
from meshrun_operator.children.owner import pod_ranks, pod_stage
from meshrun_operator.lifecycle.state import StepChange
from meshrun_operator.seen.views import PodView

PER_POD_ROWS = 512
"""Up to this many pods, status.placement has a row per pod."""
MAX_ROWS = 512
"""A larger job's placement has at most this many rows, so that its status stays small (an
object is at most 1.5 MiB in etcd, and every watcher of the job receives the whole of it)."""


def placement(
    plan: Plan, pods: Iterable[PodView], domains: Mapping[str, str] | None = None
) -> list[dict[str, Any]]:
    """Pod -> node -> ranks for the pods of the current attempt, in pod order, with each pod's
    pipeline stage and its node's topology domain (``domains``: node -> value of the job's
    topologyKey), so a stage kept in one rack shows as one domain.

    Beyond ``PER_POD_ROWS`` pods, a row stands for a run of consecutive pods (``pods``: their
    index range, ``count``) with the same stage, domain and phase, their node names left to
    the pods themselves; when that still makes more than ``MAX_ROWS`` rows, runs with the same
    stage and phase (``domains``: how many), then runs with the same phase, and at last one
    row per phase with its count.
    """
    ordered = sorted(pods, key=lambda p: p.index)
    if len(ordered) <= PER_POD_ROWS:
        return [_pod_row(plan, pod, domains) for pod in ordered]
    for keys in (("stage", "domain"), ("stage",), ()):
        rows = _runs(plan, ordered, domains, keys)
        if rows is not None:
            return rows
    counts: dict[str, int] = {}
    for pod in ordered:
        counts[pod.phase] = counts.get(pod.phase, 0) + 1
    return [{"phase": phase, "count": count} for phase, count in sorted(counts.items())]


def _pod_row(plan: Plan, pod: PodView, domains: Mapping[str, str] | None) -> dict[str, Any]:
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
    return row


def _runs(
    plan: Plan,
    pods: list[PodView],
    domains: Mapping[str, str] | None,
    keys: tuple[str, ...],
) -> list[dict[str, Any]] | None:
    """Rows of runs of consecutive pods alike in ``keys`` and phase; None past MAX_ROWS."""
    runs: list[list[PodView]] = []
    last: tuple[Any, ...] = ()
    for pod in pods:
        key = (
            pod_stage(plan, pod.index) if "stage" in keys else None,
            (domains or {}).get(pod.node or "") if "domain" in keys else None,
            pod.phase,
        )
        if runs and key == last and pod.index == runs[-1][-1].index + 1:
            runs[-1].append(pod)
            continue
        if len(runs) == MAX_ROWS:
            return None
        runs.append([pod])
        last = key
    return [_run_row(plan, run, domains, keys) for run in runs]


def _run_row(
    plan: Plan, run: list[PodView], domains: Mapping[str, str] | None, keys: tuple[str, ...]
) -> dict[str, Any]:
    first, last = run[0].index, run[-1].index
    row: dict[str, Any] = {
        "pods": f"{first}-{last}" if last != first else str(first),
        "count": len(run),
        "firstRank": pod_ranks(plan, first)[0],
        "lastRank": pod_ranks(plan, last)[-1],
    }
    if "stage" in keys:
        row["stage"] = pod_stage(plan, first)
    if domains is not None:
        found = {domains.get(p.node or "") for p in run} - {None, ""}
        if "domain" in keys:
            if found:
                row["domain"] = found.pop()
        else:
            row["domains"] = len(found)
    row["phase"] = run[0].phase
    return row


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
    """status.progress from the trainer's latest report, with an ETA; the names of the fields
    that were NaN or infinite (left out) in ``nonFinite``."""
    progress = conform(reported, _progress_schema())  # the ETA only from what the status takes
    step, total = progress.get("step"), progress.get("totalSteps")
    step_time = progress.get("stepTimeSeconds")
    if isinstance(total, int) and isinstance(step, int) and step_time is not None:
        eta = round(max(total - step, 0) * float(step_time), 1)
        progress.update(conform({"etaSeconds": eta}, _progress_schema()))
    return _with_non_finite(progress, reported)


def non_finite(values: Mapping[str, Any]) -> list[str]:
    """The keys of ``values`` whose value is a NaN or infinite number."""
    return sorted(k for k, v in values.items() if isinstance(v, float) and not math.isfinite(v))


def _with_non_finite(progress: dict[str, Any], reported: Mapping[str, Any]) -> dict[str, Any]:
    known = _progress_schema().get("properties") or {}
    dropped = [key for key in non_finite(reported) if key in known]
    if dropped:
        progress["nonFinite"] = dropped
    return progress


INT64 = range(-(2**63), 2**63)
"""The integers the API server stores (a JSON integer beyond int64 makes it refuse the patch)."""

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "integer": (int,),
    "number": (int, float),
    "string": (str,),
    "boolean": (bool,),
}


def conform(values: Mapping[str, Any], schema: Mapping[str, Any]) -> dict[str, Any]:
    """Keep only the fields the schema declares, with the declared JSON type.

    The trainer's report is outside the operator's control; one field of the wrong type would
    make the API server reject the whole status patch (422), so it is dropped instead, and so
    are an integer beyond int64 (refused the same way) and a NaN or infinite number (no JSON
    can carry it: the patch would not be sent).
    """
    properties = schema.get("properties") or {}
    kept: dict[str, Any] = {}
    for key, value in values.items():
        expected = _JSON_TYPES.get(str((properties.get(key) or {}).get("type")))
        if expected is None or isinstance(value, bool) != (bool in expected):
            continue
        if isinstance(value, float) and not math.isfinite(value):
            continue
        if isinstance(value, int) and not isinstance(value, bool) and value not in INT64:
            continue
        if isinstance(value, expected):
            kept[key] = value
    return kept


@functools.cache
def _progress_schema() -> Mapping[str, Any]:
    """status.progress of the CRD (the single source of truth, shipped in meshrun.api.crd)."""
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
    given = {k: v for k, v in progress.items() if v is not None}
    return _with_non_finite(conform(given, _progress_schema()), given)
