"""Helpers of the Kueue cluster tests: Workloads created, read, waited on and patched through
kubectl, the way the operator will talk to them."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from meshrun_operator import kueue
from meshrun_operator.kueue_state import WorkloadState, read_workload
from waiting import wait_for

Kubectl = Callable[..., subprocess.CompletedProcess[str]]


@dataclass(frozen=True)
class KueueEnv:
    """The shared queues: one namespace (with its LocalQueue of the same name) per team."""

    namespaces: dict[str, str]
    """Team (LocalQueue name) -> namespace."""
    setup_seconds: float
    """How long hack/kueue/up.sh took this session (a cold build included)."""


def get_json(kubectl: Kubectl, *args: str) -> dict[str, Any]:
    return json.loads(kubectl("get", *args, "-o", "json").stdout)  # type: ignore[no-any-return]


def create(kubectl: Kubectl, obj: Mapping[str, Any]) -> None:
    kubectl("create", "-f", "-", input=json.dumps(obj))


def workload(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    return get_json(kubectl, kueue.WORKLOAD_PLURAL, name, "-n", namespace)


def wait_state(
    kubectl: Kubectl,
    namespace: str,
    name: str,
    check: Callable[[WorkloadState], bool],
    what: str,
    timeout: float = 60,
) -> WorkloadState:
    """Poll the Workload until ``check`` holds for its state; the state."""

    def reached() -> WorkloadState | None:
        state = read_workload(workload(kubectl, namespace, name))
        return state if check(state) else None

    def seen() -> object:
        status = workload(kubectl, namespace, name).get("status", {})
        conditions = status.get("conditions", [])
        return [(c["type"], c["status"], c["reason"], c["message"]) for c in conditions]

    return wait_for(reached, timeout, f"Workload {namespace}/{name} {what}", describe=seen)


def patch_status(
    kubectl: Kubectl,
    namespace: str,
    name: str,
    make_patch: Callable[[Mapping[str, Any], datetime], dict[str, Any] | None],
) -> bool:
    """Apply one of kueue_state's status patches, recomputed on a conflict (as the operator
    does: the patch carries the resourceVersion it was computed from). False: nothing to do."""
    for _ in range(10):
        current = workload(kubectl, namespace, name)
        patch = make_patch(current, datetime.now(UTC))
        if patch is None:
            return False
        proc = kubectl(
            "patch",
            kueue.WORKLOAD_PLURAL,
            name,
            "-n",
            namespace,
            "--subresource=status",
            "--type=merge",
            "-p",
            json.dumps(patch),
            check=False,
        )
        if proc.returncode == 0:
            return True
        if "the object has been modified" not in proc.stderr:
            raise AssertionError(f"status patch of {name} refused: {proc.stderr}")
    raise AssertionError(f"status patch of {name} kept conflicting")


def priority_value(kubectl: Kubectl, name: str) -> int:
    """A WorkloadPriorityClass's value, which the Workload's creator copies into spec.priority."""
    return int(get_json(kubectl, "workloadpriorityclasses", name)["value"])
