"""helm install, upgrade and uninstall on the real API server, and what the RBAC allows.

The chart's Deployment lands on a fake KWOK node (simulated Running: there is no image), so
``--wait`` proves the objects are accepted and the rollout completes, not that the image runs;
test_chart_rbac.py runs the operator itself with the chart's ServiceAccount token.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from helm_support import Kubectl, Release, can_i

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

CRD = "paralleltrainingjobs.meshrun.dev"


def job(name: str) -> dict[str, object]:
    return {
        "apiVersion": "meshrun.dev/v1alpha1",
        "kind": "ParallelTrainingJob",
        "metadata": {"name": name},
        "spec": {
            "image": "meshrun/trainer:0.1.0",
            "resources": {"numNodes": 1, "numProcPerNode": 1},
            "strategy": {"type": "ddp"},
            "model": {"preset": "tiny"},
            "training": {"steps": 5, "globalBatchSize": 2, "microBatchSize": 1},
        },
    }


def exists(kubectl: Kubectl, *args: str) -> bool:
    return kubectl("get", *args, check=False).returncode == 0


def test_install_upgrade_uninstall_keeps_crd_and_jobs(
    kubectl: Kubectl, release: Release, new_namespace: Callable[[str], str]
) -> None:
    jobs_ns, other_ns = new_namespace("jobs"), new_namespace("other")
    user = f"system:serviceaccount:{release.namespace}:{release.name}-meshrun"
    fullname = f"{release.name}-meshrun"

    notes = release.install({"watchNamespaces": [jobs_ns]})
    assert f"rollout status deployment/{fullname}" in notes
    assert "image: meshrun/trainer:0.1.0" in notes and f"-n {jobs_ns} apply" in notes
    deploy = json.loads(
        kubectl("get", "deployment", fullname, "-n", release.namespace, "-o", "json").stdout
    )
    assert deploy["status"].get("readyReplicas") == 1
    assert exists(kubectl, "role", f"{fullname}-jobs", "-n", jobs_ns)

    # Namespaced mode: the job rules in the listed namespace only, never Secrets.
    assert can_i(kubectl, user, "create", "pods", jobs_ns)
    assert can_i(kubectl, user, "patch", "paralleltrainingjobs.meshrun.dev/status", jobs_ns)
    assert not can_i(kubectl, user, "create", "pods", other_ns)
    assert not can_i(kubectl, user, "list", "paralleltrainingjobs.meshrun.dev", other_ns)
    assert not can_i(kubectl, user, "get", "secrets", jobs_ns)
    assert not can_i(kubectl, user, "list", "secrets", None)

    kubectl("apply", "-n", jobs_ns, "-f", "-", input=json.dumps(job("kept")))

    # Upgrade to cluster-wide mode: the Role goes, the ClusterRole binds everywhere.
    release.upgrade({"watchNamespaces": []})
    history = json.loads(
        kubectl(
            "get", "secret", "-n", release.namespace, "-l", f"name={release.name}", "-o", "json"
        ).stdout
    )
    assert len(history["items"]) == 2, "helm keeps one release record per revision"
    assert not exists(kubectl, "role", f"{fullname}-jobs", "-n", jobs_ns)
    assert can_i(kubectl, user, "create", "pods", other_ns)
    assert can_i(kubectl, user, "delete", "pods", other_ns)
    assert not can_i(kubectl, user, "update", "pods", other_ns)
    assert not can_i(kubectl, user, "list", "secrets", None)
    assert not can_i(kubectl, user, "create", "configmaps", other_ns)

    # Uninstall removes the release's objects but, as Helm does for crds/, keeps the CRD, and
    # with it every job.
    release.uninstall()
    assert not exists(kubectl, "deployment", fullname, "-n", release.namespace)
    assert not exists(kubectl, "clusterrole", f"{fullname}-jobs")
    assert not exists(kubectl, "clusterrolebinding", f"{fullname}-cluster")
    assert not exists(kubectl, "serviceaccount", fullname, "-n", release.namespace)
    assert exists(kubectl, "crd", CRD)
    assert exists(kubectl, "paralleltrainingjobs", "kept", "-n", jobs_ns)
    assert not can_i(kubectl, user, "create", "pods", jobs_ns)
