"""Fixtures of the operator's cluster tests: a per-namespace operator process and helpers."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from operator_harness import Cluster, Kubectl, OperatorProcess, chart_memory_limit, fake_node
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
    yield from _serve(OperatorProcess(kubeconfig, namespace, tmp_path), kubectl, namespace)


@pytest.fixture
def operator_at_chart_limit(
    kubeconfig: str, kubectl: Kubectl, namespace: str, crds_installed: list[str], tmp_path: Path
) -> Iterator[OperatorProcess]:
    """:func:`operator_process` in a memory cgroup of the chart's memory limit (values.yaml's
    resources.limits.memory), as the kubelet runs it: past the limit the kernel kills it."""
    limit = chart_memory_limit()
    process = OperatorProcess(kubeconfig, namespace, tmp_path, memory_limit=limit)
    yield from _serve(process, kubectl, namespace)


def _serve(process: OperatorProcess, kubectl: Kubectl, namespace: str) -> Iterator[OperatorProcess]:
    try:
        yield process.start()
    finally:
        _stop(process, kubectl, namespace)


def _stop(process: OperatorProcess, kubectl: Kubectl, namespace: str) -> None:
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
    if process.cgroup is not None:
        print(f"operator's peak memory {process.cgroup.peak() / 2**20:.0f} MiB")
        process.cgroup.remove()
