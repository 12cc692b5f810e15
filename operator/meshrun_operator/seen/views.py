"""What the operator observes of the world, reduced to small immutable views.

The kopf indexes keep these views (not whole pod bodies), so memory stays small on 1,000-node
clusters and the pure decision code never touches a raw API object.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from meshrun.api.crd import GROUP, KIND
from meshrun_operator import names
from meshrun_operator.clock import parse_time
from meshrun_operator.jobstatus import PodPhase
from meshrun_operator.kueue import KueueView
from meshrun_operator.seen.boundedjson import Unreadable, read_object

ACCELERATOR = "nvidia.com/gpu"
"""The accelerator resource a pod's ``accelerators`` counts (spec.resources.accelerator)."""

PROGRESS_KEYS = ("step", "totalSteps", "loss", "tokensPerSecond", "stepTimeSeconds", "updatedAt",
                 "evalLoss", "evalStep")  # fmt: skip


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
    """uid of the ParallelTrainingJob that controls the pod (:func:`job_controller`: its
    controller reference is of meshrun.dev's kind and names the job of its job-name label);
    None when it has no controller or another one. A job deleted and re-created under the
    same name has a new uid, and its predecessor's pods must not count."""
    other_controller: bool = False
    """It has a controller reference that is not a ParallelTrainingJob's of its job-name label
    (another API group, kind or name): never a job's pod, nor an orphan of one."""
    uid: str = ""
    """metadata.uid (deletions are expected and remembered by it)."""
    started_at: datetime | None = None
    """status.startTime: when the kubelet took the pod on."""
    waiting: tuple[str, str] | None = None
    """(reason, message) of the first container waiting for another reason than being
    created (ErrImagePull, CreateContainerConfigError, ...)."""
    conditions: tuple[tuple[str, str], ...] = ()
    """(type, status) of the pod's conditions."""
    disruption: str | None = None
    """Why the pod is a disruption target (its DisruptionTarget condition is True): the
    condition's reason and message (PreemptionByScheduler, EvictionByEvictionAPI, ...)."""
    unschedulable: str | None = None
    """The scheduler's words while it cannot place the pod (PodScheduled False, Unschedulable)."""
    exit_codes: tuple[tuple[str, int], ...] = ()
    """(container, exit code) of every terminated container, init containers first."""
    accelerators: int = 0
    """The accelerators (nvidia.com/gpu) its containers request: what it holds on its node."""
    managed: bool = True
    """It carries the ``app.kubernetes.io/managed-by: meshrun-operator`` label (with the
    job-name label it was indexed by): a pod of the job's name without it is not meshrun's and
    is never deleted or waited for."""
    labelled: bool = True
    """It carries its controller's job-uid label (LABEL_JOB_UID) and the managed-by label: a
    pod of the job's without them has left the job's Service (no DNS name for the gang) and is
    labelled again."""


def parse_progress(text: str | None) -> dict[str, Any] | None:
    """The trainer's progress JSON (docs/env-contract.md), keeping only the known keys.

    Malformed text yields None rather than an error: a half-written annotation, or one too
    long or too deep for the bounded reader, must not stop the reconcile of the whole job.
    """
    if not text:
        return None
    try:
        return progress_fields(read_object(text))
    except Unreadable:
        return None


def progress_fields(data: Mapping[str, Any]) -> dict[str, Any] | None:
    """The known keys of a progress report, or None when it has no whole-number ``step``."""
    if not isinstance(data.get("step"), int):
        return None
    return {key: data[key] for key in PROGRESS_KEYS if key in data}


def parse_summary(text: object) -> dict[str, Any] | None:
    """The trainer's termination message as a dict, or None when it is not a JSON object the
    bounded reader takes."""
    if not isinstance(text, str) or not text.strip().startswith("{"):
        return None
    try:
        return read_object(text)
    except Unreadable:
        return None


def _controller(metadata: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The object's controller reference (an object has at most one), if any."""
    owners = metadata.get("ownerReferences") or []
    return next((o for o in owners if isinstance(o, Mapping) and o.get("controller") is True), None)


def job_controller(metadata: Mapping[str, Any]) -> str | None:
    """The uid of the ParallelTrainingJob that controls an object of the operator's (a pod,
    Service, NetworkPolicy or Workload), from its ``metadata``; None unless its controller
    reference is of API group meshrun.dev, kind ParallelTrainingJob, and names the job its
    job-name label names.

    A uid alone proves nothing: anyone who may create a pod may write any ownerReference, and a
    job's uid is shown to whoever can read the job, its pods or its Events. Group, kind and name
    make the reference the job's in the object's own namespace (an ownerReference never leaves
    it); whoever keys by it (the pods index, the tombstones) keys by that namespace too.
    """
    reference = _controller(metadata)
    if reference is None:
        return None
    group, _, version = str(reference.get("apiVersion") or "").partition("/")
    if group != GROUP or not version or reference.get("kind") != KIND:
        return None
    labels = metadata.get("labels") or {}
    job = labels.get(names.LABEL_JOB) if isinstance(labels, Mapping) else None
    if not job or reference.get("name") != job or not reference.get("uid"):
        return None
    return str(reference["uid"])


def owning_job(metadata: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """(namespace, name, uid) of the job that controls an object (:func:`job_controller`): the
    object's own namespace, its job-name label and the reference's uid; None when no job does."""
    uid, namespace = job_controller(metadata), metadata.get("namespace")
    if uid is None or not namespace:
        return None
    return str(namespace), str(metadata["labels"][names.LABEL_JOB]), uid


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


# Waiting reasons of a container that is merely on its way (not stuck).
STARTING = frozenset({"ContainerCreating", "PodInitializing"})


def _containers(status: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]


def _waiting(status: Mapping[str, Any]) -> tuple[str, str] | None:
    for container in _containers(status):
        waiting = (container.get("state") or {}).get("waiting") or {}
        reason = waiting.get("reason")
        if reason and reason not in STARTING:
            message = f"container {container.get('name')}: {waiting.get('message') or reason}"
            return str(reason), message
    return None


def _exit_codes(status: Mapping[str, Any]) -> tuple[tuple[str, int], ...]:
    codes = []
    for container in _containers(status):
        code = ((container.get("state") or {}).get("terminated") or {}).get("exitCode")
        if isinstance(code, int):
            codes.append((str(container.get("name")), code))
    return tuple(codes)


def _said(conditions: list[Mapping[str, Any]], kind: str, status: str) -> str | None:
    """ "reason: message" of the pod's condition ``kind`` when it has ``status``."""
    for condition in conditions:
        if condition.get("type") == kind and condition.get("status") == status:
            reason = condition.get("reason") or kind
            return f"{reason}: {condition.get('message')}" if condition.get("message") else reason
    return None


def pod_view(body: Mapping[str, Any]) -> PodView:
    """Reduce a pod object (as the API server returns it) to a PodView."""
    metadata = body.get("metadata") or {}
    labels = metadata.get("labels") or {}
    status = body.get("status") or {}
    terminated = _trainer_terminated(status)
    conditions = status.get("conditions") or []
    exit_code = terminated.get("exitCode") if terminated else None
    annotations = metadata.get("annotations") or {}
    owner_uid = job_controller(metadata)
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
        owner_uid=owner_uid,
        other_controller=owner_uid is None and _controller(metadata) is not None,
        uid=str(metadata.get("uid") or ""),
        started_at=parse_time(status.get("startTime")),
        waiting=_waiting(status),
        conditions=tuple((str(c.get("type")), str(c.get("status"))) for c in conditions),
        disruption=_said(conditions, "DisruptionTarget", "True"),
        unschedulable=_said(conditions, "PodScheduled", "False"),
        exit_codes=_exit_codes(status),
        accelerators=_accelerators(body.get("spec") or {}),
        managed=labels.get(names.LABEL_MANAGED_BY) == names.MANAGED_BY,
        labelled=(
            labels.get(names.LABEL_MANAGED_BY) == names.MANAGED_BY
            and labels.get(names.LABEL_JOB_UID) == owner_uid
        ),
    )


def _accelerators(spec: Mapping[str, Any]) -> int:
    """nvidia.com/gpu requested by the pod's containers (an extended resource's request equals
    its limit, and either may be given alone)."""
    total = 0
    for container in spec.get("containers") or []:
        resources = container.get("resources") or {}
        quantity = (resources.get("requests") or {}).get(ACCELERATOR)
        if quantity is None:
            quantity = (resources.get("limits") or {}).get(ACCELERATOR)
        total += whole_quantity(quantity)
    return total


def whole_quantity(quantity: object) -> int:
    """An extended resource's quantity: a whole number (anything else, or none, counts as 0)."""
    try:
        return max(int(str(quantity)), 0) if quantity is not None else 0
    except ValueError:
        return 0


def node_ready(body: Mapping[str, Any]) -> bool:
    """True when the node's Ready condition is True and it is not marked unschedulable-gone."""
    return node_view(body).ready


@dataclass(frozen=True)
class NodeView:
    """A node's readiness, and since when."""

    ready: bool
    """The Ready condition is True."""
    since: datetime | None
    """The Ready condition's lastTransitionTime (None when the node reports no Ready yet)."""


def node_view(body: Mapping[str, Any]) -> NodeView:
    """Reduce a node object to its readiness and the time it last changed."""
    for condition in (body.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            since = parse_time(condition.get("lastTransitionTime"))
            return NodeView(ready=condition.get("status") == "True", since=since)
    return NodeView(ready=False, since=None)


@dataclass(frozen=True)
class Refusal:
    """Creates the API server refused in one pass: which pods, and why."""

    indices: tuple[int, ...]
    """Pod indices not created (empty when only the Service was refused)."""
    reason: str
    """QuotaExceeded, PodSecurity, Forbidden, TooManyRequests, ServerError, or NameConflict
    (an object of the child's name that meshrun did not make holds it)."""
    message: str
    """The API server's own words (the operator's, for a NameConflict)."""
    what: str = ""
    """The child refused when it is not a pod ("Service x", "NetworkPolicy x"); empty for
    pods, and for the Service when it was refused by the API server."""
    retry_after: float | None = None
    """Seconds the API server asked to wait before trying again (Retry-After), or None."""
    sent: tuple[int, ...] = ()
    """Pod indices whose creates were sent (those not in ``indices`` were created); empty when
    a child before them (the Service, the PodGroup) was refused and no pod was sent."""


@dataclass(frozen=True)
class Observed:
    """Everything observed about one job's children at one moment."""

    pods: tuple[PodView, ...]
    """The job's own pods (its uid is their controller's), in any attempt."""
    nodes: Mapping[str, bool] | None
    """Node name -> Ready, or None when the operator cannot see nodes (then no node checks)."""
    not_ready_since: Mapping[str, datetime] = field(default_factory=dict)
    """NotReady nodes of ``nodes`` -> since when (a node missing here went NotReady now)."""
    foreign: tuple[PodView, ...] = ()
    """Pods labelled with the job's name but not its own: an earlier job's of the same name
    (another controller uid) or orphans (none). They hold the names the job's pods need."""
    gone: tuple[PodView, ...] = ()
    """The last state of the job's own pods deleted since the last pass (from the watch)."""
    expected: frozenset[str] = frozenset()
    """Pods created but not yet seen by the watch (the create is in flight)."""
    refused: Refusal | None = None
    """Children the API server refused to create in the job's last pass (quota, PodSecurity,
    5xx, a name held by someone else): that pass wrote nothing, this one decides on it."""
    progress: Mapping[str, Any] | None = None
    """Progress read from the trainer's /progress endpoint, preferred over the annotation."""
    kueue: KueueView | None = None
    """The job's Workload (or why it has none); None when the operator runs without Kueue."""
    domains: Mapping[str, str] | None = None
    """Node name -> its value of the job's spec.scheduling.topologyKey (e.g. its rack)."""
    products: Collection[str] | None = None
    """The values of the nodes' nvidia.com/gpu.product label; None when the operator does not
    see node labels (then no product check)."""
    missing_children: tuple[str, ...] = ()
    """Kinds of the job's own children other than pods (Service, NetworkPolicy) that its watch
    does not show: deleted by someone, they are created again while the gang runs."""
    capacity: int | None = None
    """Pods of the job's size the nodes it may use could hold, its own pods' places counted as
    free (spec.elastic); None: not counted (no node watch, a CPU job, not elastic)."""
