"""The operator scale bench's throwaway cluster: hack/cluster.sh with the audit log on.

The cluster gets its own folder and name (MESHRUN_CLUSTER_DIR / MESHRUN_CLUSTER_NAME), so the
test cluster is left alone, and an audit policy (hack/peer/audit-policy.yaml) so that the API
server itself counts every request. Each operator talks to it as its own user (a client
certificate signed by the cluster's CA, group system:masters), which is how the audit log tells
one operator's requests from the bench's and the control plane's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

ROOT = Path(__file__).resolve().parent.parent
BIN = ROOT / ".cluster" / "bin"
KUBECTL = BIN / "kubectl"
CLUSTER_SH = ROOT / "hack" / "cluster.sh"
CERTS_SH = ROOT / "hack" / "peer" / "certs.sh"
AUDIT_POLICY = ROOT / "hack" / "peer" / "audit-policy.yaml"
NAME = "meshrun-opbench"


@dataclass
class Cluster:
    """A running throwaway cluster with its audit log."""

    state: Path
    """Its folder (MESHRUN_CLUSTER_DIR)."""
    keep: bool
    """Leave it running after the bench (a folder given with --cluster-dir)."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment for hack/cluster.sh."""

    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig: the bench's own requests, which are not counted."""
        return self.state / "kubeconfig"

    @property
    def workdir(self) -> Path:
        return self.state / "kwok" / "clusters" / NAME

    @property
    def audit_log(self) -> Path:
        return self.workdir / "logs" / "audit.log"

    def kubectl(self, *args: str, stdin: str | None = None) -> str:
        return subprocess.run(
            [str(KUBECTL), "--kubeconfig", str(self.kubeconfig), *args],
            input=stdin,
            capture_output=True,
            text=True,
            check=True,
        ).stdout

    def api(self, connections: int = 16) -> client.ApiClient:
        """An API client for the bench (the admin user), ``connections`` requests at a time."""
        configuration = client.Configuration()
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=str(self.kubeconfig), client_configuration=configuration
        )
        configuration.connection_pool_maxsize = connections
        return client.ApiClient(configuration)

    def user_kubeconfig(self, user: str) -> Path:
        """A kubeconfig that authenticates as ``user`` (cluster admin rights)."""
        certs = self.state / "users"
        subprocess.run(
            [str(CERTS_SH), "client", str(certs), user, str(self.workdir / "pki")],
            check=True,
            capture_output=True,
        )
        kubeconfig = yaml.safe_load(self.kubeconfig.read_text())
        kubeconfig["users"] = [
            {
                "name": user,
                "user": {
                    "client-certificate": str(certs / f"{user}.crt"),
                    "client-key": str(certs / f"{user}.key"),
                },
            }
        ]
        for context in kubeconfig["contexts"]:
            context["context"]["user"] = user
        path = certs / f"{user}.kubeconfig"
        path.write_text(yaml.safe_dump(kubeconfig))
        return path

    def down(self) -> None:
        if self.keep:
            print(
                f"cluster left running in {self.state} (stop it with MESHRUN_CLUSTER_DIR="
                f"{self.state} MESHRUN_CLUSTER_NAME={NAME} hack/cluster.sh down)"
            )
            return
        subprocess.run([str(CLUSTER_SH), "down"], env=self.env, capture_output=True, check=False)
        shutil.rmtree(self.state, ignore_errors=True)


def start_cluster(nodes: int, folder: str | None) -> Cluster:
    """Start (or, with ``folder`` holding a running one, reuse) the throwaway cluster."""
    state = Path(folder).resolve() if folder else Path(tempfile.mkdtemp(prefix="meshrun-opbench-"))
    state.mkdir(parents=True, exist_ok=True)
    env = dict(
        os.environ,
        MESHRUN_CLUSTER_DIR=str(state),
        MESHRUN_CLUSTER_NAME=NAME,
        NODES=str(nodes),
        REAL_NODE="0",
        AUDIT_POLICY=str(AUDIT_POLICY),
    )
    cluster = Cluster(state=state, keep=folder is not None, env=env)
    started = time.monotonic()
    try:
        subprocess.run([str(CLUSTER_SH), "up"], env=env, check=True, capture_output=True, text=True)
    except subprocess.CalledProcessError as error:
        cluster.down()
        raise SystemExit(f"hack/cluster.sh up failed:\n{error.stdout}\n{error.stderr}") from error
    if not cluster.audit_log.exists():
        cluster.down()
        raise SystemExit(
            f"{state} holds a cluster without an audit log: remove it (hack/cluster.sh down with "
            f"MESHRUN_CLUSTER_DIR={state} MESHRUN_CLUSTER_NAME={NAME}) or pick another folder"
        )
    print(f"throwaway cluster, {nodes} fake GPU nodes: Ready in {time.monotonic() - started:.0f} s")
    return cluster


def create_namespace(api: client.ApiClient, name: str) -> None:
    """Create a namespace and wait for its default service account (pods need it)."""
    core = client.CoreV1Api(api)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            core.read_namespaced_service_account("default", name)
            return
        except ApiException as error:
            if error.status != 404:
                raise
        time.sleep(0.1)
    raise TimeoutError(f"namespace {name}: no default service account after 60 s")


def delete_namespace(api: client.ApiClient, name: str, timeout: float = 300) -> float:
    """Delete a namespace and wait until it is gone; the seconds it took."""
    core = client.CoreV1Api(api)
    started = time.monotonic()
    core.delete_namespace(name)
    while time.monotonic() - started < timeout:
        try:
            core.read_namespace(name)
        except ApiException as error:
            if error.status == 404:
                return time.monotonic() - started
            raise
        time.sleep(0.5)
    raise TimeoutError(f"namespace {name} still exists {timeout:.0f} s after its deletion")


def apply(cluster: Cluster, obj: dict[str, Any]) -> None:
    """Server-side apply of one object (the bench is its field manager)."""
    cluster.kubectl(
        "apply",
        "--server-side",
        "--force-conflicts",
        "--field-manager=bench",
        "-f",
        "-",
        stdin=json.dumps(obj),
    )
