"""Fixtures of the operator's cluster tests: a per-namespace operator process and helpers."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from operator_harness import Cluster, Kubectl, OperatorProcess, fake_node
from waiting import wait_for

from meshrun.api.crd import PLURAL


def release_jobs(kubectl: Kubectl, namespace: str) -> None:
    """Remove any finalizer from jobs left in ``namespace``.

    The operator puts none on jobs, but a finalizer left by anyone else would make the
    namespace deletion after the test wait forever once no operator runs.
    """
    out = kubectl("get", PLURAL, "-n", namespace, "-o", "json", check=False).stdout
    for item in json.loads(out or '{"items": []}').get("items", []):
        kubectl(
            "patch",
            PLURAL,
            item["metadata"]["name"],
            "-n",
            namespace,
            "--type=merge",
            "-p",
            '{"metadata": {"finalizers": null}}',
            check=False,
        )


@pytest.fixture
def cluster(kubectl: Kubectl, namespace: str, crds_installed: list[str]) -> Iterator[Cluster]:
    """kubectl helpers for the test's namespace (with the CRD installed)."""
    yield Cluster(kubectl, namespace)
    release_jobs(kubectl, namespace)


@pytest.fixture
def private_node(kubectl: Kubectl, cluster: Cluster) -> Iterator[str]:
    """A tainted KWOK node of this test alone, so breaking it disturbs nobody else."""
    name = f"test-node-{uuid.uuid4().hex[:8]}"
    cluster.apply(fake_node(name))
    ready = "jsonpath={.status.conditions[?(@.type=='Ready')].status}"
    wait_for(
        lambda: kubectl("get", "node", name, "-o", ready).stdout.strip() == "True",
        60,
        f"node {name} Ready",
    )
    yield name
    kubectl("delete", "node", name, "--wait=false", check=False)


@pytest.fixture
def operator_process(
    kubeconfig: str, kubectl: Kubectl, namespace: str, crds_installed: list[str], tmp_path: Path
) -> Iterator[OperatorProcess]:
    """The operator serving only the test's namespace; its log is printed when a test fails."""
    process = OperatorProcess(kubeconfig, namespace, tmp_path).start()
    yield process
    # Deleting the jobs while the operator still runs lets it release them the normal way.
    kubectl(
        "delete",
        PLURAL,
        "--all",
        "-n",
        namespace,
        "--wait=true",
        "--timeout=20s",
        check=False,
    )
    process.stop()
    print(f"--- operator log ({process.log_path}) ---\n{process.log_tail(80)}")
