"""Kueue's objects, read and written (pure): the Workload a ParallelTrainingJob owns while Kueue
governs it, what that Workload says and the status patches the operator writes, and an admission
turned into what each pod of the gang needs.

meshrun integrates with Kueue as an *external framework* (Kueue's configuration lists
``ParallelTrainingJob.v1alpha1.meshrun.dev`` under ``integrations.externalFrameworks``): the
operator creates one ``Workload`` per job, waits while Kueue queues it, starts the pods once it
is admitted, and reports back (PodsReady, Finished). The field names follow Kueue's
``kueue.x-k8s.io/v1beta2`` API (v0.17) to the letter.

Kueue owns the queueing conditions (QuotaReserved, Admitted, Evicted, Preempted); the job's
controller, here the operator, owns the rest of the conversation (Kueue's jobframework does
the same for built-in jobs): ``PodsReady`` while the gang starts or recovers, clearing the
admission once an evicted gang's pods are gone (which re-queues the Workload), and
``Finished`` when the job ends, which gives the quota back. Each patch is a JSON merge patch of
the Workload's ``/status`` carrying the resourceVersion it was computed from, so a patch that
crossed one of Kueue's own writes is refused (409) instead of undoing it.

Kueue admits a Workload by writing ``status.admission``: per pod set the ResourceFlavor of
each resource and, with topology-aware scheduling, a topology assignment (how many pods go to
which domain). Kueue's own job integrations apply it by merging the flavors' node labels and
tolerations into the pod template and letting Kueue's ungater place gated pods; the operator
creates its pods itself, so it places each pod directly: the flavors' node labels and
tolerations, plus a node selector naming the pod's domain. Pods of a pod set take the domains
in the assignment's order, in pod-index order, so consecutive ranks share a domain and every
attempt of the gang lands on the same nodes. The pods also carry the labels and annotations by
which Kueue counts them as this Workload's (not as foreign usage of the nodes).
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from meshrun.api.crd import GROUP as JOB_GROUP
from meshrun.api.crd import KIND as JOB_KIND
from meshrun.api.errors import SpecError
from meshrun.planner.plan import Plan
from meshrun_operator import names
from meshrun_operator.conditions import find, find_true, set_condition
from meshrun_operator.kinds import WORKLOAD

GROUP = WORKLOAD.at().group
API_VERSION = WORKLOAD.at().api_version
WORKLOAD_KIND = WORKLOAD.kind
WORKLOAD_PLURAL = WORKLOAD.plural
# Kueue validates at most 8 pod sets per Workload (WorkloadSpec.podSets, MaxItems=8).
MAX_POD_SETS = 8

# Labels and annotations Kueue reads (apis/kueue/v1beta2, pkg/controller/constants).
QUEUE_LABEL = names.KUEUE_QUEUE_LABEL
JOB_UID_LABEL = f"{GROUP}/job-uid"
PODSET_LABEL = f"{GROUP}/podset"
WORKLOAD_ANNOTATION = f"{GROUP}/workload"
REQUIRED_TOPOLOGY_ANNOTATION = f"{GROUP}/podset-required-topology"
PREFERRED_TOPOLOGY_ANNOTATION = f"{GROUP}/podset-preferred-topology"
UNCONSTRAINED_TOPOLOGY_ANNOTATION = f"{GROUP}/podset-unconstrained-topology"

# Workload names as Kueue's own job integrations make them (jobframework/workload_names.go):
# "<kind>-<job>" cut to fit, "-", and 5 hex digits of a hash of kind, group, job name and uid.
# 63 characters, so the name also fits in a label value.
_MAX_NAME = 63
_HASH_LENGTH = 5


@dataclass(frozen=True)
class TopologyRequest:
    """Where the pods of each pipeline stage should land (Kueue topology-aware scheduling)."""

    level: str
    """Node label of the topology level, e.g. ``topology.meshrun.dev/rack``."""
    required: bool = False
    """True: each stage must fit in one domain of ``level``; False: Kueue only prefers it."""


@dataclass(frozen=True)
class WorkloadRequest:
    """Everything besides the plan and the pods that goes into a job's Workload."""

    job_name: str
    """metadata.name of the ParallelTrainingJob."""
    namespace: str
    """Its namespace; the Workload and the LocalQueue live there too."""
    uid: str
    """Its uid: the owner reference, the ``kueue.x-k8s.io/job-uid`` label and the name's hash."""
    queue_name: str
    """The LocalQueue (``spec.scheduling.queueName``)."""
    priority_class: str | None = None
    """A Kueue ``WorkloadPriorityClass`` name, or None for the queue's default priority."""
    priority: int | None = None
    """That class's ``value``: Kueue orders and preempts by ``spec.priority``, which the
    creator of a Workload fills in (Kueue's job integrations do the same lookup)."""
    topology: TopologyRequest | None = None
    """The topology request of every pod set, or None (unconstrained)."""
    min_count: int | None = None
    """The fewest pods Kueue may admit the one pod set with (partial admission, an elastic
    job: meshrun_operator.lifecycle.elastic.admission_floor), or None: all or nothing."""


@dataclass(frozen=True)
class PodSetPlan:
    """One pod set of the Workload: consecutive pods of one pipeline stage (or of several)."""

    name: str
    """``stage-<s>``, or ``stages-<first>-<last>`` when one pod set holds several stages."""
    pod_indices: tuple[int, ...]
    """The job's pod indices in this set, ascending."""
    stages: tuple[int, ...]
    """The pipeline stages whose ranks these pods hold."""
    pods_per_stage: int | None
    """Pods of each stage when the set holds several whole stages of equal size, else None."""


def workload_name(job_name: str, uid: str) -> str:
    """The Workload's name: readable (``paralleltrainingjob-<job>-<hash>``), unique per job uid."""
    kind = JOB_KIND.lower()
    digest = hashlib.sha1(f"{JOB_KIND}\n{JOB_GROUP}\n{job_name}\n{uid}".encode()).hexdigest()
    prefix = f"{kind}-{job_name}"[: _MAX_NAME - 1 - _HASH_LENGTH].rstrip("-")
    return f"{prefix}-{digest[:_HASH_LENGTH]}"


def _pod_stages(plan: Plan) -> list[tuple[int, tuple[int, ...]]]:
    """(pod index, pipeline stages of its ranks) for every pod, by index: pod i holds the
    consecutive ranks i * procPerNode onwards (the planner's rank order)."""
    per_pod = plan.world_size // plan.num_nodes
    return [
        (pod, tuple(sorted({plan.coords(r).pp for r in range(pod * per_pod, (pod + 1) * per_pod)})))
        for pod in range(plan.num_nodes)
    ]


def _set_name(stages: Sequence[int]) -> str:
    first, last = min(stages), max(stages)
    return f"stage-{first}" if first == last else f"stages-{first}-{last}"


def pod_sets(plan: Plan) -> list[PodSetPlan]:
    """Split the plan's pods into at most 8 pod sets along pipeline stages.

    Pods whose ranks hold the same stages form a group (a pod never splits a tensor-parallel
    group, and stages are consecutive ranks, so groups are consecutive pods). Up to 8 groups
    each become a pod set; more are merged, consecutive groups together, into 8 sets.
    """
    groups: list[tuple[tuple[int, ...], list[int]]] = []
    for index, stages in _pod_stages(plan):
        if groups and groups[-1][0] == stages:
            groups[-1][1].append(index)
        else:
            groups.append((stages, [index]))
    per_set = -(-len(groups) // MAX_POD_SETS)
    result = []
    for start in range(0, len(groups), per_set):
        chunk = groups[start : start + per_set]
        stages = tuple(sorted({s for group_stages, _ in chunk for s in group_stages}))
        sizes = {len(indices) for _, indices in chunk}
        result.append(
            PodSetPlan(
                name=_set_name(stages),
                pod_indices=tuple(i for _, indices in chunk for i in indices),
                stages=stages,
                pods_per_stage=sizes.pop() if len(chunk) > 1 and len(sizes) == 1 else None,
            )
        )
    return result


def pod_set_of(sets: Sequence[PodSetPlan], index: int) -> PodSetPlan:
    """The pod set that holds pod ``index``."""
    for pod_set in sets:
        if index in pod_set.pod_indices:
            return pod_set
    raise KeyError(f"pod {index} is in no pod set")


def _container_for_admission(container: Mapping[str, Any]) -> dict[str, Any]:
    kept = {
        k: copy.deepcopy(container[k]) for k in ("name", "image", "resources") if k in container
    }
    if "restartPolicy" in container:  # a sidecar: Kueue adds its requests to the containers'
        kept["restartPolicy"] = container["restartPolicy"]
    return kept


# What of a pod Kueue reads to admit and place it: requests (of containers, init containers
# and sidecars, plus overhead), the node constraints the flavors must match, and priority.
_SCHEDULING_FIELDS = (
    "nodeSelector",
    "affinity",
    "tolerations",
    "priorityClassName",
    "runtimeClassName",
    "overhead",
)


def pod_set_template(pod: Mapping[str, Any]) -> dict[str, Any]:
    """A pod's template for a Workload: only the parts Kueue admits by, deep-copied.

    Environment, volumes and commands stay out: the Workload is immutable once created, and
    what differs between attempts (env such as the attempt number) must not end up in it.
    """
    spec = pod.get("spec") or {}
    template: dict[str, Any] = {
        "containers": [_container_for_admission(c) for c in spec.get("containers") or []]
    }
    if spec.get("initContainers"):
        template["initContainers"] = [_container_for_admission(c) for c in spec["initContainers"]]
    for key in _SCHEDULING_FIELDS:
        if spec.get(key):
            template[key] = copy.deepcopy(spec[key])
    return {"spec": template}


def _topology_request(
    request: TopologyRequest | None, pod_set: PodSetPlan
) -> dict[str, Any] | None:
    if request is None:
        return None
    if pod_set.pods_per_stage is not None and request.required:
        # Several stages share this pod set: each slice of one stage's pods must fit one domain.
        return {
            "podSetSliceRequiredTopology": request.level,
            "podSetSliceSize": pod_set.pods_per_stage,
        }
    return {"required" if request.required else "preferred": request.level}


def build_workload(
    request: WorkloadRequest,
    plan: Plan,
    pods: Sequence[Mapping[str, Any]],
    owner_reference: Mapping[str, Any],
) -> dict[str, Any]:
    """The Workload of a job: one pod set per pipeline stage with its pod count and the
    per-pod requests of ``pods`` (the job's pods as the operator builds them: at least the
    first of each pod set, whose template stands for the set's).

    ``owner_reference`` (the job's controller reference, as on every child) makes garbage
    collection delete the Workload with the job, which gives its quota back. No finalizer, so
    neither object is ever stuck while the operator is down.
    """
    by_index = {int(p["metadata"]["labels"][names.LABEL_POD_INDEX]): p for p in pods}
    sets = pod_sets(plan)
    missing = [s.pod_indices[0] for s in sets if s.pod_indices[0] not in by_index]
    if missing:
        raise ValueError(f"no pod built for indices {missing}")
    if not request.queue_name:
        raise SpecError("spec.scheduling.queueName", "must name a Kueue LocalQueue")
    spec: dict[str, Any] = {"queueName": request.queue_name, "podSets": []}
    for pod_set in sets:
        entry: dict[str, Any] = {
            "name": pod_set.name,
            "count": len(pod_set.pod_indices),
            "template": pod_set_template(by_index[pod_set.pod_indices[0]]),
        }
        topology = _topology_request(request.topology, pod_set)
        if topology:
            entry["topologyRequest"] = topology
        if request.min_count is not None and len(sets) == 1:
            entry["minCount"] = request.min_count
        spec["podSets"].append(entry)
    if request.priority_class:
        spec["priorityClassRef"] = {
            "group": GROUP,
            "kind": "WorkloadPriorityClass",
            "name": request.priority_class,
        }
    if request.priority is not None:
        spec["priority"] = request.priority
    return {
        "apiVersion": API_VERSION,
        "kind": WORKLOAD_KIND,
        "metadata": {
            "name": workload_name(request.job_name, request.uid),
            "namespace": request.namespace,
            "labels": {
                names.LABEL_JOB: request.job_name,
                names.LABEL_MANAGED_BY: names.MANAGED_BY,
                JOB_UID_LABEL: request.uid,
                QUEUE_LABEL: request.queue_name,
            },
            "ownerReferences": [dict(owner_reference)],
        },
        "spec": spec,
    }


# Condition types and reasons of kueue.x-k8s.io/v1beta2 Workloads (apis/kueue/v1beta2).
QUOTA_RESERVED = "QuotaReserved"
ADMITTED = "Admitted"
EVICTED = "Evicted"
PREEMPTED = "Preempted"
REQUEUED = "Requeued"
PODS_READY = "PodsReady"
FINISHED = "Finished"
# Evicted reasons after which the Workload is queued again at once (the rest back off).
REQUEUED_AT_ONCE = ("Preempted", "NodeFailures")
# PodsReady reasons: waiting for the first start, started, waiting to recover, recovered.
WAIT_FOR_START = "WaitForStart"
STARTED = "Started"
WAIT_FOR_RECOVERY = "WaitForRecovery"
RECOVERED = "Recovered"
# Kueue truncates condition messages to this many characters (api.TruncateConditionMessage).
MAX_MESSAGE = 32 * 1024


class WorkloadPhase(StrEnum):
    """Where a Workload stands, the operator's reading of Kueue's conditions."""

    PENDING = "Pending"
    """Queued: no quota yet (or Kueue has not seen it yet)."""
    QUOTA_RESERVED = "QuotaReserved"
    """Quota reserved, admission checks still running: no pods yet."""
    ADMITTED = "Admitted"
    """Admitted: the pods may run, placed as ``status.admission`` says."""
    EVICTED = "Evicted"
    """Kueue took the admission back (preemption, PodsReady timeout, deactivation, ...): the
    pods must go, then the admission is cleared and the Workload waits in the queue again."""
    FINISHED = "Finished"
    """The job ended and said so; the quota is released."""


@dataclass(frozen=True)
class WorkloadState:
    """One reading of a Workload's status."""

    phase: WorkloadPhase
    """See WorkloadPhase."""
    reason: str
    """Kueue's reason for that phase, e.g. ``Pending``, ``Inadmissible``, ``Preempted``,
    ``PodsReadyTimeout``, ``Succeeded``."""
    message: str
    """Kueue's words, e.g. why the Workload does not fit (for the job's condition)."""
    preempted_by: str | None = None
    """For a preemption, the Preempted condition's reason (``InClusterQueue``,
    ``InCohortReclamation``, ...): another Workload needed the quota."""
    active: bool = True
    """False when ``spec.active`` is false (Kueue deactivates a Workload that exceeded its
    re-queueing limit): it is never admitted again."""
    requeue_at: str | None = None
    """When a backing-off Workload may be admitted again (``status.requeueState``)."""
    admission: Mapping[str, Any] | None = None
    """``status.admission`` (cluster queue, per pod set flavors and topology) while reserved."""

    @property
    def queued(self) -> bool:
        """Waiting for Kueue: no pod may exist."""
        return self.phase in (WorkloadPhase.PENDING, WorkloadPhase.QUOTA_RESERVED)

    @property
    def preempted(self) -> bool:
        """Evicted to make room for another Workload: not the job's fault, no restart counted."""
        return self.phase is WorkloadPhase.EVICTED and self.preempted_by is not None


def _conditions(workload: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return list((workload.get("status") or {}).get("conditions") or [])


def condition(workload: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    """The Workload's condition of type ``kind``, or None."""
    return find(_conditions(workload), kind)


def _true(workload: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    return find_true(_conditions(workload), kind)


def _state(
    phase: WorkloadPhase, found: Mapping[str, Any] | None, default_reason: str, **extra: Any
) -> WorkloadState:
    reason = str((found or {}).get("reason") or default_reason)
    return WorkloadState(phase, reason, str((found or {}).get("message") or ""), **extra)


def read_workload(workload: Mapping[str, Any]) -> WorkloadState:
    """The state of a Workload; the first that holds wins: Finished, Evicted (still holding
    its admission), Admitted, QuotaReserved, else Pending."""
    status = workload.get("status") or {}
    common = {
        "active": (workload.get("spec") or {}).get("active", True) is not False,
        "requeue_at": (status.get("requeueState") or {}).get("requeueAt"),
        "admission": status.get("admission"),
    }
    if found := _true(workload, FINISHED):
        return _state(WorkloadPhase.FINISHED, found, "Finished", **common)
    evicted = _true(workload, EVICTED)
    if evicted and _true(workload, QUOTA_RESERVED):
        preempted = _true(workload, PREEMPTED)
        reason = str(preempted.get("reason")) if preempted else None
        return _state(WorkloadPhase.EVICTED, evicted, "Evicted", preempted_by=reason, **common)
    if found := _true(workload, ADMITTED):
        return _state(WorkloadPhase.ADMITTED, found, "Admitted", **common)
    if found := _true(workload, QUOTA_RESERVED):
        return _state(WorkloadPhase.QUOTA_RESERVED, found, "QuotaReserved", **common)
    return _state(WorkloadPhase.PENDING, condition(workload, QUOTA_RESERVED), "Pending", **common)


def _with_conditions(
    workload: Mapping[str, Any], updates: Sequence[tuple[str, bool, str, str]], now: datetime
) -> list[dict[str, Any]]:
    """The Workload's conditions with ``updates`` (type, status, reason, message) set the way
    apimachinery's SetStatusCondition does: the transition time moves only when the status
    flips, and the others stay as they are."""
    generation = (workload.get("metadata") or {}).get("generation")
    result = [dict(c) for c in _conditions(workload)]
    for kind, status, reason, message in updates:
        set_condition(
            result, kind, status, reason, message[:MAX_MESSAGE], now, generation=generation
        )
    return result


def _status_patch(workload: Mapping[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    metadata = workload.get("metadata") or {}
    return {"metadata": {"resourceVersion": metadata.get("resourceVersion")}, "status": status}


def pods_ready_patch(
    workload: Mapping[str, Any], ready: bool, message: str, now: datetime
) -> dict[str, Any] | None:
    """The PodsReady condition Kueue's waitForPodsReady watches, or None when it already says so.

    ``ready``: every pod of the gang is running. The reason follows Kueue: ``Started`` /
    ``WaitForStart`` before the gang first ran since admission, ``Recovered`` /
    ``WaitForRecovery`` after (a whole-gang restart keeps the admission; Kueue's
    recoveryTimeout then bounds how long the gang may take to come back).
    """
    current = condition(workload, PODS_READY)
    was_ready = current is not None and current.get("status") == "True"
    ran_before = was_ready or (current or {}).get("reason") in (WAIT_FOR_RECOVERY, RECOVERED)
    if ready:
        if was_ready:
            return None
        reason = RECOVERED if ran_before else STARTED
    else:
        reason = WAIT_FOR_RECOVERY if ran_before else WAIT_FOR_START
        if current is not None and not was_ready and current.get("reason") == reason:
            return None
    conditions = _with_conditions(workload, [(PODS_READY, ready, reason, message)], now)
    return _status_patch(workload, {"conditions": conditions})


def finished_patch(
    workload: Mapping[str, Any], succeeded: bool, message: str, now: datetime
) -> dict[str, Any] | None:
    """``Finished=True`` (reason Succeeded or Failed): Kueue releases the quota at once. None
    when the Workload already finished."""
    if _true(workload, FINISHED):
        return None
    reason = "Succeeded" if succeeded else "Failed"
    conditions = _with_conditions(workload, [(FINISHED, True, reason, message)], now)
    return _status_patch(workload, {"conditions": conditions})


def release_patch(workload: Mapping[str, Any], now: datetime) -> dict[str, Any] | None:
    """After an eviction, once the gang's pods are gone: clear the admission so the Workload
    queues again (what Kueue's jobframework does for its own jobs once they are stopped).

    Sets QuotaReserved and Admitted false, ``Requeued`` (true for a preemption or node
    failures, which queue again at once; false otherwise, e.g. a PodsReady timeout backs off),
    PodsReady back to WaitForStart, and removes ``status.admission``. None unless the Workload
    is evicted and holds quota.
    """
    evicted = _true(workload, EVICTED)
    if evicted is None or _true(workload, QUOTA_RESERVED) is None:
        return None
    reason, message = str(evicted.get("reason") or ""), str(evicted.get("message") or "")
    updates = [
        (REQUEUED, reason in REQUEUED_AT_ONCE, reason, message),
        (QUOTA_RESERVED, False, "Pending", message),
        (ADMITTED, False, "NoReservation", "The workload has no reservation"),
    ]
    if condition(workload, PODS_READY) is not None:
        # The next admission starts from scratch, not as a recovery of this one.
        updates.append((PODS_READY, False, WAIT_FOR_START, "Not all pods are ready or succeeded"))
    conditions = _with_conditions(workload, updates, now)
    return _status_patch(workload, {"conditions": conditions, "admission": None})


@dataclass(frozen=True)
class Hold:
    """Why a job that names a queue has no Workload, for its condition (Kueue not served, a
    missing WorkloadPriorityClass, a Workload Kueue refused)."""

    reason: str
    """CamelCase reason (jobstatus.Reason)."""
    message: str
    """What to do about it, in one sentence."""


@dataclass(frozen=True)
class KueueView:
    """What the operator sees of Kueue for one job: its Workload, or why it has none."""

    workload: Mapping[str, Any] | None = None
    """The job's Workload as last seen (watch or the operator's own last write), or None."""
    hold: Hold | None = None
    """Set when the Workload cannot be created for now; tried again later."""


@dataclass(frozen=True)
class QueueRef:
    """Where a job queues: what its Workload is created with."""

    queue: str
    """The LocalQueue (``spec.scheduling.queueName``, else the queue-name label)."""
    priority_class: str | None = None
    """The job's ``kueue.x-k8s.io/priority-class`` label: a WorkloadPriorityClass, or None."""


@dataclass
class KueueActions:
    """The Kueue side effects of one decision."""

    create: QueueRef | None = None
    """Create the job's Workload in this queue (built from the plan and the pods of attempt 0)."""
    admitted: Mapping[str, Any] | None = None
    """The admitted Workload whose admission the pods created now follow."""
    status_patch: dict[str, Any] | None = None
    """A patch of the Workload's status (PodsReady, the release after an eviction, Finished)."""


class AdmissionError(ValueError):
    """An admission the pods cannot follow (a conflict, a missing flavor or pod set): like
    Kueue's FailedToStart, retrying does not help."""


@dataclass(frozen=True)
class PodAdmission:
    """What one pod gets from its Workload's admission, merged into the pod as built."""

    pod_set: str
    """The pod set's name (also the ``kueue.x-k8s.io/podset`` label)."""
    node_selector: dict[str, str] = field(default_factory=dict)
    """The flavors' node labels, plus the pod's topology domain (e.g. its hostname)."""
    tolerations: list[dict[str, Any]] = field(default_factory=list)
    """The flavors' tolerations (e.g. of a tainted GPU pool)."""
    labels: dict[str, str] = field(default_factory=dict)
    """Kueue's pod set label and any admission check's labels."""
    annotations: dict[str, str] = field(default_factory=dict)
    """The Workload's name and the topology annotation Kueue counts TAS pods by."""


def _level_value(values: Mapping[str, Any], index: int) -> str:
    if values.get("universal") is not None:
        return str(values["universal"])
    individual = values.get("individual") or {}
    root = str(individual["roots"][index])
    return f"{individual.get('prefix') or ''}{root}{individual.get('suffix') or ''}"


def topology_domains(assignment: Mapping[str, Any]) -> list[tuple[dict[str, str], int]]:
    """A ``topologyAssignment`` unpacked: (node selector, pod count) per domain, in order.

    The v1beta2 format stores domains in slices; per level a value is either ``universal`` (one
    for every domain of the slice) or ``individual`` (``prefix`` + root + ``suffix``), and pod
    counts are ``universal`` or ``individual`` the same way.
    """
    levels = [str(level) for level in assignment.get("levels") or []]
    domains = []
    for piece in assignment.get("slices") or []:
        counts = piece.get("podCounts") or {}
        per_level = piece.get("valuesPerLevel") or []
        for i in range(int(piece["domainCount"])):
            selector = {level: _level_value(per_level[k], i) for k, level in enumerate(levels)}
            count = (
                counts["universal"]
                if counts.get("universal") is not None
                else counts["individual"][i]
            )
            domains.append((selector, int(count)))
    return domains


def _merge(target: dict[str, str], extra: Mapping[str, str], what: str, pod_set: str) -> None:
    for key, value in extra.items():
        if target.get(key, value) != value:
            raise AdmissionError(
                f"pod set {pod_set}: {what} {key} is both {target[key]!r} and {value!r}"
            )
        target[key] = str(value)


def add_tolerations(target: list[dict[str, Any]], extra: Sequence[Mapping[str, Any]]) -> None:
    """Append the tolerations of ``extra`` that ``target`` lacks."""
    for toleration in extra:
        if dict(toleration) not in target:
            target.append(dict(toleration))


def _topology_annotation(pod_set_spec: Mapping[str, Any]) -> dict[str, str]:
    request = pod_set_spec.get("topologyRequest") or {}
    if request.get("required"):
        return {REQUIRED_TOPOLOGY_ANNOTATION: str(request["required"])}
    if request.get("preferred"):
        return {PREFERRED_TOPOLOGY_ANNOTATION: str(request["preferred"])}
    return {UNCONSTRAINED_TOPOLOGY_ANNOTATION: "true"}


def _pod_set_base(
    workload: Mapping[str, Any],
    assignment: Mapping[str, Any],
    flavors: Mapping[str, Mapping[str, Any]],
) -> PodAdmission:
    """What every pod of one pod set gets: flavors, admission check updates, Kueue's keys."""
    name = str(assignment["name"])
    base = PodAdmission(
        pod_set=name,
        labels={PODSET_LABEL: name},
        annotations={WORKLOAD_ANNOTATION: str(workload["metadata"]["name"])},
    )
    for flavor_name in sorted(set((assignment.get("flavors") or {}).values())):
        flavor = flavors.get(flavor_name)
        if flavor is None:
            raise AdmissionError(f"pod set {name}: ResourceFlavor {flavor_name} not found")
        spec = flavor.get("spec") or {}
        _merge(base.node_selector, spec.get("nodeLabels") or {}, "node label", name)
        add_tolerations(base.tolerations, spec.get("tolerations") or [])
    for check in (workload.get("status") or {}).get("admissionChecks") or []:
        if check.get("state") != "Ready":
            continue
        for update in check.get("podSetUpdates") or []:
            if update.get("name") == name:
                _merge(base.labels, update.get("labels") or {}, "label", name)
                _merge(base.annotations, update.get("annotations") or {}, "annotation", name)
                _merge(base.node_selector, update.get("nodeSelector") or {}, "node label", name)
                add_tolerations(base.tolerations, update.get("tolerations") or [])
    return base


def admit_pods(
    workload: Mapping[str, Any],
    flavors: Mapping[str, Mapping[str, Any]],
    sets: Sequence[PodSetPlan],
) -> dict[int, PodAdmission]:
    """Per pod index, what the Workload's admission asks of that pod.

    ``flavors``: the ResourceFlavor objects by name (at least those the admission names);
    ``sets``: the job's pod sets (kueue.pod_sets of its plan). Raises AdmissionError when the
    admission does not cover every pod.
    """
    admission = (workload.get("status") or {}).get("admission")
    if not admission:
        raise AdmissionError(f"Workload {workload['metadata']['name']} is not admitted")
    specs = {str(p.get("name")): p for p in (workload.get("spec") or {}).get("podSets") or []}
    assignments = {str(a["name"]): a for a in admission.get("podSetAssignments") or []}
    result: dict[int, PodAdmission] = {}
    for pod_set in sets:
        assignment = assignments.get(pod_set.name)
        if assignment is None:
            raise AdmissionError(f"the admission has no assignment for pod set {pod_set.name}")
        base = _pod_set_base(workload, assignment, flavors)
        domains: list[dict[str, str]] = []
        if assignment.get("topologyAssignment"):
            base.annotations.update(_topology_annotation(specs.get(pod_set.name) or {}))
            for selector, count in topology_domains(assignment["topologyAssignment"]):
                domains.extend([selector] * count)
            if len(domains) < len(pod_set.pod_indices):
                raise AdmissionError(
                    f"pod set {pod_set.name}: the topology assignment places {len(domains)} "
                    f"of {len(pod_set.pod_indices)} pods"
                )
        for position, index in enumerate(pod_set.pod_indices):
            pod = copy.deepcopy(base)
            if domains:
                _merge(pod.node_selector, domains[position], "node label", pod_set.name)
            result[index] = pod
    return result


def apply_admission(pod: Mapping[str, Any], admission: PodAdmission) -> dict[str, Any]:
    """A copy of ``pod`` with its admission merged in. A node label the pod already selects
    with another value is a conflict (AdmissionError): the pod could never be placed."""
    result = copy.deepcopy(dict(pod))
    metadata = result.setdefault("metadata", {})
    spec = result.setdefault("spec", {})
    where = f"pod {metadata.get('name')}"
    _merge(metadata.setdefault("labels", {}), admission.labels, "label", where)
    _merge(metadata.setdefault("annotations", {}), admission.annotations, "annotation", where)
    _merge(spec.setdefault("nodeSelector", {}), admission.node_selector, "node label", where)
    add_tolerations(spec.setdefault("tolerations", []), admission.tolerations)
    return result
