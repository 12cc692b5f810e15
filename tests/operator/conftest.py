"""Fixtures of the operator's cluster tests: a per-namespace operator process and helpers."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from meshrun_operator import names
from operator_harness import Cluster, Kubectl, OperatorProcess


def release_jobs(kubectl: Kubectl, namespace: str) -> None:
    """Remove any finalizer from jobs left in ``namespace``.

    The operator puts none on jobs, but a finalizer left by anyone else would make the
    namespace deletion after the test wait forever once no operator runs.
    """
    out = kubectl("get", names.PLURAL, "-n", namespace, "-o", "json", check=False).stdout
    for item in json.loads(out or '{"items": []}').get("items", []):
        kubectl(
            "patch",
            names.PLURAL,
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
def operator_process(
    kubeconfig: str, kubectl: Kubectl, namespace: str, crds_installed: list[str], tmp_path: Path
) -> Iterator[OperatorProcess]:
    """The operator serving only the test's namespace; its log is printed when a test fails."""
    process = OperatorProcess(kubeconfig, namespace, tmp_path).start()
    yield process
    # Deleting the jobs while the operator still runs lets it release them the normal way.
    kubectl(
        "delete",
        names.PLURAL,
        "--all",
        "-n",
        namespace,
        "--wait=true",
        "--timeout=20s",
        check=False,
    )
    process.stop()
    print(f"--- operator log ({process.log_path}) ---\n{process.log_tail(80)}")
