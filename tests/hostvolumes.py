"""A PersistentVolumeClaim bound ahead of time to a hostPath PersistentVolume: how cluster
tests give a job a checkpoint volume without a storage provisioner."""

from __future__ import annotations

from typing import Any


def host_path_claim(
    namespace: str,
    claim: str,
    volume: str,
    path: str,
    *,
    reclaim: str = "Retain",
    labels: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """The PersistentVolume ``volume`` on ``path`` and the claim ``claim`` bound to it, as a list
    for one ``kubectl apply``. PVs are cluster-wide: ``volume`` must be unique per namespace."""
    pv = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": volume, "labels": labels or {}},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteMany"],
            "persistentVolumeReclaimPolicy": reclaim,
            "storageClassName": "",
            "hostPath": {"path": path},
            "claimRef": {"namespace": namespace, "name": claim},
        },
    }
    pvc = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": claim, "namespace": namespace},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "storageClassName": "",
            "volumeName": volume,
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }
    return [pv, pvc]
