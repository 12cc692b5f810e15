"""Fixtures of the real-node tests: a kubelet node that really runs containers.

``real_node`` reuses a Ready node labelled ``meshrun.dev/real-node=true`` or, on the local
cluster, adds one with hack/realnode/up.sh (which builds what is missing). It stays up for the
rest of the session, like the cluster itself; ``hack/cluster.sh down`` removes it.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from realnode_support import REAL_NODE_LABEL, ROOT, Kubectl


def _ready_real_nodes(kubectl: Kubectl) -> list[str]:
    proc = kubectl("get", "nodes", "-l", f"{REAL_NODE_LABEL}=true", "-o", "json", check=False)
    if proc.returncode != 0:
        return []
    names = []
    for node in json.loads(proc.stdout)["items"]:
        conditions = {c["type"]: c["status"] for c in node["status"].get("conditions", [])}
        if conditions.get("Ready") == "True":
            names.append(node["metadata"]["name"])
    return names


@pytest.fixture(scope="session")
def real_node(kubectl: Kubectl, kubeconfig: str) -> str:
    """Name of a Ready real node, added to the local cluster when there is none."""
    ready = _ready_real_nodes(kubectl)
    if ready:
        return ready[0]
    if os.environ.get("MESHRUN_TEST_KUBECONFIG"):
        pytest.fail(
            "the cluster of MESHRUN_TEST_KUBECONFIG has no Ready node labelled "
            f"{REAL_NODE_LABEL}=true"
        )
    up = subprocess.run(
        [str(ROOT / "hack" / "realnode" / "up.sh")], capture_output=True, text=True, timeout=1800
    )
    if up.returncode != 0:
        pytest.fail(f"hack/realnode/up.sh failed ({up.returncode}):\n{up.stdout}\n{up.stderr}")
    ready = _ready_real_nodes(kubectl)
    assert ready, f"up.sh succeeded but no Ready real node is registered:\n{up.stdout}"
    return ready[0]
