"""Failure classification: which pod failures restart the gang and which fail the job at once.

Kubeflow's operator retried permanent errors forever and ignored backoffLimit (#2044, #2045);
here every failure is either retryable (a restart, counted against backoffLimit) or permanent
(the job fails immediately with the reason). The table is documented in docs/operator.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from meshrun_operator.vocabulary import Reason


class FailureClass(Enum):
    """Whether a failure is worth a whole-gang restart."""

    RETRYABLE = "Retryable"
    PERMANENT = "Permanent"


@dataclass(frozen=True)
class Failure:
    """A classified failure of one pod."""

    kind: FailureClass
    """Retryable (restart the gang) or permanent (fail the job now)."""
    reason: str
    """CamelCase reason for conditions and events, e.g. ``OOMKilled`` or ``ConfigError``."""
    message: str
    """One sentence for people."""


# Pod-level reasons (pod.status.reason) that mean the node or the cluster took the pod away.
RETRYABLE_POD_REASONS = {
    "Evicted": "the kubelet evicted the pod (node pressure)",
    "Preempted": "a higher-priority pod preempted it",
    "Terminated": "the node shut down",
    "Shutdown": "the node shut down",
    "NodeLost": "its node stopped reporting",
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
    2: (
        FailureClass.PERMANENT,
        "ConfigError",
        "the trainer rejected its configuration (exit 2); a restart cannot fix it",
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


def node_lost(node: str, ready: bool | None) -> Failure:
    """A pod whose node is NotReady (``ready`` False) or gone (``ready`` None)."""
    state = "was deleted" if ready is None else "is NotReady"
    message = Reason.NODE_LOST.message(node=node, state=state)
    return Failure(FailureClass.RETRYABLE, Reason.NODE_LOST, message)
