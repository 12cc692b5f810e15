"""Print (as a JSON List) the demo job on the real node: examples/demo-3d-cpu.yaml with the real
node's selector and toleration and checkpoints on a hostPath volume, plus that PV and its PVC.

    python hack/realnode/demo_job.py NAMESPACE CHECKPOINT_DIR [JOB_FILE]
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
LABEL = "meshrun.dev/real-node"


def objects(namespace: str, checkpoint_dir: str, job_file: Path) -> list[dict[str, Any]]:
    job: dict[str, Any] = yaml.safe_load(job_file.read_text())
    name = job["metadata"]["name"]
    claim = f"{name}-checkpoints"
    job["metadata"]["namespace"] = namespace
    spec = job["spec"]
    spec["podTemplate"] = {
        "spec": {
            "nodeSelector": {LABEL: "true"},
            "tolerations": [
                {"key": LABEL, "operator": "Equal", "value": "true", "effect": "NoSchedule"}
            ],
        }
    }
    spec["training"].setdefault("checkpoint", {})["volume"] = claim
    # PVs are cluster-wide: the namespace's digest keeps two namespaces' PVs apart.
    pv_name = f"{claim[:40]}-{hashlib.sha256(namespace.encode()).hexdigest()[:10]}"
    pv = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": pv_name},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteMany"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "",
            "hostPath": {"path": checkpoint_dir, "type": "Directory"},
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
            "volumeName": pv_name,
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }
    return [pv, pvc, job]


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    job_file = Path(sys.argv[3]) if len(sys.argv) == 4 else ROOT / "examples" / "demo-3d-cpu.yaml"
    items = objects(sys.argv[1], sys.argv[2], job_file)
    print(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}, indent=1))
