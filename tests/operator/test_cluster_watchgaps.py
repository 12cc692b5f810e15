"""Watch gaps on a real API server: what was deleted while the operator's watches were down (and
their resourceVersion compacted away, so they resume with 410 Gone and list again) is dropped.

This needs an API server without a watch cache (watches then resume from etcd, whose history the
test compacts), so it runs a throwaway control plane of its own (hack/cluster.sh with its own
folder and name), never touching the shared one.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from api_proxy import ApiProxy
from operator_harness import Cluster, Kubectl, OperatorProcess, job_manifest, wait_seconds
from test_cluster_stalls import assert_cleaned_up, one_pod_per_index
from waiting import wait_established, wait_for

from meshrun.api.crd import GROUP, PLURAL

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(420)]

ROOT = Path(__file__).resolve().parents[2]
KUBECTL = ROOT / ".cluster" / "bin" / "kubectl"
CRD = ROOT / "crds" / "meshrun.dev_paralleltrainingjobs.yaml"


@dataclass
class GapCluster:
    """The throwaway control plane: its kubeconfig, kubectl and etcd."""

    kubeconfig: str
    kubectl: Kubectl
    etcd: str
    """etcd's client URL (plain HTTP on 127.0.0.1, as kwokctl runs it)."""

    def etcd_call(self, method: str, body: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(
            f"{self.etcd}/v3/{method}", data=json.dumps(body).encode(), method="POST"
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            answer: dict[str, Any] = json.loads(response.read())
        return answer

    def revision(self) -> int:
        key = base64.b64encode(b"/registry/").decode()
        return int(self.etcd_call("kv/range", {"key": key, "limit": 1})["header"]["revision"])

    def compact(self) -> int:
        """Compact etcd's history up to now: older resourceVersions are gone."""
        revision = self.revision()
        self.etcd_call("kv/compaction", {"revision": str(revision), "physical": True})
        return revision


@pytest.fixture(scope="module")
def gap_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GapCluster]:
    state = tmp_path_factory.mktemp("gap-cluster")
    env = {
        **os.environ,
        "MESHRUN_CLUSTER_DIR": str(state),
        "MESHRUN_CLUSTER_NAME": f"meshrun-gaps-{uuid.uuid4().hex[:6]}",
        "NODES": "2",
        "REAL_NODE": "0",
        "APISERVER_ARGS": "watch-cache=false",
    }
    script = str(ROOT / "hack" / "cluster.sh")
    up = subprocess.run([script, "up"], env=env, capture_output=True, text=True, timeout=600)
    try:
        assert up.returncode == 0, f"throwaway cluster: {up.stdout}\n{up.stderr}"
        kubeconfig = str(state / "kubeconfig")
        config = next((state / "kwok" / "clusters").glob("*/kwok.yaml")).read_text()
        (etcd,) = re.findall(r"--etcd-servers=(\S+)", config)

        def kubectl(*args: str, input: str | None = None, check: bool = True) -> Any:
            proc = subprocess.run(
                [str(KUBECTL), "--kubeconfig", kubeconfig, *args],
                input=input, capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            if check and proc.returncode != 0:
                raise AssertionError(f"kubectl {' '.join(args)}: {proc.stderr}{proc.stdout}")
            return proc

        kubectl("apply", "--server-side", "-f", str(CRD))
        wait_established(kubectl, f"{PLURAL}.{GROUP}")
        yield GapCluster(kubeconfig, kubectl, etcd)
    finally:
        subprocess.run([script, "down"], env=env, capture_output=True, timeout=300)


def watch_gone(gap: GapCluster, namespace: str, version: int) -> bool:
    """True when a watch resuming at ``version`` is told 410 Gone (as kopf's will be)."""
    url = f"/api/v1/namespaces/{namespace}/pods?watch=1&resourceVersion={version}&timeoutSeconds=1"
    out = gap.kubectl("get", "--raw", url, check=False)
    return '"code":410' in out.stdout.replace(" ", "") or "410" in out.stderr


def ghosts(operator: OperatorProcess, kind: str) -> float:
    found = re.search(
        rf'^meshrun_operator_watch_ghosts_total\{{kind="{kind}"\}} (\S+)$', operator.metrics(), re.M
    )
    return float(found.group(1)) if found else 0.0


def test_what_a_watch_gap_deleted_is_dropped(gap_cluster: GapCluster, tmp_path: Path) -> None:
    namespace = f"gaps-{uuid.uuid4().hex[:6]}"
    gap_cluster.kubectl("create", "namespace", namespace)
    wait_for(
        lambda: (
            gap_cluster.kubectl("get", "sa", "default", "-n", namespace, check=False).returncode
            == 0
        ),
        30,
        "the default service account",
    )
    cluster = Cluster(gap_cluster.kubectl, namespace)
    proxy = ApiProxy(gap_cluster.kubeconfig)
    through_proxy = proxy.kubeconfig(tmp_path / "proxied-kubeconfig")
    operator = OperatorProcess(through_proxy, namespace, tmp_path).start()
    try:
        for job in ("kept", "gone"):
            cluster.apply(job_manifest(job))
        for job in ("kept", "gone"):
            cluster.wait_running_pods(job, 2)
            cluster.wait_phase(job, "Running")

        # The gap: the operator's connections drop; meanwhile one job is deleted (its pods go
        # with it) and a pod of the other is force-deleted; etcd forgets the history.
        proxy.cut()
        cut = gap_cluster.revision()
        cluster.kubectl("delete", PLURAL, "gone", "-n", namespace, "--wait=true")
        cluster.kubectl("delete", "pod", "kept-1", "-n", namespace, "--grace-period=0", "--force")
        wait_for(lambda: not cluster.pods("gone"), 60, "job gone's pods garbage-collected")
        gap_cluster.compact()
        assert watch_gone(gap_cluster, namespace, cut), "a watch from before the gap resumes"
        proxy.restore()

        # The watches list again; the audit drops the ghosts: kept learns its pod vanished.
        wait_for(lambda: ghosts(operator, "job") >= 1, 90, "the deleted job dropped")
        wait_for(lambda: ghosts(operator, "pod") >= 3, 30, "the 3 deleted pods dropped")
        status = wait_for(
            lambda: (s := cluster.status("kept")).get("restarts") == 1 and s,
            60,
            "job kept restarting after its pod vanished in the gap",
        )
        assert status["lastFailure"]["reason"] == "PodDeleted"
        cluster.wait_running_pods("kept", 2, attempt=1)
        # The deleted job never gets children again.
        wait_seconds(3)
        assert cluster.pods("gone") == []
        assert "was deleted while a watch was down" in operator.log_tail(400)
        for index in range(2):
            cluster.finish(f"kept-{index}", "Succeeded")
        assert cluster.wait_phase("kept", "Succeeded")["restarts"] == 1
        one_pod_per_index(cluster, "kept", 2)
        assert_cleaned_up(cluster, "kept")
    finally:
        operator.stop()
        proxy.close()
        print(f"--- operator log ---\n{operator.log_tail(60)}")
