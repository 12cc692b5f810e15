"""Small factories for the operator's unit tests: jobs, pods and observations as plain data."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import Any

from meshrun_operator.seen.views import Observed, PodView

from meshrun.api.crd import API_VERSION, KIND
from meshrun.rules.names import pod_name

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)

BASE_SPEC: dict[str, Any] = {
    "image": "meshrun/trainer:test",
    "resources": {"numNodes": 2, "numProcPerNode": 4},
    "strategy": {"type": "ddp"},
    "model": {"preset": "tiny"},
    "training": {"steps": 10, "globalBatchSize": 16, "microBatchSize": 2},
}


REPORT_3_OF_10: dict[str, Any] = {
    "step": 3,
    "totalSteps": 10,
    "loss": 2.302585092994046,
    "tokensPerSecond": 123456.7,
    "stepTimeSeconds": 30.0,
    "updatedAt": 1767268800.0,
}
"""Rank 0's report of step 3 of 10, a step every 30 s (3m30s left), with numbers that Go would
print in full."""


def at(seconds: float) -> datetime:
    """A moment ``seconds`` after T0."""
    return T0 + timedelta(seconds=seconds)


def deep_merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    result = copy.deepcopy(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = deep_merge(result[key], value)
        else:
            result[key] = copy.deepcopy(value)
    return result


def make_job(
    name: str = "job",
    status: dict[str, Any] | None = None,
    **spec_overrides: Any,
) -> dict[str, Any]:
    """A ParallelTrainingJob object; keyword arguments deep-merge into the spec."""
    metadata: dict[str, Any] = {"name": name, "namespace": "ns", "uid": "uid-1", "generation": 1}
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": metadata,
        "spec": deep_merge(BASE_SPEC, spec_overrides),
        "status": copy.deepcopy(status or {}),
    }


def make_pod(
    index: int,
    attempt: int = 0,
    phase: str = "Running",
    node: str | None = "node-0",
    job: str = "job",
    **fields: Any,
) -> PodView:
    return PodView(
        name=pod_name(job, index),
        index=index,
        attempt=attempt,
        phase=phase,
        node=node,
        **fields,
    )


def observe(
    *pods: PodView, nodes: dict[str, bool] | None = None, progress: dict[str, Any] | None = None
) -> Observed:
    """An observation; every node a pod uses is Ready unless ``nodes`` says otherwise."""
    known = {p.node: True for p in pods if p.node}
    known.update(nodes or {})
    return Observed(pods=tuple(pods), nodes=known, progress=progress)
