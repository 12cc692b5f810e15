"""Test namespaces carry the test run that made them, so a run killed before its teardown
leaves nothing that the next run does not remove."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path

TEST_RUN_LABEL = "meshrun.dev/test-run"
"""On each test's namespace: ``<host>.<pid>`` of the pytest process that made it."""


def run_label() -> str:
    """This pytest process as a label value: `<host>.<pid>`."""
    host = "".join(ch if ch.isalnum() or ch in "-." else "-" for ch in socket.gethostname())
    return f"{host[:40].strip('-.')}.{os.getpid()}"


def run_is_alive(label: str) -> bool:
    """Whether ``label`` names a pytest process of this host that still runs (an xdist worker
    beside this one, say); a label of another host or of no process is not alive."""
    owner_host, _, pid = label.rpartition(".")
    host = run_label().rsplit(".", 1)[0]
    return owner_host == host and pid.isdigit() and Path(f"/proc/{pid}").exists()


def delete_abandoned_namespaces(kubectl: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    """Delete the namespaces an earlier test run on this host left behind when it was killed
    before its teardown (their jobs would keep holding Kueue quota and nodes); a namespace of
    a run still alive is left alone."""
    found = kubectl("get", "namespaces", "-l", TEST_RUN_LABEL, "-o", "json", check=False)
    if found.returncode != 0:
        return
    host = run_label().rsplit(".", 1)[0]
    for item in json.loads(found.stdout)["items"]:
        owner_host = item["metadata"]["labels"][TEST_RUN_LABEL].rpartition(".")[0]
        if owner_host != host or run_is_alive(item["metadata"]["labels"][TEST_RUN_LABEL]):
            continue
        kubectl("delete", "namespace", item["metadata"]["name"], "--wait=false", check=False)
