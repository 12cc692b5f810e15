"""Failure classification, and the views of observed pods and nodes."""

from __future__ import annotations

import json
from typing import Any

import pytest
from meshrun_operator import names
from meshrun_operator.lifecycle.failures import FailureClass, classify
from meshrun_operator.seen.views import node_ready, parse_progress, pod_view

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("exit_code", "container_reason", "pod_reason", "kind", "reason"),
    [
        (137, "OOMKilled", None, FailureClass.RETRYABLE, "OOMKilled"),
        (137, None, None, FailureClass.RETRYABLE, "Killed"),
        (143, None, None, FailureClass.RETRYABLE, "Terminated"),
        (None, None, "Evicted", FailureClass.IGNORED, "Evicted"),
        (2, "Error", "Evicted", FailureClass.IGNORED, "Evicted"),
        (137, None, "Preempted", FailureClass.IGNORED, "Preempted"),
        (None, None, "Shutdown", FailureClass.RETRYABLE, "Shutdown"),
        (1, "Error", None, FailureClass.RETRYABLE, "Error"),
        (139, None, None, FailureClass.RETRYABLE, "Segfault"),
        (150, None, None, FailureClass.RETRYABLE, "Signal"),
        (2, "Error", None, FailureClass.PERMANENT, "ConfigError"),
        (126, None, None, FailureClass.PERMANENT, "CommandNotExecutable"),
        (127, None, None, FailureClass.PERMANENT, "CommandNotFound"),
        (42, "Error", None, FailureClass.PERMANENT, "ExitCode"),
        (128, "StartError", None, FailureClass.PERMANENT, "StartError"),
    ],
)
def test_failure_table(
    exit_code: int | None,
    container_reason: str | None,
    pod_reason: str | None,
    kind: FailureClass,
    reason: str,
) -> None:
    failure = classify(exit_code, container_reason, pod_reason)
    assert (failure.kind, failure.reason) == (kind, reason)
    assert failure.message


def pod_body(**status: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "job-3",
            "labels": {names.LABEL_POD_INDEX: "3", names.LABEL_ATTEMPT: "2"},
            "annotations": {
                names.ANNOTATION_PROGRESS: json.dumps({"step": 5, "loss": 1.5, "junk": 1})
            },
        },
        "spec": {"nodeName": "kwok-node-1"},
        "status": status,
    }


def test_pod_view_reads_exit_code_reason_and_progress() -> None:
    view = pod_view(
        pod_body(
            phase="Failed",
            podIP="10.0.0.5",
            containerStatuses=[
                {"name": "sidecar", "state": {"running": {}}},
                {
                    "name": "trainer",
                    "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}},
                },
            ],
        )
    )
    assert (view.name, view.index, view.attempt, view.node) == ("job-3", 3, 2, "kwok-node-1")
    assert (view.phase, view.exit_code, view.container_reason) == ("Failed", 137, "OOMKilled")
    assert view.progress == {"step": 5, "loss": 1.5}
    assert view.pod_ip == "10.0.0.5" and not view.deleting


def test_pod_view_of_a_fresh_pod() -> None:
    view = pod_view({"metadata": {"name": "p", "deletionTimestamp": "2026-01-01T00:00:00Z"}})
    assert view.phase == "Pending" and view.node is None and view.exit_code is None
    assert view.deleting


@pytest.mark.parametrize("text", [None, "", "{", "[1]", '{"step": "x"}'])
def test_malformed_progress_is_ignored(text: str | None) -> None:
    assert parse_progress(text) is None


def test_node_ready() -> None:
    ready = {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    not_ready = {"status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}}
    assert node_ready(ready) and not node_ready(not_ready) and not node_ready({})


def test_the_termination_message_is_read_as_the_summary() -> None:
    message = json.dumps({"status": "Succeeded", "finalLoss": 1.0, "steps": 5})
    view = pod_view(
        pod_body(
            phase="Succeeded",
            containerStatuses=[
                {"name": "trainer", "state": {"terminated": {"exitCode": 0, "message": message}}}
            ],
        )
    )
    assert view.summary == {"status": "Succeeded", "finalLoss": 1.0, "steps": 5}
    plain_text = pod_view(
        pod_body(
            phase="Failed",
            containerStatuses=[
                {"name": "trainer", "state": {"terminated": {"exitCode": 1, "message": "oops"}}}
            ],
        )
    )
    assert plain_text.summary is None
