"""What the operator observes of the world, reduced to small immutable views.

The kopf indexes keep these views (not whole pod bodies), so memory stays small on 1,000-node
clusters and the pure decision code never touches a raw API object.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from meshrun_operator import names
from meshrun_operator.kueue_state import KueueView
from meshrun_operator.vocabulary import PodPhase

PROGRESS_KEYS = (
    "step",
    "totalSteps",
    "loss",
    "tokensPerSecond",
    "stepTimeSeconds",
    "updatedAt",
    "evalLoss",
    "evalStep",
)


@dataclass(frozen=True)
class PodView:
    """The parts of one pod the operator decides on."""

    name: str
    """metadata.name."""
    index: int
    """Pod index within the job (label meshrun.dev/pod-index)."""
    attempt: int
    """Attempt the pod belongs to (label meshrun.dev/attempt)."""
    phase: str
    """status.phase: Pending, Running, Succeeded, Failed or Unknown."""
    node: str | None = None
    """spec.nodeName once the scheduler bound it."""
    deleting: bool = False
    """metadata.deletionTimestamp is set."""
    exit_code: int | None = None
    """Exit code of the trainer container when it terminated."""
    container_reason: str | None = None
    """state.terminated.reason of the trainer container (OOMKilled, Error, ...)."""
    pod_reason: str | None = None
    """status.reason of the pod (Evicted, ...)."""
    pod_ip: str | None = None
    """status.podIP, for reading the trainer's /progress endpoint."""
    progress: Mapping[str, Any] | None = field(default=None, hash=False)
    """Training progress from the meshrun.dev/progress annotation, when present."""
    summary: Mapping[str, Any] | None = field(default=None, hash=False)
    """The trainer's final JSON summary from its termination message (docs/env-contract.md):
    ``finalLoss``, ``steps``, ``tokensPerSecond`` on success, ``error`` on failure."""
    owner_uid: str | None = None
    """uid of the controlling owner (a job deleted and re-created under the same name has a
    new uid, and its predecessor's pods must not count)."""


def parse_progress(text: str | None) -> dict[str, Any] | None:
    """The trainer's progress JSON (docs/env-contract.md), keeping only the known keys.

    Malformed text yields None rather than an error: a half-written annotation must not stop
    the reconcile of the whole job.
    """
    if not text:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("step"), int):
        return None
    return {key: data[key] for key in PROGRESS_KEYS if key in data}


def parse_summary(text: object) -> dict[str, Any] | None:
    """The trainer's termination message as a dict, or None when it is not JSON."""
    if not isinstance(text, str) or not text.strip().startswith("{"):
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _int_label(labels: Mapping[str, str], key: str) -> int:
    try:
        return int(labels.get(key, "0"))
    except ValueError:
        return 0


def _trainer_terminated(status: Mapping[str, Any]) -> Mapping[str, Any] | None:
    statuses = status.get("containerStatuses") or []
    chosen = next(
        (s for s in statuses if s.get("name") == names.TRAINER_CONTAINER),
        statuses[0] if statuses else None,
    )
    if chosen is None:
        return None
    state = chosen.get("state") or {}
    terminated = state.get("terminated") or (chosen.get("lastState") or {}).get("terminated")
    return terminated if isinstance(terminated, Mapping) else None


def pod_view(body: Mapping[str, Any]) -> PodView:
    """Reduce a pod object (as the API server returns it) to a PodView."""
    metadata = body.get("metadata") or {}
    labels = metadata.get("labels") or {}
    status = body.get("status") or {}
    terminated = _trainer_terminated(status)
    exit_code = terminated.get("exitCode") if terminated else None
    annotations = metadata.get("annotations") or {}
    return PodView(
        name=str(metadata.get("name", "")),
        index=_int_label(labels, names.LABEL_POD_INDEX),
        attempt=_int_label(labels, names.LABEL_ATTEMPT),
        phase=str(status.get("phase") or PodPhase.PENDING.value),
        node=(body.get("spec") or {}).get("nodeName") or None,
        deleting=bool(metadata.get("deletionTimestamp")),
        exit_code=int(exit_code) if isinstance(exit_code, int) else None,
        container_reason=terminated.get("reason") if terminated else None,
        pod_reason=status.get("reason"),
        pod_ip=status.get("podIP"),
        progress=parse_progress(annotations.get(names.ANNOTATION_PROGRESS)),
        summary=parse_summary(terminated.get("message") if terminated else None),
        owner_uid=next(
            (o.get("uid") for o in metadata.get("ownerReferences") or [] if o.get("controller")),
            None,
        ),
    )


def node_ready(body: Mapping[str, Any]) -> bool:
    """True when the node's Ready condition is True and it is not marked unschedulable-gone."""
    for condition in (body.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return bool(condition.get("status") == "True")
    return False


@dataclass(frozen=True)
class Observed:
    """Everything observed about one job's children at one moment."""

    pods: tuple[PodView, ...]
    """Pods labelled with the job's name, in any attempt."""
    nodes: Mapping[str, bool] | None
    """Node name -> Ready, or None when the operator cannot see nodes (then no node checks)."""
    progress: Mapping[str, Any] | None = None
    """Progress read from the trainer's /progress endpoint, preferred over the annotation."""
    kueue: KueueView | None = None
    """The job's Workload (or why it has none); None when the operator runs without Kueue."""
    domains: Mapping[str, str] | None = None
    """Node name -> its value of the job's spec.scheduling.topologyKey (e.g. its rack)."""
