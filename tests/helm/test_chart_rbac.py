"""The chart's RBAC is enough: the operator, authenticated only by the chart's ServiceAccount
token and started with the installed Deployment's own flags, runs a job through a whole-gang
restart to Succeeded and deletes it after its TTL; and it is not more than needed.

The Deployment itself lands on a fake KWOK node (no image runs there), so the operator runs
here as a subprocess with a kubeconfig made from ``kubectl create token``, exactly as a pod of
that ServiceAccount would authenticate.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helm_support import Kubectl, Release, can_i, token_kubeconfig
from waiting import wait_for

from meshrun.localnet import free_port

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

FAST = {"resyncSeconds": 0.5, "backoffBaseSeconds": 1, "backoffMaxSeconds": 2}
JOB = "rbac-proof"


def healthy(port: int, proc: subprocess.Popen[bytes], log: Path) -> bool:
    if proc.poll() is not None:
        raise AssertionError(f"operator exited {proc.returncode}:\n{log.read_text()[-3000:]}")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2):
            return True
    except OSError:
        return False


@pytest.fixture
def chart_operator(
    kubectl: Kubectl, release: Release, new_namespace: Callable[[str], str], tmp_path: Path
) -> Iterator[tuple[str, Path]]:
    """Install the chart in namespaced mode and run its operator with its token.

    Yields (the served namespace, the operator's log file).
    """
    jobs_ns = new_namespace("jobs")
    release.install({"watchNamespaces": [jobs_ns], "operator": {**FAST, "progressHttp": False}})
    deploy = json.loads(
        kubectl(
            "get", "deployment", f"{release.name}-meshrun", "-n", release.namespace, "-o", "json"
        ).stdout
    )
    (container,) = deploy["spec"]["template"]["spec"]["containers"]
    account = deploy["spec"]["template"]["spec"]["serviceAccountName"]
    config = token_kubeconfig(kubectl, release.namespace, account, tmp_path / "sa.kubeconfig")
    health = free_port()
    log = tmp_path / "operator.log"
    # The installed Deployment's command and flags; only the ports move (later flags win) so
    # that parallel tests on this machine do not collide.
    command = [sys.executable, *container["command"][1:], *container["args"]]
    command += [f"--metrics-port={free_port()}", f"--health-port={health}"]
    env = {**os.environ, "KUBECONFIG": str(config), "PYTHONUNBUFFERED": "1"}
    with log.open("wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        wait_for(lambda: healthy(health, proc, log), 60, "the operator's /healthz")
        yield jobs_ns, log
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        print(f"--- operator log ---\n{log.read_text()[-4000:]}")
        # Jobs carry no finalizer today; should one ever be left (an operator killed while
        # finalizing), drop it so the namespace can be deleted instead of staying Terminating.
        left = kubectl("get", "paralleltrainingjobs", "-n", jobs_ns, "-o", "name", check=False)
        for name in left.stdout.split():
            kubectl(
                "patch", name, "-n", jobs_ns, "--type=merge",
                "-p", '{"metadata":{"finalizers":null}}', check=False,
            )  # fmt: skip


def job_manifest() -> dict[str, Any]:
    return {
        "apiVersion": "meshrun.dev/v1alpha1",
        "kind": "ParallelTrainingJob",
        "metadata": {"name": JOB},
        "spec": {
            "image": "meshrun/trainer:0.1.0",
            "resources": {"numNodes": 2, "numProcPerNode": 1},
            "strategy": {"type": "ddp"},
            "model": {"preset": "tiny"},
            "training": {"steps": 5, "globalBatchSize": 4, "microBatchSize": 1},
            "runPolicy": {"backoffLimit": 2, "ttlSecondsAfterFinished": 4},
        },
    }


def test_operator_with_the_chart_token_runs_a_job_to_succeeded(
    kubectl: Kubectl, chart_operator: tuple[str, Path]
) -> None:
    ns, log = chart_operator

    def get(*args: str) -> Any:
        return json.loads(kubectl("get", *args, "-n", ns, "-o", "json").stdout)

    def status() -> dict[str, Any]:
        found: dict[str, Any] = get("paralleltrainingjobs", JOB).get("status") or {}
        return found

    def running(attempt: int) -> list[str] | None:
        pods = get("pods", "-l", f"meshrun.dev/job-name={JOB}")["items"]
        names = [
            p["metadata"]["name"]
            for p in pods
            if p["metadata"]["labels"].get("meshrun.dev/attempt") == str(attempt)
            and p.get("status", {}).get("phase") == "Running"
            and not p["metadata"].get("deletionTimestamp")
        ]
        return sorted(names) if len(names) == 2 else None

    def finish(pod: str, outcome: str, code: int) -> None:
        kubectl(
            "annotate", "pod", pod, "-n", ns, "--overwrite",
            f"sim.meshrun.dev/outcome={outcome}", f"sim.meshrun.dev/exit-code={code}",
        )  # fmt: skip

    kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(job_manifest()))
    # Creating pods and the headless Service, watching pods: create, list, watch.
    pods = wait_for(lambda: running(0), 60, "2 Running pods of attempt 0", describe=status)
    assert kubectl("get", "service", JOB, "-n", ns).returncode == 0

    # A retryable failure (137, killed) restarts the whole gang: delete, get, create again.
    finish(pods[1], "Failed", 137)
    wait_for(lambda: running(1), 60, "2 Running pods of attempt 1", describe=status)
    assert status()["restarts"] == 1

    # Both succeed: status written through the status subresource.
    for pod in pods:
        finish(pod, "Succeeded", 0)
    wait_for(lambda: status().get("phase") == "Succeeded", 60, "phase Succeeded", describe=status)

    def reasons() -> set[str]:
        events = get("events", "--field-selector", f"involvedObject.name={JOB}")["items"]
        return {e["reason"] for e in events}

    # Events created with the chart's token; the end's is posted after the status says it.
    wait_for(lambda: "Succeeded" in reasons(), 30, "a Succeeded Event", describe=reasons)

    # ttlSecondsAfterFinished: the operator deletes the job itself (delete on the CRD).
    wait_for(
        lambda: kubectl("get", "paralleltrainingjobs", JOB, "-n", ns, check=False).returncode,
        30,
        "the job deleted after its TTL",
        describe=status,
    )
    text = log.read_text()
    assert "Forbidden" not in text and "403" not in text, text[-3000:]


def test_namespaced_token_cannot_read_secrets_or_touch_other_namespaces(
    kubectl: Kubectl, release: Release, new_namespace: Callable[[str], str]
) -> None:
    jobs_ns, other_ns = new_namespace("jobs"), new_namespace("other")
    release.install({"watchNamespaces": [jobs_ns]})
    user = f"system:serviceaccount:{release.namespace}:{release.name}-meshrun"
    allowed = [
        ("list", "paralleltrainingjobs.meshrun.dev", jobs_ns),
        ("patch", "paralleltrainingjobs.meshrun.dev/status", jobs_ns),
        ("delete", "pods", jobs_ns),
        ("create", "services", jobs_ns),
        ("create", "events", jobs_ns),
        ("watch", "nodes", None),
        # Kueue (operator.kueue, the default): the job's Workload and what admits it.
        ("create", "workloads.kueue.x-k8s.io", jobs_ns),
        ("patch", "workloads.kueue.x-k8s.io/status", jobs_ns),
        ("get", "localqueues.kueue.x-k8s.io", jobs_ns),
        ("get", "resourceflavors.kueue.x-k8s.io", None),
    ]
    denied = [
        ("get", "secrets", jobs_ns),
        ("get", "secrets", release.namespace),
        ("list", "secrets", None),
        ("get", "configmaps", jobs_ns),
        ("update", "pods", jobs_ns),
        ("create", "pods/exec", jobs_ns),
        ("get", "pods/log", jobs_ns),
        ("update", "paralleltrainingjobs.meshrun.dev/status", jobs_ns),
        ("create", "pods", other_ns),
        ("delete", "pods", other_ns),
        ("list", "pods", other_ns),
        ("list", "paralleltrainingjobs.meshrun.dev", other_ns),
        ("create", "services", other_ns),
        ("create", "pods", release.namespace),
        ("delete", "namespaces", None),
        ("delete", "nodes", None),
        ("create", "customresourcedefinitions.apiextensions.k8s.io", None),
        ("delete", "workloads.kueue.x-k8s.io", jobs_ns),
        ("create", "workloads.kueue.x-k8s.io", other_ns),
        ("update", "clusterqueues.kueue.x-k8s.io", None),
        ("list", "localqueues.kueue.x-k8s.io", None),
    ]
    assert [a for a in allowed if not can_i(kubectl, user, *a)] == []
    assert [d for d in denied if can_i(kubectl, user, *d)] == []
