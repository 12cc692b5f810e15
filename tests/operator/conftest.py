"""Fixtures of the operator's cluster tests: a per-namespace operator process and helpers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from operator_harness import Cluster, Kubectl, OperatorProcess


@pytest.fixture
def cluster(kubectl: Kubectl, namespace: str, crds_installed: list[str]) -> Cluster:
    """kubectl helpers for the test's namespace (with the CRD installed)."""
    return Cluster(kubectl, namespace)


@pytest.fixture
def operator_process(
    kubeconfig: str, namespace: str, crds_installed: list[str], tmp_path: Path
) -> Iterator[OperatorProcess]:
    """The operator serving only the test's namespace; its log is printed when a test fails."""
    process = OperatorProcess(kubeconfig, namespace, tmp_path).start()
    yield process
    process.stop()
    print(f"--- operator log ({process.log_path}) ---\n{process.log_tail(80)}")
