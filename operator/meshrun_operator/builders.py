"""Pure builders of a job's children: the headless Service, the pods and the PodGroup.

Each function takes typed inputs and returns a fresh dict; nothing here talks to the API server
(the pattern of dask-kubernetes' ``build_*_spec`` and jobset's ``constructJob``). User templates
are deep-copied, and the operator's settings are injected only where the user set nothing.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from meshrun.envcontract import TRAINER_COMMAND
from meshrun_operator import names
from meshrun_operator.jobspec import ACCELERATOR_CPU, JobSettings, gang_scheduler_kind

# The trainer image's entrypoint: torchrun reads PET_* from the environment and starts one
# process per GPU running the trainer package (docs/env-contract.md).
DEFAULT_COMMAND = list(TRAINER_COMMAND)

# Checkpoints live here in every pod: on the PVC named by spec.training.checkpoint.volume (so a
# restarted gang resumes), else on an emptyDir that dies with the pod.
CHECKPOINT_MOUNT = "/checkpoints"
CHECKPOINT_VOLUME = "meshrun-checkpoints"


@dataclass(frozen=True)
class JobRef:
    """Identity of the ParallelTrainingJob that owns the children."""

    name: str
    """metadata.name of the job."""
    namespace: str
    """metadata.namespace of the job (children live there too)."""
    uid: str
    """metadata.uid, for owner references (garbage collection deletes children with the job)."""
    queue_label: str | None = None
    """The job's kueue.x-k8s.io/queue-name label, used when spec.scheduling.queueName is unset."""


def owner_reference(job: JobRef) -> dict[str, Any]:
    """The controller owner reference every child carries."""
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.KIND,
        "name": job.name,
        "uid": job.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _metadata(job: JobRef, name: str, labels: Mapping[str, str]) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": job.namespace,
        "labels": {names.LABEL_JOB: job.name, names.LABEL_MANAGED_BY: names.MANAGED_BY, **labels},
        "ownerReferences": [owner_reference(job)],
    }


def build_service(job: JobRef) -> dict[str, Any]:
    """The headless Service that gives each pod the DNS name ``<pod>.<job>.<ns>.svc``.

    publishNotReadyAddresses lets pods resolve each other before they are Ready: torchrun's
    rendezvous happens before any readiness, and the DNS race of pytorch-operator #333 came
    from publishing only Ready addresses.
    """
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(job, names.service_name(job.name), {}),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {names.LABEL_JOB: job.name},
            "ports": [
                {"name": "rendezvous", "port": names.RENDEZVOUS_PORT, "protocol": "TCP"},
                {"name": "metrics", "port": names.METRICS_PORT, "protocol": "TCP"},
            ],
        },
    }


def compress_ranks(ranks: Sequence[int]) -> str:
    """``[0, 1, 2, 3, 8]`` -> ``"0-3,8"``: a short, readable rank list for labels and status."""
    parts: list[str] = []
    ordered = sorted(ranks)
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def pod_ranks(plan: Mapping[str, Any], index: int) -> list[int]:
    """Global ranks of pod ``index`` according to the plan."""
    for pod in plan.get("pods", []):
        if pod.get("index") == index:
            return [int(rank) for rank in pod.get("ranks", [])]
    return []


def pod_stage(plan: Mapping[str, Any], index: int) -> int:
    """Pipeline stage of pod ``index``: the stage of its first rank (a pod holds one stage
    whenever the sizes allow, see the planner's rank order)."""
    ranks = pod_ranks(plan, index)
    by_rank = {int(r["rank"]): int(r.get("pp", 0)) for r in plan.get("ranks", [])}
    return by_rank.get(ranks[0], 0) if ranks else 0


def _merge_env(container: dict[str, Any], env: Mapping[str, str]) -> None:
    """Add the operator's variables the user did not set; the user's own value wins."""
    current = container.setdefault("env", [])
    present = {item.get("name") for item in current}
    current.extend({"name": k, "value": v} for k, v in sorted(env.items()) if k not in present)


def _trainer_container(template_spec: dict[str, Any]) -> dict[str, Any]:
    """The template's container named ``trainer`` (or its first one), or a new one in front."""
    containers: list[dict[str, Any]] = template_spec.setdefault("containers", [])
    for existing in containers:
        if existing.get("name") == names.TRAINER_CONTAINER:
            return existing
    if containers and not containers[0].get("name"):
        containers[0]["name"] = names.TRAINER_CONTAINER
        return containers[0]
    created: dict[str, Any] = {"name": names.TRAINER_CONTAINER}
    containers.insert(0, created)
    return created


def _restricted_security(pod_spec: dict[str, Any], container: dict[str, Any]) -> None:
    """Pod Security Standards "restricted" defaults, only where the template set none.

    https://kubernetes.io/docs/concepts/security/pod-security-standards/#restricted
    """
    pod_security = pod_spec.setdefault("securityContext", {})
    pod_security.setdefault("runAsNonRoot", True)
    pod_security.setdefault("seccompProfile", {"type": "RuntimeDefault"})
    security = container.setdefault("securityContext", {})
    security.setdefault("allowPrivilegeEscalation", False)
    security.setdefault("capabilities", {"drop": ["ALL"]})


def _stage_affinity(pod_spec: dict[str, Any], job: str, stage: int, topology_key: str) -> None:
    """Prefer nodes that share ``topology_key`` with the other pods of the same pipeline stage.

    Preferred, not required: a required self-affinity would let the first pod of a stage pin
    the whole stage to one rack even when that rack is full.
    """
    affinity = pod_spec.setdefault("affinity", {})
    pod_affinity = affinity.setdefault("podAffinity", {})
    preferred = pod_affinity.setdefault("preferredDuringSchedulingIgnoredDuringExecution", [])
    preferred.append(
        {
            "weight": 100,
            "podAffinityTerm": {
                "topologyKey": topology_key,
                "labelSelector": {
                    "matchLabels": {names.LABEL_JOB: job, names.LABEL_STAGE: str(stage)}
                },
            },
        }
    )


def _checkpoint_volume(
    spec: Mapping[str, Any], pod_spec: dict[str, Any], container: dict[str, Any]
) -> None:
    claim = ((spec.get("training") or {}).get("checkpoint") or {}).get("volume")
    source: dict[str, Any] = (
        {"persistentVolumeClaim": {"claimName": claim}} if claim else {"emptyDir": {}}
    )
    volumes = pod_spec.setdefault("volumes", [])
    if not any(v.get("name") == CHECKPOINT_VOLUME for v in volumes):
        volumes.append({"name": CHECKPOINT_VOLUME, **source})
    mounts = container.setdefault("volumeMounts", [])
    if not any(m.get("name") == CHECKPOINT_VOLUME for m in mounts):
        mounts.append({"name": CHECKPOINT_VOLUME, "mountPath": CHECKPOINT_MOUNT})


def build_pod(
    job: JobRef,
    spec: Mapping[str, Any],
    settings: JobSettings,
    plan: Mapping[str, Any],
    index: int,
    attempt: int,
    env: Mapping[str, str],
) -> dict[str, Any]:
    """Pod ``index`` of attempt ``attempt``: ``numProcPerNode`` accelerators, the env contract,
    the user's ``podTemplate`` merged in, and labels saying where it sits in the plan."""
    template = copy.deepcopy(spec.get("podTemplate") or {})
    template_meta = template.get("metadata") or {}
    pod_spec: dict[str, Any] = template.get("spec") or {}
    stage = pod_stage(plan, index)
    name = names.pod_name(job.name, index)
    labels = {
        **{str(k): str(v) for k, v in (template_meta.get("labels") or {}).items()},
        names.LABEL_POD_INDEX: str(index),
        names.LABEL_STAGE: str(stage),
        names.LABEL_ATTEMPT: str(attempt),
    }
    metadata = _metadata(job, name, labels)
    annotations = dict(template_meta.get("annotations") or {})
    annotations[names.ANNOTATION_RANKS] = compress_ranks(pod_ranks(plan, index))
    metadata["annotations"] = annotations

    # The operator restarts whole gangs itself; a kubelet restarting one container in place
    # would rejoin a rendezvous the others already left.
    pod_spec["restartPolicy"] = "Never"
    pod_spec["hostname"] = name
    pod_spec["subdomain"] = names.service_name(job.name)
    pod_spec.setdefault("enableServiceLinks", False)
    scheduling = settings.scheduling
    if scheduling.scheduler_name:
        pod_spec["schedulerName"] = scheduling.scheduler_name
    if scheduling.priority_class_name:
        pod_spec.setdefault("priorityClassName", scheduling.priority_class_name)
    kind = gang_scheduler_kind(scheduling)
    if kind == "volcano":
        annotations[names.VOLCANO_GROUP_ANNOTATION] = names.podgroup_name(job.name)
    elif kind == "scheduler-plugins":
        metadata["labels"][names.COSCHEDULING_GROUP_LABEL] = names.podgroup_name(job.name)
    if scheduling.topology_key:
        _stage_affinity(pod_spec, job.name, stage, scheduling.topology_key)
    queue = scheduling.queue_name or job.queue_label
    if queue:
        # One Kueue pod group per attempt: Kueue admits the whole gang or none of it.
        metadata["labels"][names.KUEUE_QUEUE_LABEL] = queue
        metadata["labels"][names.KUEUE_POD_GROUP_LABEL] = f"{job.name}-{attempt}"
        annotations[names.KUEUE_POD_GROUP_TOTAL] = str(settings.num_nodes)

    container = _trainer_container(pod_spec)
    container["image"] = settings.image
    command = spec.get("command")
    if command:
        container["command"] = list(command)
    else:
        container.setdefault("command", list(DEFAULT_COMMAND))
    if spec.get("args"):
        container["args"] = list(spec["args"])
    _merge_env(container, env)
    if settings.accelerator != ACCELERATOR_CPU:
        resources = container.setdefault("resources", {})
        count = str(settings.num_proc_per_node)
        resources.setdefault("limits", {})[settings.accelerator] = count
        resources.setdefault("requests", {})[settings.accelerator] = count
    ports = container.setdefault("ports", [])
    if not any(p.get("name") == "metrics" for p in ports):
        ports.append({"name": "metrics", "containerPort": names.METRICS_PORT})
    _checkpoint_volume(spec, pod_spec, container)
    _restricted_security(pod_spec, container)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}


def build_podgroup(job: JobRef, settings: JobSettings) -> dict[str, Any] | None:
    """The PodGroup for volcano or scheduler-plugins' coscheduling; None for other schedulers.

    minMember is every pod: a partial gang holding GPUs is the failure of Kubeflow #948/#1825.
    """
    kind = gang_scheduler_kind(settings.scheduling)
    if kind is None:
        return None
    metadata = _metadata(job, names.podgroup_name(job.name), {})
    if kind == "volcano":
        spec: dict[str, Any] = {"minMember": settings.num_nodes}
        if settings.accelerator != ACCELERATOR_CPU:
            total = settings.num_nodes * settings.num_proc_per_node
            spec["minResources"] = {settings.accelerator: str(total)}
        if settings.scheduling.queue_name:
            spec["queue"] = settings.scheduling.queue_name
        if settings.scheduling.priority_class_name:
            spec["priorityClassName"] = settings.scheduling.priority_class_name
        return {
            "apiVersion": "scheduling.volcano.sh/v1beta1",
            "kind": "PodGroup",
            "metadata": metadata,
            "spec": spec,
        }
    return {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": metadata,
        "spec": {
            "minMember": settings.num_nodes,
            "scheduleTimeoutSeconds": settings.scheduling.gang_timeout_seconds,
        },
    }
