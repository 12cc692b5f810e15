"""Helpers for the chart tests: the helm binary, rendering, ServiceAccount kubeconfigs, can-i.

Helm and kubectl are the ones ``make tools`` builds into .cluster/bin (or the ones on PATH), the
same binaries the install docs tell users to run.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "meshrun"
KUBE_VERSION = "v1.34.4"
"""The local control plane's version: offline ``helm template`` needs it for kubeVersion."""

Kubectl = Callable[..., subprocess.CompletedProcess[str]]


def helm_binary() -> str:
    local = ROOT / ".cluster" / "bin" / "helm"
    if local.exists():
        return str(local)
    found = shutil.which("helm")
    if found is None:
        raise AssertionError("helm not found: run `make tools` (hack/build-tools.sh builds it)")
    return found


def helm(
    *args: str, kubeconfig: str | None = None, check: bool = True, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run helm; on failure (when ``check``) raise with its output."""
    cmd = [helm_binary(), *args]
    if kubeconfig is not None:
        cmd += ["--kubeconfig", kubeconfig]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
    return proc


def values_args(values: Mapping[str, Any]) -> list[str]:
    """``--set-json`` flags for ``values`` (one per top-level key, types kept exactly)."""
    return [arg for k, v in values.items() for arg in ("--set-json", f"{k}={json.dumps(v)}")]


def template(
    values: Mapping[str, Any] | None = None, namespace: str = "meshrun-system", check: bool = True
) -> subprocess.CompletedProcess[str]:
    """``helm template`` of the chart with ``values``; the raw result."""
    return helm(
        "template",
        "meshrun",
        str(CHART),
        "--namespace",
        namespace,
        "--kube-version",
        KUBE_VERSION,
        *values_args(values or {}),
        check=check,
    )


def render(
    values: Mapping[str, Any] | None = None, namespace: str = "meshrun-system"
) -> list[dict[str, Any]]:
    """The chart's objects (CRDs excluded, as ``helm template`` leaves them out)."""
    docs = yaml.safe_load_all(template(values, namespace).stdout)
    return [doc for doc in docs if doc]


def find(objects: list[dict[str, Any]], kind: str, name_suffix: str = "") -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind and o["metadata"]["name"].endswith(name_suffix)]


def token_kubeconfig(kubectl: Kubectl, namespace: str, account: str, path: Path) -> Path:
    """A kubeconfig that authenticates as ServiceAccount ``namespace/account`` with a token.

    Server and CA come from the test cluster's kubeconfig; the token from the TokenRequest API
    (``kubectl create token``), as a pod of that ServiceAccount would get it.
    """
    token = kubectl("create", "token", account, "-n", namespace, "--duration", "1h").stdout
    view = json.loads(kubectl("config", "view", "--minify", "--raw", "-o", "json").stdout)
    cluster = dict(view["clusters"][0]["cluster"])
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "test", "cluster": cluster}],
        "users": [{"name": account, "user": {"token": token.strip()}}],
        "contexts": [{"name": account, "context": {"cluster": "test", "user": account}}],
        "current-context": account,
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


def can_i(kubectl: Kubectl, user: str, verb: str, resource: str, namespace: str | None) -> bool:
    """A SubjectAccessReview for ``user``; ``namespace`` None asks across all namespaces.

    ``resource`` is ``plural[.group][/subresource]`` ("pods/exec",
    "workloads.kueue.x-k8s.io"). The review goes to the API server as is: unlike
    ``kubectl auth can-i`` it needs no discovery, so a group whose CRDs are not installed here
    (Kueue's) is judged by the RBAC rules alone, as it would be once they are.
    """
    kind, _, sub = resource.partition("/")
    plural, _, group = kind.partition(".")
    attributes: dict[str, str] = {"verb": verb, "resource": plural, "group": group}
    if sub:
        attributes["subresource"] = sub
    if namespace:
        attributes["namespace"] = namespace
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {"user": user, "resourceAttributes": attributes},
    }
    groups = ["system:authenticated"]  # as impersonation (--as) would add
    if user.startswith("system:serviceaccount:"):
        namespace_of_account = user.split(":")[2]
        groups += ["system:serviceaccounts", f"system:serviceaccounts:{namespace_of_account}"]
    review["spec"]["groups"] = groups  # type: ignore[index]
    proc = kubectl("create", "-o", "json", "-f", "-", input=json.dumps(review))
    return bool(json.loads(proc.stdout)["status"].get("allowed"))


class Release:
    """One Helm release of the chart; ``install``/``upgrade`` take values as a dict."""

    def __init__(self, kubeconfig: str, name: str, namespace: str) -> None:
        self.kubeconfig, self.name, self.namespace = kubeconfig, name, namespace
        self.installed = False

    def _run(self, verb: str, values: dict[str, object]) -> str:
        proc = helm(
            verb,
            self.name,
            str(CHART),
            "--namespace",
            self.namespace,
            "--wait",
            "--timeout",
            "90s",
            *values_args(values),
            kubeconfig=self.kubeconfig,
        )
        self.installed = True
        return proc.stdout

    def install(self, values: dict[str, object]) -> str:
        return self._run("install", values)

    def upgrade(self, values: dict[str, object]) -> str:
        return self._run("upgrade", values)

    def uninstall(self) -> str:
        proc = helm(
            "uninstall",
            self.name,
            "--namespace",
            self.namespace,
            "--wait",
            kubeconfig=self.kubeconfig,
        )
        self.installed = False
        return proc.stdout
