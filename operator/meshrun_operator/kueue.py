"""Kueue, pure part one: the Workload a ParallelTrainingJob owns while Kueue governs it.

meshrun integrates with Kueue as an *external framework* (Kueue's configuration lists
``ParallelTrainingJob.v1alpha1.meshrun.dev`` under ``integrations.externalFrameworks``): the
operator creates one ``Workload`` per job, waits while Kueue queues it, starts the pods once it
is admitted, and reports back (PodsReady, Finished). This module builds that Workload from the
plan and the pods the operator would create; kueue_state.py reads and patches its status and
kueue_admission.py turns an admission into what each pod needs. The field names follow Kueue's
``kueue.x-k8s.io/v1beta2`` API (v0.17) to the letter.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from meshrun.errors import SpecError
from meshrun.planner import Plan
from meshrun_operator import names

GROUP = "kueue.x-k8s.io"
API_VERSION = f"{GROUP}/v1beta2"
WORKLOAD_KIND = "Workload"
WORKLOAD_PLURAL = "workloads"
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
    job: meshrun_operator.elastic.admission_floor), or None: all or nothing."""


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
    kind = names.KIND.lower()
    digest = hashlib.sha1(f"{names.KIND}\n{names.GROUP}\n{job_name}\n{uid}".encode()).hexdigest()
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
    per-pod requests of ``pods`` (the job's pods, as the operator builds them).

    ``owner_reference`` (the job's controller reference, as on every child) makes garbage
    collection delete the Workload with the job, which gives its quota back. No finalizer, so
    neither object is ever stuck while the operator is down.
    """
    by_index = {int(p["metadata"]["labels"][names.LABEL_POD_INDEX]): p for p in pods}
    sets = pod_sets(plan)
    missing = [i for s in sets for i in s.pod_indices if i not in by_index]
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
