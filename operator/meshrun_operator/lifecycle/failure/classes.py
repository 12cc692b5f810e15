"""Failure classification: which pod failures restart the gang and which fail the job at once.

Kubeflow's operator retried permanent errors forever and ignored backoffLimit (#2044, #2045);
here every failure is retryable (a restart, counted against backoffLimit), permanent (the job
fails immediately with the reason) or ignored (a disruption: the gang restarts without counting
it). The table is documented in docs/operator.md; spec.runPolicy.podFailurePolicy overrides it
(policy.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from meshrun.envcontract import (
    EXIT_CHECKPOINT_REFUSED,
    EXIT_CONFIG_ERROR,
    EXIT_LOSS_NOT_FINITE,
    EXIT_NO_ACCELERATOR,
    PERMANENT_REASONS,
)
from meshrun_operator import jobstatus
from meshrun_operator.jobstatus import Reason


class FailureClass(Enum):
    """Whether a failure is worth a whole-gang restart, and whether the restart counts."""

    RETRYABLE = "Retryable"
    """Restart the gang, counted against backoffLimit (podFailurePolicy action RestartJob)."""
    PERMANENT = "Permanent"
    """Fail the job at once (FailJob)."""
    IGNORED = "Ignored"
    """Restart the gang without counting it (Ignore): disruptions are not failures."""


@dataclass(frozen=True)
class Failure:
    """A classified failure of one pod."""

    kind: FailureClass
    """Retryable (restart the gang) or permanent (fail the job now)."""
    reason: str
    """CamelCase reason for conditions and events, e.g. ``OOMKilled`` or ``ConfigError``."""
    message: str
    """One sentence for people."""


# Pod-level reasons (pod.status.reason) that mean the cluster took the pod away, on purpose
# or with its node: disruptions, not failures of the job. The Job controller marks the same
# losses with the DisruptionTarget condition (TerminationByKubelet for node pressure and a node's
# graceful shutdown, DeletionByTaintManager and DeletionByPodGC for a lost or deleted node).
DISRUPTION_POD_REASONS = {
    "Evicted": "the kubelet evicted the pod (node pressure)",
    "Preempted": "a higher-priority pod preempted it",
    "Terminated": "the node shut down",
    "Shutdown": "the node shut down",
    "NodeLost": "its node stopped reporting",
}

# Pod-level reasons (pod.status.reason) that mean the kubelet could not run the pod.
RETRYABLE_POD_REASONS = {
    "UnexpectedAdmissionError": "the kubelet could not admit it",
}

# Container-level reasons (state.terminated.reason) that are permanent whatever the exit code.
PERMANENT_CONTAINER_REASONS = {
    "ContainerCannotRun": "the container could not start (bad command or image)",
    "StartError": "the container could not start (bad command or image)",
}

# Exit codes with a meaning of their own. 128+N is "killed by signal N" in every POSIX shell.
EXIT_CODES: dict[int, tuple[FailureClass, str, str]] = {
    1: (
        FailureClass.RETRYABLE,
        "Error",
        "generic error; torchrun exits 1 when any worker died, often a transient NCCL/gloo fault",
    ),
    EXIT_CONFIG_ERROR: (
        FailureClass.PERMANENT,
        PERMANENT_REASONS[EXIT_CONFIG_ERROR],
        "the trainer rejected its configuration (exit 2); a restart cannot fix it",
    ),
    EXIT_NO_ACCELERATOR: (
        FailureClass.PERMANENT,
        PERMANENT_REASONS[EXIT_NO_ACCELERATOR],
        "the job asks for GPUs but the trainer found no usable CUDA device (exit 3); it does "
        "not fall back to the CPU",
    ),
    EXIT_LOSS_NOT_FINITE: (
        FailureClass.PERMANENT,
        PERMANENT_REASONS[EXIT_LOSS_NOT_FINITE],
        "the training loss is not finite (NaN or infinite, exit 4); the trainer stopped "
        "before checkpointing it, and a restart would diverge again",
    ),
    EXIT_CHECKPOINT_REFUSED: (
        FailureClass.PERMANENT,
        PERMANENT_REASONS[EXIT_CHECKPOINT_REFUSED],
        "the trainer cannot load the checkpoint it must resume from (exit 5): it lacks state "
        "this model needs or its metadata names code to run; a restart would pick it again",
    ),
    126: (FailureClass.PERMANENT, "CommandNotExecutable", "the command cannot be executed"),
    127: (FailureClass.PERMANENT, "CommandNotFound", "the command was not found in the image"),
    130: (FailureClass.RETRYABLE, "Interrupted", "interrupted (SIGINT)"),
    134: (FailureClass.RETRYABLE, "Aborted", "aborted (SIGABRT), e.g. a NCCL watchdog abort"),
    137: (FailureClass.RETRYABLE, "Killed", "killed (SIGKILL), e.g. out of memory or preempted"),
    139: (FailureClass.RETRYABLE, "Segfault", "segmentation fault (SIGSEGV)"),
    143: (FailureClass.RETRYABLE, "Terminated", "terminated (SIGTERM), e.g. node drain"),
}


def classify(
    exit_code: int | None, container_reason: str | None, pod_reason: str | None
) -> Failure:
    """Classify one failed pod from its exit code and the reasons the kubelet reported.

    Order matters: the pod-level reason (eviction) beats the exit code the eviction caused,
    and OOMKilled is retryable even though its 137 would be anyway.
    """
    if pod_reason in DISRUPTION_POD_REASONS:
        return Failure(FailureClass.IGNORED, pod_reason, DISRUPTION_POD_REASONS[pod_reason])
    if pod_reason in RETRYABLE_POD_REASONS:
        return Failure(FailureClass.RETRYABLE, pod_reason, RETRYABLE_POD_REASONS[pod_reason])
    if container_reason == "OOMKilled":
        return Failure(
            FailureClass.RETRYABLE, "OOMKilled", "the container ran out of memory (OOMKilled)"
        )
    if container_reason in PERMANENT_CONTAINER_REASONS:
        return Failure(
            FailureClass.PERMANENT, container_reason, PERMANENT_CONTAINER_REASONS[container_reason]
        )
    if exit_code is None:
        return Failure(
            FailureClass.RETRYABLE, pod_reason or "Unknown", "the pod failed without an exit code"
        )
    if exit_code in EXIT_CODES:
        kind, reason, message = EXIT_CODES[exit_code]
        return Failure(kind, reason, f"exit code {exit_code}: {message}")
    if exit_code > 128:
        return Failure(
            FailureClass.RETRYABLE,
            "Signal",
            f"exit code {exit_code}: killed by signal {exit_code - 128}",
        )
    # 3..125: application-defined codes; meshrun's trainer uses none of them for transient
    # faults, so retrying would only burn backoffLimit on the same error.
    return Failure(
        FailureClass.PERMANENT,
        "ExitCode",
        f"exit code {exit_code}: application error treated as permanent",
    )


def node_lost(node: str, ready: bool | None, seconds: float = 0) -> Failure:
    """A pod whose node is NotReady (``ready`` False) for ``seconds`` or gone (``ready`` None):
    the infrastructure failed, not the job, so a disruption (backoffLimit is not charged), as
    the Job controller's DisruptionTarget (DeletionByTaintManager, DeletionByPodGC) says."""
    state = "was deleted" if ready is None else f"has been NotReady for {seconds:.0f}s"
    return disruption(Reason.NODE_LOST, Reason.NODE_LOST.message(node=node, state=state))


def disruption(reason: str, message: str) -> Failure:
    """A restart that is not the job's fault (a preemption, an eviction, a drain, a queue
    taking its quota back): the gang restarts and backoffLimit is not charged.

    ``Draft.failure(disruption(...), None, spec, current)`` restarts a gang this way.
    """
    return Failure(FailureClass.IGNORED, reason, message)


def deleted(target: str | None) -> Failure:
    """A pod of the running attempt deleted by someone else: a disruption when the pod was a
    disruption target (``target``: its DisruptionTarget reason), else PodDeleted (counted)."""
    if target is not None:
        return disruption(Reason.DISRUPTED, Reason.DISRUPTED.message(why=target))
    return Failure(FailureClass.RETRYABLE, Reason.POD_DELETED, jobstatus.DELETED_BY_SOMEONE)


# Waiting reasons of a container that will not start without a change (an image that cannot be
# pulled, a missing Secret or ConfigMap, runAsNonRoot with a root image, ...).
CANNOT_START = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "ErrImageNeverPull",
        "InvalidImageName",
        "RegistryUnavailable",
        "SignatureValidationFailed",
        "CreateContainerConfigError",
        "CreateContainerError",
        "PreStartHookError",
        "RunContainerError",
    }
)
HOPELESS = frozenset({"InvalidImageName"})
"""Waiting reasons no wait can cure: given up at once."""


def cannot_start(reason: str, message: str, seconds: float) -> Failure:
    """A pod whose container has waited ``seconds`` in a reason of CANNOT_START: permanent
    unless spec.runPolicy.podFailurePolicy says otherwise (a restart pulls the same image)."""
    text = jobstatus.CANNOT_START.format(why=message, seconds=f"{seconds:.0f}")
    return Failure(FailureClass.PERMANENT, reason, text)


def from_trainer(summary: Mapping[str, Any] | None) -> Failure | None:
    """The trainer's own verdict from its termination message, when it says a restart cannot
    help (``{"status": "Failed", "reason": ..., "permanent": true}``, docs/env-contract.md):
    torchrun exits 1 whatever its worker's code, so the exit code alone reads as retryable."""
    if not summary or summary.get("permanent") is not True:
        return None
    reason = summary.get("reason")
    if not isinstance(reason, str) or reason not in PERMANENT_REASONS.values():
        return None
    code = next(c for c, r in PERMANENT_REASONS.items() if r == reason)
    _, _, message = EXIT_CODES[code]
    return Failure(FailureClass.PERMANENT, reason, f"the trainer says: {message}")
