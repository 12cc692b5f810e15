"""Edits of a pod spec built from the user's template: env, the trainer container, security,
affinity and the checkpoint volume. Each edit fills in only what the template left unset."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from meshrun.api.hardware import PRODUCT_LABEL
from meshrun_operator import names

# Checkpoints live here in every pod: on the PVC named by spec.training.checkpoint.volume (so a
# restarted gang resumes), else on an emptyDir that dies with the pod.
CHECKPOINT_MOUNT = "/checkpoints"
CHECKPOINT_VOLUME = "meshrun-checkpoints"


def fill_unset(fields: dict[str, Any], key: str, default: Any) -> Any:
    """``fields[key]``, set to ``default`` first where the key is missing or null. A null is
    unset to the API server, so ``setdefault``, which keeps it, would leave the field without
    the operator's default (a ``runAsNonRoot: null`` pod runs as root)."""
    if fields.get(key) is None:
        fields[key] = default
    return fields[key]


def merge_env(container: dict[str, Any], env: Mapping[str, str]) -> None:
    """Add the operator's variables the user did not set; the user's own value wins."""
    current = fill_unset(container, "env", [])
    present = {item.get("name") for item in current}
    current.extend({"name": k, "value": v} for k, v in sorted(env.items()) if k not in present)


def trainer_container(template_spec: dict[str, Any]) -> dict[str, Any]:
    """The template's container named ``trainer`` (or its first one), or a new one in front."""
    containers: list[dict[str, Any]] = fill_unset(template_spec, "containers", [])
    for existing in containers:
        if existing.get("name") == names.TRAINER_CONTAINER:
            return existing
    if containers and not containers[0].get("name"):
        containers[0]["name"] = names.TRAINER_CONTAINER
        return containers[0]
    created: dict[str, Any] = {"name": names.TRAINER_CONTAINER}
    containers.insert(0, created)
    return created


def restricted_security(pod_spec: dict[str, Any]) -> None:
    """Pod Security Standards "restricted" defaults, only where the template set none (a null
    is none), on every
    container and init container (a sidecar without them fails a restricted namespace's
    admission), and no service account token unless the template asks
    (``automountServiceAccountToken: true``): a trainer has no business with the API server,
    and a token in every pod is one to steal. Capabilities the template adds are kept, after
    dropping all the others.

    https://kubernetes.io/docs/concepts/security/pod-security-standards/#restricted
    """
    fill_unset(pod_spec, "automountServiceAccountToken", False)
    pod_security = fill_unset(pod_spec, "securityContext", {})
    fill_unset(pod_security, "runAsNonRoot", True)
    fill_unset(pod_security, "seccompProfile", {"type": "RuntimeDefault"})
    for key in ("initContainers", "containers"):
        for container in pod_spec.get(key) or []:
            security = fill_unset(container, "securityContext", {})
            if security.get("privileged") is not True:  # the API server refuses both together
                fill_unset(security, "allowPrivilegeEscalation", False)
            fill_unset(fill_unset(security, "capabilities", {}), "drop", ["ALL"])


def select_product(pod_spec: dict[str, Any], product: str | None) -> None:
    """Only nodes of GPU ``product`` (their nvidia.com/gpu.product label), unless the template
    selects a value of that label itself."""
    if product is not None:
        fill_unset(fill_unset(pod_spec, "nodeSelector", {}), PRODUCT_LABEL, product)


def domain_affinity(pod_spec: dict[str, Any], topology_key: str, domains: Sequence[str]) -> None:
    """Prefer nodes whose ``topology_key`` is one of ``domains`` (the pod's stage's, chosen by
    the operator: placer.py), unless the template prefers values of that key itself.

    Preferred, never required: a rack that fills up meanwhile must not leave a pod Pending.
    """
    node_affinity = fill_unset(fill_unset(pod_spec, "affinity", {}), "nodeAffinity", {})
    preferred = fill_unset(node_affinity, "preferredDuringSchedulingIgnoredDuringExecution", [])
    for term in preferred:
        expressions = (term.get("preference") or {}).get("matchExpressions") or []
        if any(e.get("key") == topology_key for e in expressions):
            return
    expression = {"key": topology_key, "operator": "In", "values": list(domains)}
    preferred.append({"weight": 100, "preference": {"matchExpressions": [expression]}})


def stage_affinity(pod_spec: dict[str, Any], job: str, stage: int, topology_key: str) -> None:
    """Prefer nodes that share ``topology_key`` with the other pods of the same pipeline stage:
    what a pod gets when the operator did not choose its stage's domains (placer.py).

    Preferred, not required: a required self-affinity would let the first pod of a stage pin
    the whole stage to one rack even when that rack is full.
    """
    pod_affinity = fill_unset(fill_unset(pod_spec, "affinity", {}), "podAffinity", {})
    preferred = fill_unset(pod_affinity, "preferredDuringSchedulingIgnoredDuringExecution", [])
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


SHM_VOLUME = "meshrun-shm"
NCCL_DEFAULTS = {
    # A failed or timed-out collective tears the process down (the pod fails and the operator
    # restarts the gang) instead of leaving every rank blocked.
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    # The flight recorder keeps the last collectives of each rank and writes them when the
    # watchdog times out, next to the checkpoints (so they outlive the pod on a volume):
    # /checkpoints/nccl-flight-recorder-rank-<rank>, read with torch's fr_trace tool.
    "TORCH_FR_BUFFER_SIZE": "2000",
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
    "TORCH_FR_DUMP_TEMP_FILE": f"{CHECKPOINT_MOUNT}/nccl-flight-recorder-rank-",
}
"""Variables a GPU pod gets unless its template sets them (docs/operator.md, "NCCL")."""


def shared_memory(
    pod_spec: dict[str, Any], container: dict[str, Any], size_gib: int | None
) -> None:
    """A memory-backed emptyDir on /dev/shm (``size_gib`` its limit), unless the template
    mounts something there itself."""
    mounts = fill_unset(container, "volumeMounts", [])
    if any(m.get("mountPath") == "/dev/shm" for m in mounts):
        return
    source: dict[str, Any] = {"medium": "Memory"}
    if size_gib is not None:
        source["sizeLimit"] = f"{size_gib}Gi"
    fill_unset(pod_spec, "volumes", []).append({"name": SHM_VOLUME, "emptyDir": source})
    mounts.append({"name": SHM_VOLUME, "mountPath": "/dev/shm"})


def checkpoint_volume(
    claim: str | None, pod_spec: dict[str, Any], container: dict[str, Any]
) -> None:
    """Mount the checkpoint volume: the PVC ``claim`` (spec.training.checkpoint.volume), or an
    emptyDir when there is none."""
    source: dict[str, Any] = (
        {"persistentVolumeClaim": {"claimName": claim}} if claim else {"emptyDir": {}}
    )
    volumes = fill_unset(pod_spec, "volumes", [])
    if not any(v.get("name") == CHECKPOINT_VOLUME for v in volumes):
        volumes.append({"name": CHECKPOINT_VOLUME, **source})
    mounts = fill_unset(container, "volumeMounts", [])
    if not any(m.get("name") == CHECKPOINT_VOLUME for m in mounts):
        mounts.append({"name": CHECKPOINT_VOLUME, "mountPath": CHECKPOINT_MOUNT})
