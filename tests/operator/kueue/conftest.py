"""Fixtures of the Kueue cluster tests: Kueue next to the local control plane, and the queues.

``kueue`` runs hack/kueue/up.sh, the same path as ``KUEUE=1 make cluster-up`` (it builds the
Kueue manager when the cache lacks it, then starts or reuses it). ``kueue_env`` adds the
objects of kueue_objects.py and one namespace with a LocalQueue per team (the namespaces go at
the end of the session, the rest stays for the next one); ``kueue_pool`` adds the flavor's
private node pool for one test module.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import kueue_objects as ko
import pytest
from kueue_support import Kubectl, KueueEnv
from namespaces import TEST_RUN_LABEL, run_is_alive, run_label
from scheduling import shared_setup
from waiting import wait_for

ROOT = Path(__file__).resolve().parents[3]
# The operator's cluster-test harness (the operator as a subprocess, kubectl helpers) serves the
# Kueue tests too.
sys.path.insert(0, str(ROOT / "tests" / "operator"))
TEST_LABEL = "meshrun.dev/kueue-test"
# Namespaces of an earlier session that died without its teardown hold Workloads, and with them
# quota; older than this, they are removed before a new session starts.
STALE_AFTER = timedelta(minutes=10)


@pytest.fixture(scope="session")
def kueue(kubeconfig: str, kubectl: Kubectl) -> float:
    """Kueue installed and its webhooks answering; the seconds hack/kueue/up.sh took."""
    if os.environ.get("MESHRUN_TEST_KUBECONFIG"):
        found = kubectl("get", "crd", "workloads.kueue.x-k8s.io", check=False)
        if found.returncode != 0:
            pytest.fail("the cluster of MESHRUN_TEST_KUBECONFIG has no Kueue (install v0.17)")
        return 0.0
    started = time.monotonic()
    with shared_setup("kueue"):
        up = subprocess.run(
            [str(ROOT / "hack" / "kueue" / "up.sh")], capture_output=True, text=True, timeout=1800
        )
    if up.returncode != 0:
        pytest.fail(f"hack/kueue/up.sh failed ({up.returncode}):\n{up.stdout}\n{up.stderr}")
    return time.monotonic() - started


def _apply(kubectl: Kubectl, *objects: dict[str, object]) -> None:
    document = json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)})
    kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=document)


def _pool_ready(kubectl: Kubectl) -> bool:
    nodes = json.loads(
        kubectl("get", "nodes", "-l", f"{ko.POOL_LABEL}={ko.POOL}", "-o", "json").stdout
    )
    ready = [
        n
        for n in nodes["items"]
        if any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"]["conditions"])
    ]
    return len(ready) >= ko.POOL_NODES


def _remove_stale_namespaces(kubectl: Kubectl) -> None:
    found = json.loads(kubectl("get", "namespaces", "-l", TEST_LABEL, "-o", "json").stdout)
    now = datetime.now(UTC)
    for item in found["items"]:
        created = datetime.fromisoformat(
            item["metadata"]["creationTimestamp"].replace("Z", "+00:00")
        )
        run = item["metadata"]["labels"].get(TEST_RUN_LABEL, "")
        if now - created > STALE_AFTER and not run_is_alive(run):
            kubectl("delete", "namespace", item["metadata"]["name"], "--wait=false", check=False)


@pytest.fixture(scope="session")
def kueue_env(kueue: float, kubectl: Kubectl) -> Iterator[KueueEnv]:
    """The shared Kueue objects and one LocalQueue namespace per team."""
    _remove_stale_namespaces(kubectl)
    _apply(kubectl, *ko.cluster_objects())
    session = uuid.uuid4().hex[:6]
    namespaces = {team: f"kueue-{team}-{session}" for team in ko.TEAMS}
    for team, namespace in namespaces.items():
        kubectl("create", "namespace", namespace)
        kubectl("label", "namespace", namespace, f"{TEST_LABEL}=true")
        kubectl("label", "namespace", namespace, f"{TEST_RUN_LABEL}={run_label()}")
        _apply(kubectl, ko.local_queue(team, namespace))

    def active(kind: str, name: str, namespace: str | None = None) -> bool:
        where = ["-n", namespace] if namespace else []
        out = kubectl("get", kind, name, *where, "-o", "json").stdout
        conditions = json.loads(out).get("status", {}).get("conditions", [])
        return any(c["type"] == "Active" and c["status"] == "True" for c in conditions)

    wait_for(lambda: active("clusterqueues", ko.CLUSTER_QUEUE), 60, "the ClusterQueue Active")
    for team, namespace in namespaces.items():
        wait_for(
            lambda t=team, n=namespace: active("localqueues", t, n), 60, f"LocalQueue {team} Active"
        )
    yield KueueEnv(namespaces=namespaces, setup_seconds=kueue)
    for namespace in namespaces.values():
        kubectl("delete", "namespace", namespace, "--wait=false", check=False)


@pytest.fixture(scope="module")
def kueue_pool(kueue_env: KueueEnv, kubectl: Kubectl) -> Iterator[str]:
    """The flavor's private node pool, there only while a module of Kueue tests runs: its
    tainted nodes would otherwise show up in other tests' scheduling messages."""
    script = ROOT / "hack" / "kwok" / "nodes.py"
    nodes = subprocess.run(
        [sys.executable, str(script), str(ko.POOL_NODES), "--pool", ko.POOL],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=nodes)
    wait_for(lambda: _pool_ready(kubectl), 120, f"{ko.POOL_NODES} Ready nodes in pool {ko.POOL}")
    yield ko.POOL
    selector = f"{ko.POOL_LABEL}={ko.POOL}"
    kubectl("delete", "nodes", "-l", selector, "--wait=false", check=False)
