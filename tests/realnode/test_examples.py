"""Every file in examples/ as a real job on the real node: the chart's operator, running in the
cluster as a pod, trains each example shrunk to CPU (hack/e2e_kind_jobs.py, the jobs `make
e2e-kind` runs) to phase Succeeded, and each final loss equals `meshrun run --local` of the same
shrunk job: the same layout, seed and data on the same CPU kernels.

One chart install and one image build serve every example; the local reference of a job trains
while the cluster trains it, or comes from the cache of references (tests/references.py)."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_support import TRAINER_IMAGE, build_images, helm_install
from kind_jobs import shrinker
from namespaces import TEST_RUN_LABEL, run_label
from realnode_support import REAL_NODE_LABEL, ROOT, Kubectl
from references import LocalReference
from waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(3600)]

EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
NAMES = [yaml.safe_load(p.read_text())["metadata"]["name"] for p in EXAMPLES]
JOB_TIMEOUT = 900
TOLERATION = {"key": REAL_NODE_LABEL, "operator": "Equal", "value": "true", "effect": "NoSchedule"}


def on_real_node(job: dict[str, Any], namespace: str) -> dict[str, Any]:
    job["metadata"]["namespace"] = namespace
    job["spec"]["podTemplate"] = {
        "spec": {
            "nodeSelector": {REAL_NODE_LABEL: "true"},
            "tolerations": [TOLERATION],
        }
    }
    return job


@pytest.fixture(scope="module")
def jobs() -> dict[str, dict[str, Any]]:
    shrunk = shrinker().shrink_files(EXAMPLES, TRAINER_IMAGE)
    by_name = {job["metadata"]["name"]: job for job in shrunk}
    assert len(by_name) == len(EXAMPLES), "every example is one job with its own name"
    return by_name


@pytest.fixture(scope="module")
def installed(real_node: str, kubectl: Kubectl, kubeconfig: str) -> Iterator[str]:
    """Images built and imported (once), the chart serving a namespace of this module's."""
    build_images()
    namespace = f"t-examples-{uuid.uuid4().hex[:6]}"
    kubectl("create", "namespace", namespace)
    # A run killed before its teardown leaves this namespace to the next run (tests/namespaces.py).
    kubectl("label", "namespace", namespace, f"{TEST_RUN_LABEL}={run_label()}")
    wait_for(
        lambda: kubectl("get", "sa", "default", "-n", namespace, check=False).returncode == 0,
        60,
        "the default service account",
    )
    uninstall = helm_install(kubeconfig, namespace)
    yield namespace
    subprocess.run(uninstall, capture_output=True, timeout=120)
    kubectl("delete", "namespace", namespace, "--wait=false", check=False)


@pytest.fixture
def local_run() -> Iterator[list[LocalReference]]:
    """The local reference run of a test, stopped if the test ends first."""
    runs: list[LocalReference] = []
    yield runs
    for run in runs:
        run.stop()


def job_status(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    out = kubectl("get", "paralleltrainingjob", name, "-n", namespace, "-o", "json").stdout
    status: dict[str, Any] = json.loads(out).get("status") or {}
    return status


@pytest.mark.parametrize("name", NAMES)
def test_example_trains_on_the_real_node_with_the_local_final_loss(
    name: str,
    jobs: dict[str, dict[str, Any]],
    installed: str,
    local_run: list[LocalReference],
    tmp_path: Path,
    kubectl: Kubectl,
    real_node: str,
) -> None:
    namespace = installed
    # The local reference trains while the cluster trains the same job (or comes from the cache
    # of references, tests/references.py).
    job_file = tmp_path / "local" / "job.yaml"
    job_file.parent.mkdir()
    job_file.write_text(yaml.safe_dump(jobs[name]))
    local = LocalReference(job_file)
    local_run.append(local)
    job = on_real_node(jobs[name], namespace)
    kubectl("apply", "-f", "-", input=json.dumps(job))

    def ended() -> dict[str, Any] | None:
        status = job_status(kubectl, namespace, name)
        return status if status.get("phase") in ("Succeeded", "Failed") else None

    status = wait_for(
        ended,
        JOB_TIMEOUT,
        f"job {name} to end",
        interval=2,
        describe=lambda: (
            job_status(kubectl, namespace, name),
            kubectl("get", "pods", "-n", namespace, "-o", "wide", check=False).stdout,
        ),
    )
    pods = json.loads(
        kubectl(
            "get", "pods", "-n", namespace, "-l", f"meshrun.dev/job-name={name}", "-o", "json"
        ).stdout
    )["items"]
    assert status["phase"] == "Succeeded", status
    assert pods and {p["spec"]["nodeName"] for p in pods} == {real_node}
    assert len(pods) == job["spec"]["resources"]["numNodes"]

    reference = local.summary()
    progress = status["progress"]
    assert progress["step"] == progress["totalSteps"] == reference["steps"]
    assert status["plan"]["worldSize"] == reference["worldSize"]
    for degree in ("dp", "cp", "pp", "tp"):
        assert status["plan"][degree] == reference["layout"][degree], degree
    assert progress["loss"] == pytest.approx(reference["finalLoss"], rel=1e-6, abs=1e-6)
    kubectl("delete", "paralleltrainingjob", name, "-n", namespace, "--wait=true")
