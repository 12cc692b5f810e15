"""Failure classification, and the views of observed pods and nodes."""

from __future__ import annotations

import json
from typing import Any

import pytest
from meshrun_operator import names
from meshrun_operator.lifecycle.failure.classes import FailureClass, classify
from meshrun_operator.seen.boundedjson import MAX_CHARS, MAX_DEPTH, Unreadable, read_object
from meshrun_operator.seen.views import node_ready, parse_progress, parse_summary, pod_view

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
        (None, None, "Shutdown", FailureClass.IGNORED, "Shutdown"),
        (143, None, "Terminated", FailureClass.IGNORED, "Terminated"),
        (None, None, "NodeLost", FailureClass.IGNORED, "NodeLost"),
        (
            None,
            None,
            "UnexpectedAdmissionError",
            FailureClass.RETRYABLE,
            "UnexpectedAdmissionError",
        ),
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


DEEP = 5_000
"""Nesting levels past Python's recursion limit (its decoder recurses once per level)."""
DEEP_TEXTS = {
    "arrays": "[" * DEEP + "]" * DEEP,
    "objects": '{"a":' * DEEP + "1" + "}" * DEEP,
    "inside a report": '{"step": 3, "x": ' + "[" * DEEP + "]" * DEEP + "}",
    "unclosed": '{"step": 3, "x": ' + "[" * DEEP,
}


@pytest.mark.parametrize("text", DEEP_TEXTS.values(), ids=DEEP_TEXTS.keys())
def test_a_deep_report_is_refused_by_depth_before_it_is_decoded(text: str) -> None:
    assert parse_progress(text) is None
    assert parse_summary(text) is None
    with pytest.raises(Unreadable, match="nested deeper than"):
        read_object(text)


def test_a_deep_annotation_or_termination_message_leaves_the_pod_in_view() -> None:
    deep = DEEP_TEXTS["inside a report"]
    body = pod_body(
        phase="Failed",
        containerStatuses=[
            {"name": "trainer", "state": {"terminated": {"exitCode": 1, "message": deep}}}
        ],
    )
    body["metadata"]["annotations"][names.ANNOTATION_PROGRESS] = deep
    view = pod_view(body)
    assert (view.name, view.phase, view.exit_code) == ("job-3", "Failed", 1)
    assert view.progress is None and view.summary is None


def test_brackets_inside_strings_do_not_count_as_depth() -> None:
    note = '[{\\"' * DEEP
    assert parse_progress(f'{{"step": 3, "note": "{note}", "loss": 1.5}}') == {
        "step": 3,
        "loss": 1.5,
    }
    summary = {"status": "Failed", "error": "x" * 3000 + "]]]}}}"}
    assert parse_summary(json.dumps(summary)) == summary


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), "nested deeper than"),
        ('{"step": 1, "pad": "' + "x" * MAX_CHARS + '"}', "longer than"),
        ("[1, 2]", "not an object"),
        ('{"step": 1', "not JSON"),
        ("", "not JSON"),
    ],
)
def test_what_the_bounded_reader_refuses_it_says_why(text: str, why: str) -> None:
    with pytest.raises(Unreadable, match=why):
        read_object(text)


def test_the_bounded_reader_reads_what_the_trainer_writes() -> None:
    nested = "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1)
    assert read_object(f'{{"deep": {nested}}}') == json.loads(f'{{"deep": {nested}}}')
    message = {"status": "Succeeded", "steps": 5, "eval": [{"step": 5, "loss": 1.0}]}
    assert read_object(json.dumps(message).encode()) == message
