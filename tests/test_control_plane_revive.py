"""The local control plane outlives a dead component: kube-controller-manager and kube-scheduler
run without leader election (a single instance has no one to hand a lease to, and a loaded
machine that renews it late no longer makes them exit), and `hack/cluster.sh up` on a running
cluster starts again whatever died.

Killing components would stop every other session's tests, so this runs a throwaway control
plane of its own (hack/cluster.sh with its own folder and name), never touching the shared one.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(ROOT / "hack" / "cluster.sh")
KUBECTL = ROOT / ".cluster" / "bin" / "kubectl"
SUPERVISED = ("kube-controller-manager", "kube-scheduler")


@dataclass
class Throwaway:
    env: dict[str, str]
    pids: Path
    """kwokctl's pid files, one per component."""
    kubectl: Callable[..., subprocess.CompletedProcess[str]]

    def script(self, command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [SCRIPT, command], env=self.env, capture_output=True, text=True, timeout=300
        )

    def pid(self, component: str) -> int:
        return int((self.pids / f"{component}.pid").read_text())


def alive(pid: int) -> bool:
    """Running and not a zombie (a killed child nobody reaped still answers kill -0)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except (FileNotFoundError, IndexError):
        return False


@pytest.fixture(scope="module")
def throwaway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Throwaway]:
    state = tmp_path_factory.mktemp("revive-cluster")
    name = f"meshrun-revive-{uuid.uuid4().hex[:6]}"
    env = {
        **os.environ,
        "MESHRUN_CLUSTER_DIR": str(state),
        "MESHRUN_CLUSTER_NAME": name,
        "NODES": "1",
        "REAL_NODE": "0",
    }
    kubeconfig = str(state / "kubeconfig")

    def kubectl(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [str(KUBECTL), "--kubeconfig", kubeconfig, *args],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {proc.stderr}{proc.stdout}")
        return proc

    cluster = Throwaway(env, state / "kwok" / "clusters" / name / "pids", kubectl)
    try:
        up = cluster.script("up")
        assert up.returncode == 0, f"throwaway cluster: {up.stdout}\n{up.stderr}"
        yield cluster
    finally:
        subprocess.run([SCRIPT, "down"], env=env, capture_output=True, timeout=300)


def deployment(namespace: str) -> str:
    """One pod on the fake node: needs the controller-manager (ReplicaSet) and the scheduler."""
    body: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "probe", "namespace": namespace},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "probe"}},
            "template": {
                "metadata": {"labels": {"app": "probe"}},
                "spec": {
                    "nodeSelector": {"type": "kwok"},
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [{"name": "probe", "image": "probe"}],
                },
            },
        },
    }
    return json.dumps(body)


def scheduled_pods(cluster: Throwaway, namespace: str) -> list[str]:
    out = cluster.kubectl("get", "pods", "-n", namespace, "-o", "json").stdout
    return [p["spec"]["nodeName"] for p in json.loads(out)["items"] if p["spec"].get("nodeName")]


def control_plane_works(cluster: Throwaway) -> None:
    """A Deployment's pod is made and scheduled, and its namespace is deleted to the end."""
    namespace = f"revive-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", namespace)
    wait_for(
        lambda: (
            cluster.kubectl("get", "sa", "default", "-n", namespace, check=False).returncode == 0
        ),
        60,
        "the default service account (controller-manager)",
    )
    subprocess.run(
        [str(KUBECTL), "--kubeconfig", cluster.env["MESHRUN_CLUSTER_DIR"] + "/kubeconfig",
         "apply", "-f", "-"],
        input=deployment(namespace), capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    wait_for(lambda: scheduled_pods(cluster, namespace), 90, "the probe pod scheduled")
    cluster.kubectl("delete", "namespace", namespace, "--wait=true", "--timeout=90s")


def test_no_leader_election(throwaway: Throwaway) -> None:
    control_plane_works(throwaway)
    leases = throwaway.kubectl("get", "leases", "-n", "kube-system", "-o", "name").stdout
    for component in SUPERVISED:
        assert f"lease.coordination.k8s.io/{component}\n" not in leases, leases


def test_up_starts_a_dead_component_again(throwaway: Throwaway) -> None:
    before = {c: throwaway.pid(c) for c in SUPERVISED}
    for pid in before.values():
        os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not any(alive(p) for p in before.values()), 30, "both components dead")

    status = throwaway.script("status")
    assert status.returncode == 1
    assert "not running: kube-controller-manager kube-scheduler" in status.stdout, status.stdout

    up = throwaway.script("up")
    assert up.returncode == 0, f"{up.stdout}\n{up.stderr}"
    assert "starting them again" in up.stdout, up.stdout
    after = {c: throwaway.pid(c) for c in SUPERVISED}
    for component in SUPERVISED:
        assert after[component] != before[component]
        assert alive(after[component]), component
    assert throwaway.script("status").returncode == 0
    control_plane_works(throwaway)
