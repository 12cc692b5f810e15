"""Fixtures of the chart tests: extra namespaces and Helm releases that clean up after them."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest
from helm_support import Kubectl, Release, helm
from waiting import wait_for


@pytest.fixture
def new_namespace(kubectl: Kubectl) -> Iterator[Callable[[str], str]]:
    """``new_namespace(prefix)`` creates a fresh namespace; all are deleted after the test."""
    made: list[str] = []

    def create(prefix: str) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:6]}"
        kubectl("create", "namespace", name)
        made.append(name)
        wait_for(
            lambda: kubectl("get", "sa", "default", "-n", name, check=False).returncode == 0,
            30,
            f"serviceaccount default in namespace {name}",
        )
        return name

    yield create
    for name in made:
        kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def release(kubeconfig: str, namespace: str, crds_installed: list[str]) -> Iterator[Release]:
    """A release named after a random suffix in the test's namespace, uninstalled afterwards.

    The suffix keeps its cluster-scoped objects (ClusterRoles) apart from other tests'.
    """
    rel = Release(kubeconfig, f"mr-{uuid.uuid4().hex[:6]}", namespace)
    yield rel
    if rel.installed:
        helm(
            "uninstall",
            rel.name,
            "--namespace",
            rel.namespace,
            kubeconfig=kubeconfig,
            check=False,
        )
