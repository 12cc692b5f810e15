"""Pure builders of a job's children: the headless Service, the pods and the PodGroup.

Each function takes typed inputs and returns a fresh dict; nothing here talks to the API server
(the pattern of dask-kubernetes' ``build_*_spec`` and jobset's ``constructJob``). User templates
are deep-copied, and the operator's settings are injected only where the user set nothing.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from meshrun.api.spec import CPU, JobSpec, Scheduling
from meshrun.envcontract import METRICS_PORT, RENDEZVOUS_PORT, TRAINER_COMMAND
from meshrun.planner.plan import Plan
from meshrun.planner.ranks import compress_ranks
from meshrun.rules.names import pod_name
from meshrun_operator import names
from meshrun_operator.children.owner import JobRef, child_metadata, pod_ranks, pod_stage, users_keys
from meshrun_operator.children.podtemplate import (
    NCCL_DEFAULTS,
    checkpoint_volume,
    domain_affinity,
    fill_unset,
    merge_env,
    restricted_security,
    select_product,
    shared_memory,
    stage_affinity,
    trainer_container,
)
from meshrun_operator.kinds import POD, POD_GROUP, SERVICE

# The trainer image's entrypoint: torchrun reads PET_* from the environment and starts one
# process per GPU running the trainer package (docs/env-contract.md).
DEFAULT_COMMAND = list(TRAINER_COMMAND)

VOLCANO, COSCHEDULING = POD_GROUP.served
"""Where volcano's PodGroups are served, and scheduler-plugins' (coscheduling)."""


def build_service(job: JobRef) -> dict[str, Any]:
    """The headless Service that gives each pod the DNS name ``<pod>.<job>.<ns>.svc``.

    publishNotReadyAddresses lets pods resolve each other before they are Ready: torchrun's
    rendezvous happens before any readiness, and the DNS race of pytorch-operator #333 came
    from publishing only Ready addresses.
    """
    return {
        "apiVersion": SERVICE.at().api_version,
        "kind": SERVICE.kind,
        "metadata": child_metadata(job, names.service_name(job.name), {}),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            # The uid too: a pod that copies the job-name label gets no DNS record here.
            "selector": names.job_labels(job.name, job.uid),
            "ports": [
                {"name": "rendezvous", "port": RENDEZVOUS_PORT, "protocol": "TCP"},
                {"name": "metrics", "port": METRICS_PORT, "protocol": "TCP"},
            ],
        },
    }


def gang_scheduler_kind(scheduling: Scheduling) -> str | None:
    """``volcano`` or ``scheduler-plugins`` when the scheduler needs a PodGroup, else None."""
    name = scheduling.scheduler_name or ""
    if name == "volcano":
        return "volcano"
    if name.startswith("scheduler-plugins"):
        return "scheduler-plugins"
    return None


def build_pod(
    job: JobRef,
    spec: JobSpec,
    plan: Plan,
    index: int,
    attempt: int,
    env: Mapping[str, str],
    domains: Mapping[int, Sequence[str]] | None = None,
) -> dict[str, Any]:
    """Pod ``index`` of attempt ``attempt``: ``numProcPerNode`` accelerators, the env contract,
    the user's ``podTemplate`` merged in, and labels saying where it sits in the plan.

    ``domains``: per pipeline stage, the values of ``spec.scheduling.topologyKey`` its pods
    prefer (placer.py); without them, the pods prefer their stage's other pods' domain."""
    template = copy.deepcopy(spec.pod_template or {})
    template_meta = template.get("metadata") or {}
    pod_spec: dict[str, Any] = template.get("spec") or {}
    stage = pod_stage(plan, index)
    name = pod_name(job.name, index)
    # The template's labels and annotations cannot set the operator's own keys (whose pod it
    # is, its index, attempt, ranks, progress): they decide what the operator deletes and reads.
    labels = {
        **users_keys(template_meta.get("labels")),
        names.LABEL_POD_INDEX: str(index),
        names.LABEL_STAGE: str(stage),
        names.LABEL_ATTEMPT: str(attempt),
    }
    metadata = child_metadata(job, name, labels)
    annotations = users_keys(template_meta.get("annotations"))
    annotations[names.ANNOTATION_RANKS] = compress_ranks(pod_ranks(plan, index))
    metadata["annotations"] = annotations

    # The operator restarts whole gangs itself; a kubelet restarting one container in place
    # would rejoin a rendezvous the others already left.
    pod_spec["restartPolicy"] = "Never"
    pod_spec["hostname"] = name
    pod_spec["subdomain"] = names.service_name(job.name)
    fill_unset(pod_spec, "enableServiceLinks", False)
    scheduling = spec.scheduling
    if scheduling.scheduler_name:
        pod_spec["schedulerName"] = scheduling.scheduler_name
    if scheduling.priority_class_name:
        # The job's class wins: it is also the gang's and the Workload's, and the one the
        # platform policy checked.
        pod_spec["priorityClassName"] = scheduling.priority_class_name
    kind = gang_scheduler_kind(scheduling)
    if kind == "volcano":
        annotations[names.VOLCANO_GROUP_ANNOTATION] = names.podgroup_name(job.name)
    elif kind == "scheduler-plugins":
        metadata["labels"][names.COSCHEDULING_GROUP_LABEL] = names.podgroup_name(job.name)
    select_product(pod_spec, spec.resources.accelerator_product)
    if scheduling.topology_key and domains and domains.get(stage):
        domain_affinity(pod_spec, scheduling.topology_key, domains[stage])
    elif scheduling.topology_key:
        stage_affinity(pod_spec, job.name, stage, scheduling.topology_key)

    container = trainer_container(pod_spec)
    container["image"] = spec.image
    if spec.command:
        container["command"] = list(spec.command)
    else:
        fill_unset(container, "command", list(DEFAULT_COMMAND))
    if spec.args:
        container["args"] = list(spec.args)
    merge_env(container, env)
    accelerator = spec.resources.accelerator
    if accelerator != CPU:
        merge_env(container, NCCL_DEFAULTS)  # the template's own NCCL settings win
        resources = fill_unset(container, "resources", {})
        count = str(spec.resources.num_proc_per_node)
        fill_unset(resources, "limits", {})[accelerator] = count
        fill_unset(resources, "requests", {})[accelerator] = count
    ports = fill_unset(container, "ports", [])
    if not any(p.get("name") == "metrics" for p in ports):
        ports.append({"name": "metrics", "containerPort": METRICS_PORT})
    checkpoint_volume(spec.training.checkpoint.volume, pod_spec, container)
    shared_memory(pod_spec, container, spec.resources.shared_memory_gib)
    restricted_security(pod_spec)
    return {
        "apiVersion": POD.at().api_version,
        "kind": POD.kind,
        "metadata": metadata,
        "spec": pod_spec,
    }


def build_podgroup(job: JobRef, spec: JobSpec) -> dict[str, Any] | None:
    """The PodGroup for volcano or scheduler-plugins' coscheduling; None for other schedulers.

    minMember is every pod: a partial gang holding GPUs is the failure of Kubeflow #948/#1825.
    """
    kind = gang_scheduler_kind(spec.scheduling)
    if kind is None:
        return None
    metadata = child_metadata(job, names.podgroup_name(job.name), {})
    if kind == "volcano":
        res = spec.resources
        group_spec: dict[str, Any] = {"minMember": res.num_nodes}
        if res.accelerator != CPU:
            group_spec["minResources"] = {res.accelerator: str(res.world_size)}
        if spec.scheduling.queue_name:
            group_spec["queue"] = spec.scheduling.queue_name
        if spec.scheduling.priority_class_name:
            group_spec["priorityClassName"] = spec.scheduling.priority_class_name
        return {
            "apiVersion": VOLCANO.api_version,
            "kind": POD_GROUP.kind,
            "metadata": metadata,
            "spec": group_spec,
        }
    return {
        "apiVersion": COSCHEDULING.api_version,
        "kind": POD_GROUP.kind,
        "metadata": metadata,
        "spec": {
            "minMember": spec.resources.num_nodes,
            "scheduleTimeoutSeconds": spec.scheduling.gang_timeout_seconds,
        },
    }
