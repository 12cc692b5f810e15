"""Session plumbing shared by every test.

Cluster tests (marker ``cluster``) talk to a real kube-apiserver: the local control plane that
``hack/cluster.sh up`` starts (reused when it is already running), or the user's own cluster
when MESHRUN_TEST_KUBECONFIG names a kubeconfig. Each test gets a fresh namespace.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import scheduling
from namespaces import TEST_RUN_LABEL, delete_abandoned_namespaces, run_label
from waiting import wait_established

ROOT = Path(__file__).resolve().parent.parent
CLUSTER_BIN = ROOT / ".cluster" / "bin"
LOCAL_KUBECONFIG = ROOT / ".cluster" / "kubeconfig"
CRD_DIR = ROOT / "crds"

Kubectl = Callable[..., subprocess.CompletedProcess[str]]


# The suite's tiers, its groups and order for xdist's workers, and its clock (tests/scheduling.py).
from scheduling import (  # noqa: E402, F401
    pytest_collection_modifyitems,
    pytest_configure,
    pytest_runtest_logreport,
    pytest_runtest_logstart,
    pytest_runtest_makereport,
    pytest_terminal_summary,
    pytest_xdist_make_scheduler,
)


def _kubectl_binary() -> str:
    local = CLUSTER_BIN / "kubectl"
    return str(local) if local.exists() else "kubectl"


def _run_kubectl(
    kubeconfig: str, *args: str, input: str | None = None, check: bool = True, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    cmd = [_kubectl_binary(), "--kubeconfig", kubeconfig, *args]
    proc = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"kubectl {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}{proc.stdout}"
        )
    return proc


@pytest.fixture(scope="session")
def kubeconfig() -> str:
    """Path of a kubeconfig for a real cluster: the user's, or the local one (started here)."""
    own = os.environ.get("MESHRUN_TEST_KUBECONFIG")
    if own:
        return own
    with scheduling.shared_setup("cluster"):
        status = subprocess.run(
            [str(ROOT / "hack" / "cluster.sh"), "status"], capture_output=True, text=True
        )
        if status.returncode != 0:
            up = subprocess.run(
                [str(ROOT / "hack" / "cluster.sh"), "up"],
                capture_output=True,
                text=True,
                timeout=900,
            )
            if up.returncode != 0:
                pytest.fail(f"could not start the local cluster:\n{up.stdout}\n{up.stderr}")
    return str(LOCAL_KUBECONFIG)


@pytest.fixture(scope="session")
def kubectl(kubeconfig: str) -> Kubectl:
    """``kubectl(*args, input=None, check=True)`` bound to the test cluster."""

    def run(
        *args: str, input: str | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        return _run_kubectl(kubeconfig, *args, input=input, check=check, timeout=timeout)

    delete_abandoned_namespaces(run)
    return run


@pytest.fixture(scope="session")
def api_client(kubeconfig: str) -> Iterator[Any]:
    """A kubernetes.client.ApiClient for the test cluster."""
    from kubernetes import client, config

    configuration = client.Configuration()
    config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    with client.ApiClient(configuration) as api:
        yield api


@pytest.fixture(scope="session")
def crds_installed(kubectl: Kubectl) -> list[str]:
    """Apply every CRD under crds/ and wait until the API server serves them."""
    names: list[str] = []
    for path in sorted(CRD_DIR.glob("*.yaml")):
        kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path))
        doc = kubectl("get", "-f", str(path), "-o", "json").stdout
        obj = json.loads(doc)
        items = obj.get("items", [obj])
        names += [item["metadata"]["name"] for item in items]
    for name in names:
        wait_established(kubectl, name)
    return names


REAL_NODE_LABEL = "meshrun.dev/real-node"
"""The label (and taint key) of the local cluster's real kubelet node (docs/real-node.md)."""


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


LOCAL_REAL_NODE = ROOT / ".cluster" / "realnode"
"""The state of the real node hack/realnode/up.sh runs on this machine."""
TRAINER_IMAGE = "meshrun/trainer:0.1.0"


def _realnode_images(*args: str) -> None:
    with scheduling.shared_setup("images"):
        proc = subprocess.run(
            [str(ROOT / "hack" / "realnode" / "images.sh"), *args],
            capture_output=True,
            text=True,
            timeout=2400,
        )
    if proc.returncode != 0:
        pytest.fail(
            f"hack/realnode/images.sh {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"
        )


@pytest.fixture(scope="session")
def trainer_image(real_node: str) -> str:
    """The trainer image of this checkout on the real node, built and imported once a session
    (Docker's cache makes it quick when nothing changed; an image another checkout left would
    run other code)."""
    _realnode_images("build", "trainer", TRAINER_IMAGE)
    return TRAINER_IMAGE


@pytest.fixture(scope="session")
def real_node(kubectl: Kubectl, kubeconfig: str) -> str:
    """Name of a Ready real node, added to the local cluster when there is none; the local real
    node's images (pause, base) imported again when its kubelet has collected them (under disk
    pressure it deletes every unused image, and nothing can be pulled here)."""
    with scheduling.shared_setup("real-node"):
        return _a_ready_real_node(kubectl)


def _a_ready_real_node(kubectl: Kubectl) -> str:
    ready = _ready_real_nodes(kubectl)
    if ready:
        if LOCAL_REAL_NODE.is_dir():
            _realnode_images("node")
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


@pytest.fixture
def namespace(kubectl: Kubectl, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace for one test, deleted (without waiting) afterwards."""
    base = request.node.name.lower().replace("_", "-")
    base = "".join(ch for ch in base if ch.isalnum() or ch == "-")[:40].strip("-")
    name = f"t-{base}-{uuid.uuid4().hex[:6]}"
    kubectl("create", "namespace", name)
    kubectl("label", "namespace", name, f"{TEST_RUN_LABEL}={run_label()}")
    # The service account controller must create "default" before pods can be admitted.
    from waiting import wait_for

    wait_for(
        lambda: (
            kubectl("get", "serviceaccount", "default", "-n", name, check=False).returncode == 0
        ),
        30,
        f"serviceaccount default in namespace {name}",
    )
    yield name
    kubectl("delete", "namespace", name, "--wait=false", check=False)
