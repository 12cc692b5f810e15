"""Which cluster and namespace a command talks to, resolved as kubectl resolves them.

The kubeconfig is ``--kubeconfig``, else the files of KUBECONFIG (several, separated as in PATH,
merged), else ~/.kube/config; its context is ``--context``, else its current-context; the
namespace is ``--namespace``, else the context's, else ``default``. With no kubeconfig at all in
a pod, the pod's service account (the in-cluster config) and its namespace. The kubernetes
package's own loader reads the files: certificates, tokens, exec plugins and OIDC alike.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes.client import ApiClient, Configuration
from kubernetes.config import ConfigException
from kubernetes.config.incluster_config import (
    SERVICE_HOST_ENV_NAME,
    SERVICE_PORT_ENV_NAME,
    load_incluster_config,
)
from kubernetes.config.kube_config import KubeConfigLoader, KubeConfigMerger

from meshrun.client.errors import NoCluster

DEFAULT_KUBECONFIG = "~/.kube/config"
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


@dataclass(frozen=True)
class Connection:
    """An API client for one cluster, and what a command says about it."""

    api: ApiClient
    namespace: str
    """The namespace commands act in unless told otherwise."""
    context: str | None
    """The kubeconfig context in use (None in a pod, on its service account)."""
    server: str
    """The API server's URL."""


def connect(
    *,
    kubeconfig: str | None = None,
    context: str | None = None,
    namespace: str | None = None,
) -> Connection:
    """The cluster and namespace as kubectl would pick them with the same flags. NoCluster says
    what is missing."""
    listed = kubeconfig or os.environ.get("KUBECONFIG") or DEFAULT_KUBECONFIG
    files = [Path(p).expanduser() for p in listed.split(os.pathsep) if p]
    if not any(f.is_file() for f in files):
        if kubeconfig is None and context is None and _in_a_pod():
            return _in_cluster(namespace)
        raise NoCluster(
            f"no kubeconfig at {listed}: point KUBECONFIG or --kubeconfig at your cluster's "
            "kubeconfig (kubectl config view shows the one kubectl uses)"
        )
    configuration = Configuration()
    try:
        merged = KubeConfigMerger(listed)  # type: ignore[no-untyped-call]
        if merged.config is None:
            raise ConfigException("no configuration found")
        # The merger keeps each file's entries as nodes that remember their file.
        names = sorted(str(c.value.get("name")) for c in merged.config.safe_get("contexts") or [])
        if context is not None and context not in names:
            raise NoCluster(
                f"no context {context!r} in {listed} (it has: {', '.join(names) or 'none'}; "
                "kubectl config get-contexts lists them)"
            )
        loader = KubeConfigLoader(  # type: ignore[no-untyped-call]
            config_dict=merged.config, config_base_path=None, active_context=context
        )
        loader.load_and_set(configuration)  # type: ignore[no-untyped-call]
        chosen: dict[str, Any] = loader.current_context
    except ConfigException as error:
        raise NoCluster(f"kubeconfig {listed}: {error}") from None
    # One try: a refused connection is said at once, without urllib3's retry warnings.
    configuration.retries = 0
    found = (chosen.get("context") or {}).get("namespace")
    return Connection(
        api=ApiClient(configuration),
        namespace=namespace or found or "default",
        context=str(chosen["name"]),
        server=str(configuration.host),
    )


def _in_a_pod() -> bool:
    return bool(os.environ.get(SERVICE_HOST_ENV_NAME) and os.environ.get(SERVICE_PORT_ENV_NAME))


def _in_cluster(namespace: str | None) -> Connection:
    configuration = Configuration()
    try:
        load_incluster_config(configuration)  # type: ignore[no-untyped-call]
    except ConfigException as error:
        raise NoCluster(f"in-cluster config: {error}") from None
    configuration.retries = 0
    if namespace is None:
        # client-go's in-cluster namespace: POD_NAMESPACE, else the service account's.
        namespace = os.environ.get("POD_NAMESPACE")
    if namespace is None:
        try:
            namespace = SERVICE_ACCOUNT_NAMESPACE.read_text(encoding="utf-8").strip() or None
        except OSError:
            namespace = None
    return Connection(
        api=ApiClient(configuration),
        namespace=namespace or "default",
        context=None,
        server=str(configuration.host),
    )
