"""The operator's typed view of a job spec: run policy and scheduling, validated with field names.

The CRD applies its defaults on the server; the same defaults are repeated here so that the pure
functions also work on a spec that never went through the API server (unit tests, old objects).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from meshrun.errors import SpecError

CLEAN_POD_POLICIES = ("None", "Running", "All")
ACCELERATOR_CPU = "cpu"
DEFAULT_ACCELERATOR = "nvidia.com/gpu"


@dataclass(frozen=True)
class RunPolicy:
    """How the operator reacts to failures, deadlines and completion (``spec.runPolicy``)."""

    backoff_limit: int = 3
    """Whole-gang restarts allowed after retryable failures before the job fails."""
    active_deadline_seconds: int | None = None
    """Seconds from start after which the job fails with DeadlineExceeded."""
    progress_deadline_seconds: int | None = None
    """Seconds without a new training step after which the gang is restarted (hang detection)."""
    ttl_seconds_after_finished: int | None = None
    """Seconds after completion after which the job object itself is deleted."""
    clean_pod_policy: str = "Running"
    """Which pods to delete when the job finishes: None, Running (unfinished ones) or All."""
    suspend: bool = False
    """True: no pods exist (Kueue admission or a user pause); False: run."""


@dataclass(frozen=True)
class Scheduling:
    """How the pods are placed (``spec.scheduling``)."""

    gang: bool = True
    """All pods bound within ``gang_timeout_seconds`` or the attempt is torn down and retried."""
    gang_timeout_seconds: int = 300
    """Seconds the gang may wait for every pod to be bound to a node."""
    scheduler_name: str | None = None
    """Scheduler for the pods; volcano and scheduler-plugins also get a PodGroup."""
    priority_class_name: str | None = None
    """PriorityClass of the pods."""
    queue_name: str | None = None
    """Kueue / volcano queue; falls back to the job's kueue.x-k8s.io/queue-name label."""
    topology_key: str | None = None
    """Node label whose value the pods of one pipeline stage should share."""


@dataclass(frozen=True)
class JobSettings:
    """Everything the operator reads from a spec besides the plan itself."""

    run_policy: RunPolicy
    """``spec.runPolicy``."""
    scheduling: Scheduling
    """``spec.scheduling``."""
    num_nodes: int
    """``spec.resources.numNodes``: one pod per node."""
    num_proc_per_node: int
    """``spec.resources.numProcPerNode``: processes (GPUs) per pod."""
    accelerator: str
    """Extended resource name of the accelerator, or ``cpu`` for CPU-only pods."""
    image: str
    """Container image of the trainer."""


def _section(spec: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = spec.get(key) or {}
    if not isinstance(value, Mapping):
        raise SpecError(f"spec.{key}", f"must be an object, got {type(value).__name__}")
    return value


def _int(
    section: Mapping[str, Any], path: str, key: str, default: int | None, minimum: int
) -> int | None:
    value = section.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(f"{path}.{key}", f"must be an integer, got {value!r}")
    if value < minimum:
        raise SpecError(f"{path}.{key}", f"must be at least {minimum}, got {value}")
    return value


def _str(section: Mapping[str, Any], path: str, key: str) -> str | None:
    value = section.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise SpecError(f"{path}.{key}", f"must be a string, got {value!r}")
    return value


def _bool(section: Mapping[str, Any], path: str, key: str, default: bool) -> bool:
    value = section.get(key, default)
    if not isinstance(value, bool):
        raise SpecError(f"{path}.{key}", f"must be true or false, got {value!r}")
    return value


def parse_run_policy(spec: Mapping[str, Any]) -> RunPolicy:
    """Read ``spec.runPolicy``; SpecError names the offending field."""
    section, path = _section(spec, "runPolicy"), "spec.runPolicy"
    policy = section.get("cleanPodPolicy", "Running")
    if policy not in CLEAN_POD_POLICIES:
        raise SpecError(
            f"{path}.cleanPodPolicy",
            f"must be one of {', '.join(CLEAN_POD_POLICIES)}, got {policy!r}",
        )
    return RunPolicy(
        backoff_limit=_int(section, path, "backoffLimit", 3, 0) or 0,
        active_deadline_seconds=_int(section, path, "activeDeadlineSeconds", None, 1),
        progress_deadline_seconds=_int(section, path, "progressDeadlineSeconds", None, 1),
        ttl_seconds_after_finished=_int(section, path, "ttlSecondsAfterFinished", None, 0),
        clean_pod_policy=policy,
        suspend=_bool(section, path, "suspend", False),
    )


def parse_scheduling(spec: Mapping[str, Any]) -> Scheduling:
    """Read ``spec.scheduling``; SpecError names the offending field."""
    section, path = _section(spec, "scheduling"), "spec.scheduling"
    return Scheduling(
        gang=_bool(section, path, "gang", True),
        gang_timeout_seconds=_int(section, path, "gangTimeoutSeconds", 300, 1) or 300,
        scheduler_name=_str(section, path, "schedulerName"),
        priority_class_name=_str(section, path, "priorityClassName"),
        queue_name=_str(section, path, "queueName"),
        topology_key=_str(section, path, "topologyKey"),
    )


def parse_settings(spec: Mapping[str, Any]) -> JobSettings:
    """The operator's settings of one job; SpecError on the first bad field."""
    resources, path = _section(spec, "resources"), "spec.resources"
    accelerator = _str(resources, path, "accelerator") or DEFAULT_ACCELERATOR
    image = spec.get("image")
    if not isinstance(image, str) or not image:
        raise SpecError("spec.image", "must name the trainer's container image")
    return JobSettings(
        run_policy=parse_run_policy(spec),
        scheduling=parse_scheduling(spec),
        num_nodes=_int(resources, path, "numNodes", 1, 1) or 1,
        num_proc_per_node=_int(resources, path, "numProcPerNode", 1, 1) or 1,
        accelerator=accelerator,
        image=image,
    )


def gang_scheduler_kind(scheduling: Scheduling) -> str | None:
    """``volcano`` or ``scheduler-plugins`` when the scheduler needs a PodGroup, else None."""
    name = scheduling.scheduler_name or ""
    if name == "volcano":
        return "volcano"
    if name.startswith("scheduler-plugins"):
        return "scheduler-plugins"
    return None
