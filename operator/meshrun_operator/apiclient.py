"""The kubernetes client as the operator uses it: its configuration, how long a request may take,
what counts as no answer, and the refusal to write while another operator leads."""

from __future__ import annotations

import os
from dataclasses import dataclass

from kubernetes import client, config
from urllib3.exceptions import HTTPError

NO_ANSWER = (HTTPError, OSError)
"""What a request raises when the API server did not answer (a timeout, a refused or dropped
connection), as opposed to an ApiException, which is its answer."""

WRITES = frozenset({"create", "delete", "patch", "update"})
"""Verbs that change the cluster: sent only while this operator leads (leader.py)."""


@dataclass(frozen=True)
class ApiTimeout:
    """How long one API request may take (the kubernetes client's ``_request_timeout``)."""

    connect: float = 10.0
    """Seconds to open a connection (TCP and TLS)."""
    read: float = 30.0
    """Seconds to wait for the answer (between two reads of it)."""

    @classmethod
    def of(cls, seconds: float) -> ApiTimeout:
        """``seconds`` to read, and at most 10 s of it to connect."""
        return cls(connect=min(10.0, seconds), read=seconds)

    @property
    def request(self) -> tuple[float, float]:
        """As the client's ``_request_timeout`` argument."""
        return (self.connect, self.read)


class NotLeader(Exception):
    """A write was not sent: another operator holds the lease (or this one lost it)."""


def load_api_client(workers: int) -> client.ApiClient:
    """In-cluster config when running in a pod, else KUBECONFIG / ~/.kube/config."""
    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    except config.ConfigException:
        # KUBECONFIG as it is now: the client's own default was read when it was imported.
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=os.environ.get("KUBECONFIG") or None, client_configuration=configuration
        )
    # One HTTP connection per worker thread, or urllib3 discards the surplus connections.
    configuration.connection_pool_maxsize = workers
    return client.ApiClient(configuration)


SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def own_namespace() -> str | None:
    """The namespace this operator runs in: POD_NAMESPACE (the chart sets it from the downward
    API), else its service account's, else None (it runs outside the cluster)."""
    found = os.environ.get("POD_NAMESPACE")
    if found:
        return found
    try:
        with open(SERVICE_ACCOUNT_NAMESPACE, encoding="utf-8") as file:
            return file.read().strip() or None
    except OSError:
        return None
