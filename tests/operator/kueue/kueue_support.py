"""Helpers of the Kueue cluster tests: the shared queues, and Workloads read through kubectl."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from meshrun_operator import kueue

Kubectl = Callable[..., subprocess.CompletedProcess[str]]


@dataclass(frozen=True)
class KueueEnv:
    """The shared queues: one namespace (with its LocalQueue of the same name) per team."""

    namespaces: dict[str, str]
    """Team (LocalQueue name) -> namespace."""
    setup_seconds: float
    """How long hack/kueue/up.sh took this session (a cold build included)."""


def get_json(kubectl: Kubectl, *args: str) -> dict[str, Any]:
    return json.loads(kubectl("get", *args, "-o", "json").stdout)  # type: ignore[no-any-return]


def workload(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    return get_json(kubectl, kueue.WORKLOAD_PLURAL, name, "-n", namespace)
