"""The local control plane is the real thing: pinned version, schema validation by the API
server, kube-scheduler binding by GPU count, KWOK pod lifecycles, garbage collection."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from namespaces import TEST_RUN_LABEL, delete_abandoned_namespaces, run_label
from waiting import wait_established, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[1]


def pinned_kube_version() -> str:
    text = (ROOT / "hack" / "versions.env").read_text()
    match = re.search(r"^KUBE_VERSION=(\S+)$", text, re.M)
    assert match, "hack/versions.env has no KUBE_VERSION"
    return match.group(1)


def get_json(kubectl: Any, *args: str) -> dict[str, Any]:
    return json.loads(kubectl("get", *args, "-o", "json").stdout)  # type: ignore[no-any-return]


def pod_manifest(
    name: str,
    gpus: int,
    annotations: dict[str, str] | None = None,
    owner: dict[str, Any] | None = None,
) -> str:
    meta: dict[str, Any] = {"name": name, "annotations": annotations or {}}
    if owner:
        meta["ownerReferences"] = [owner]
    resources = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": meta,
            "spec": {
                "containers": [
                    {"name": "main", "image": "meshrun/trainer:dev", "resources": resources}
                ],
                "restartPolicy": "Never",
            },
        }
    )


def test_server_reports_the_pinned_version(kubectl: Any) -> None:
    version = json.loads(kubectl("version", "-o", "json").stdout)
    assert version["serverVersion"]["gitVersion"] == pinned_kube_version()
    assert version["clientVersion"]["gitVersion"] == pinned_kube_version()


def test_fake_gpu_nodes_carry_gpus_and_topology(kubectl: Any) -> None:
    nodes = get_json(kubectl, "nodes", "-l", "type=kwok")["items"]
    assert len(nodes) >= 1
    for node in nodes:
        labels = node["metadata"]["labels"]
        assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
        assert node["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"
        for key in (
            "topology.kubernetes.io/zone",
            "topology.meshrun.dev/rack",
            "topology.meshrun.dev/nvlink-domain",
            "node.kubernetes.io/instance-type",
        ):
            assert labels.get(key), f"node {node['metadata']['name']} lacks label {key}"
        assert not node["spec"].get("taints")
        ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
        assert ready and ready[0]["status"] == "True"


CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.envtest.meshrun.dev"},
    "spec": {
        "group": "envtest.meshrun.dev",
        "scope": "Namespaced",
        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "required": ["size"],
                                "properties": {"size": {"type": "integer", "minimum": 1}},
                            }
                        },
                    }
                },
            }
        ],
    },
}


def test_crd_schema_rejects_invalid_object(kubectl: Any, namespace: str) -> None:
    kubectl("apply", "--server-side", "-f", "-", input=json.dumps(CRD))
    wait_established(kubectl, "widgets.envtest.meshrun.dev")
    bad = {
        "apiVersion": "envtest.meshrun.dev/v1",
        "kind": "Widget",
        "metadata": {"name": "w", "namespace": namespace},
        "spec": {"size": 0},
    }
    rejected = kubectl("create", "-f", "-", input=json.dumps(bad), check=False)
    assert rejected.returncode != 0
    assert "spec.size: Invalid value: 0" in rejected.stderr
    assert "greater than or equal to 1" in rejected.stderr
    good = dict(bad, spec={"size": 3})
    kubectl("create", "-f", "-", input=json.dumps(good))
    assert get_json(kubectl, "widget", "w", "-n", namespace)["spec"]["size"] == 3


def test_scheduler_binds_8_gpus_and_leaves_9_pending(kubectl: Any, namespace: str) -> None:
    kubectl("create", "-n", namespace, "-f", "-", input=pod_manifest("eight", 8))
    kubectl("create", "-n", namespace, "-f", "-", input=pod_manifest("nine", 9))

    def running_on_gpu_node() -> str | None:
        pod = get_json(kubectl, "pod", "eight", "-n", namespace)
        node = pod["spec"].get("nodeName")
        return node if node and pod["status"].get("phase") == "Running" else None

    node = wait_for(running_on_gpu_node, 60, "pod 'eight' bound to a node and Running")
    labels = get_json(kubectl, "node", node)["metadata"]["labels"]
    assert labels["type"] == "kwok"

    def failed_scheduling() -> list[dict[str, Any]]:
        events = get_json(
            kubectl, "events", "-n", namespace, "--field-selector", "involvedObject.name=nine"
        )["items"]
        return [e for e in events if e["reason"] == "FailedScheduling"]

    events = wait_for(failed_scheduling, 60, "a FailedScheduling event for pod 'nine'")
    assert "Insufficient nvidia.com/gpu" in events[0]["message"]
    nine = get_json(kubectl, "pod", "nine", "-n", namespace)
    assert nine["status"]["phase"] == "Pending" and not nine["spec"].get("nodeName")


def terminated_state(pod: dict[str, Any]) -> dict[str, Any] | None:
    statuses = pod["status"].get("containerStatuses") or []
    return statuses[0]["state"].get("terminated") if statuses else None


def test_pod_annotated_to_fail_ends_with_that_exit_code(kubectl: Any, namespace: str) -> None:
    annotations = {
        "sim.meshrun.dev/outcome": "Failed",
        "sim.meshrun.dev/exit-code": "137",
        "sim.meshrun.dev/reason": "OOMKilled",
    }
    kubectl("create", "-n", namespace, "-f", "-", input=pod_manifest("doomed", 1, annotations))

    def failed() -> dict[str, Any] | None:
        pod = get_json(kubectl, "pod", "doomed", "-n", namespace)
        return pod if pod["status"].get("phase") == "Failed" else None

    pod = wait_for(failed, 60, "pod 'doomed' to end Failed")
    state = terminated_state(pod)
    assert state is not None
    assert state["exitCode"] == 137
    assert state["reason"] == "OOMKilled"


def test_pod_runs_then_succeeds_after_delay_with_message(kubectl: Any, namespace: str) -> None:
    kubectl("create", "-n", namespace, "-f", "-", input=pod_manifest("worker", 0))
    wait_for(
        lambda: (
            get_json(kubectl, "pod", "worker", "-n", namespace)["status"].get("phase") == "Running"
        ),
        60,
        "pod 'worker' Running",
    )
    summary = json.dumps({"finalLoss": 1.25})
    annotated = time.monotonic()
    kubectl(
        "annotate",
        "-n",
        namespace,
        "pod",
        "worker",
        "sim.meshrun.dev/outcome=Succeeded",
        "sim.meshrun.dev/after=2s",
        f"sim.meshrun.dev/message={summary}",
    )
    # The 2 s delay is honoured: the pod runs on until 2 s after the annotation (timed from
    # before it, so a loaded machine's slow kubectl calls cannot make the check fail).
    phase = get_json(kubectl, "pod", "worker", "-n", namespace)["status"]["phase"]
    assert phase == "Running" or time.monotonic() - annotated >= 2, phase
    wait_for(
        lambda: (
            get_json(kubectl, "pod", "worker", "-n", namespace)["status"]["phase"] == "Succeeded"
        ),
        60,
        "pod 'worker' Succeeded",
        interval=0.2,
    )
    assert time.monotonic() - annotated >= 2
    state = terminated_state(get_json(kubectl, "pod", "worker", "-n", namespace))
    assert state is not None and state["exitCode"] == 0
    assert json.loads(state["message"]) == {"finalLoss": 1.25}


def test_deleting_the_owner_garbage_collects_children(kubectl: Any, namespace: str) -> None:
    kubectl("create", "configmap", "owner", "-n", namespace)
    uid = get_json(kubectl, "configmap", "owner", "-n", namespace)["metadata"]["uid"]
    owner = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": uid}
    kubectl("create", "-n", namespace, "-f", "-", input=pod_manifest("child", 0, owner=owner))
    wait_for(
        lambda: (
            get_json(kubectl, "pod", "child", "-n", namespace)["status"].get("phase") == "Running"
        ),
        60,
        "pod 'child' Running",
    )
    kubectl("delete", "configmap", "owner", "-n", namespace)
    wait_for(
        lambda: kubectl("get", "pod", "child", "-n", namespace, check=False).returncode != 0,
        60,
        "the garbage collector to delete pod 'child' after its owner went away",
    )


def test_node_marked_down_turns_not_ready_and_recovers(kubectl: Any) -> None:
    # A dedicated node, so other tests' pods never land on a node that this test takes down.
    node_json = subprocess.run(
        [sys.executable, str(ROOT / "hack" / "kwok" / "nodes.py"), "1"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    node = json.loads(node_json)["items"][0]
    node["metadata"]["name"] = name = f"flaky-{uuid.uuid4().hex[:6]}"
    node["metadata"]["labels"]["kubernetes.io/hostname"] = name
    node["spec"]["taints"] = [{"key": "meshrun.dev/test-only", "effect": "NoSchedule"}]
    kubectl("create", "-f", "-", input=json.dumps(node))
    try:

        def ready() -> str:
            conditions = get_json(kubectl, "node", name)["status"].get("conditions") or []
            return next((c["status"] for c in conditions if c["type"] == "Ready"), "Unknown")

        wait_for(lambda: ready() == "True", 30, f"node {name} Ready")
        kubectl("annotate", "node", name, "sim.meshrun.dev/node-down=true")
        wait_for(lambda: ready() == "False", 30, f"node {name} NotReady after node-down")
        kubectl("annotate", "node", name, "sim.meshrun.dev/node-down-")
        wait_for(lambda: ready() == "True", 30, f"node {name} Ready again")
    finally:
        kubectl("delete", "node", name, "--wait=false", check=False)


def _phase(kubectl: Any, namespace: str) -> str:
    """The namespace's phase, "gone" for one deleted or being deleted."""
    found = kubectl("get", "namespace", namespace, "-o", "json", check=False)
    if found.returncode != 0:
        assert "NotFound" in found.stderr, found.stderr
        return "gone"
    phase: str = json.loads(found.stdout)["status"]["phase"]
    return "gone" if phase == "Terminating" else phase


def test_namespaces_of_a_killed_test_run_are_deleted_and_a_live_runs_kept(kubectl: Any) -> None:
    host = run_label().rsplit(".", 1)[0]
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    names = {
        f"t-abandoned-{uuid.uuid4().hex[:6]}": f"{host}.{dead}",
        f"t-alive-{uuid.uuid4().hex[:6]}": run_label(),
        f"t-elsewhere-{uuid.uuid4().hex[:6]}": f"another-host.{dead}",
    }
    for name, run in names.items():
        kubectl("create", "namespace", name)
        kubectl("label", "namespace", name, f"{TEST_RUN_LABEL}={run}")
    try:
        delete_abandoned_namespaces(kubectl)
        phases = {name: _phase(kubectl, name) for name in names}
        abandoned, alive, elsewhere = phases.values()
        assert (abandoned, alive, elsewhere) == ("gone", "Active", "Active"), phases
    finally:
        for name in names:
            kubectl("delete", "namespace", name, "--wait=false", check=False)
