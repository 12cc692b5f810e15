"""A status the operator did not write is not acted on: it is restored, and an Event says so
(runtime/ownstatus.py, through the real reconcile; the API server is a store of one job that
applies merge patches to /status)."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest
from meshrun_operator.client.kube import StaleJob
from meshrun_operator.plaindata import merged, replacing
from meshrun_operator.runtime.context import OperatorContext
from meshrun_operator.runtime.reconcile import reconcile
from meshrun_operator.runtime.resync import Resyncer
from operator_factories import make_pod
from operator_lifecycle_helpers import TIMING, running_job

pytestmark = pytest.mark.unit

FORGED = {"phase": "Succeeded", "restarts": 99, "completionTime": "2026-01-01T12:00:03Z"}
"""What a user allowed to patch paralleltrainingjobs/status writes into a running job."""


class OneJobApi:
    """The API server's copy of one job: /status merge patches under a resourceVersion
    precondition, and what the operator sent (status patches, pod deletes, Events)."""

    def __init__(self, job: dict[str, Any]) -> None:
        self.job = copy.deepcopy(job)
        self.job["metadata"]["resourceVersion"] = "1"
        self.calls: list[tuple[str, Any]] = []
        self.unanswered = False
        """The next status patch is applied, but its answer never comes."""

    def may_write(self) -> bool:
        return True

    def write(self, patch: dict[str, Any]) -> dict[str, Any]:
        """Apply a status patch (the operator's or anyone's); the job as stored after it."""
        meta = self.job["metadata"]
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)
        self.job["status"] = merged(self.job.get("status") or {}, patch)
        return copy.deepcopy(self.job)

    async def patch_status(
        self, namespace: str, name: str, version: str, status: dict[str, Any]
    ) -> dict[str, Any]:
        if version != self.job["metadata"]["resourceVersion"]:
            raise StaleJob(f"{namespace}/{name} changed meanwhile")
        self.calls.append(("status", status))
        written = self.write(status)
        if self.unanswered:
            self.unanswered = False
            raise TimeoutError("the answer was lost")
        return written

    async def delete_pods(self, namespace: str, pods: Any, force: bool, uids: Any) -> None:
        self.calls.append(("delete", sorted(pods)))

    async def post_event(self, involved: Any, type: str, reason: str, message: str) -> None:
        self.calls.append(("event", (type, reason, message)))

    def took(self, kind: str) -> list[Any]:
        """What was sent of ``kind`` since the last look."""
        found = [what for done, what in self.calls if done == kind]
        self.calls = [(done, what) for done, what in self.calls if done != kind]
        return found


PODS = {("ns", "job"): [make_pod(i, owner_uid="uid-1", uid=f"p{i}") for i in (0, 1)]}


def reconciled(ctx: OperatorContext, api: OneJobApi) -> str:
    """One reconcile of the job as the API server holds it now; the phase decided."""
    decision = asyncio.run(reconcile(ctx, copy.deepcopy(api.job), PODS, None))
    return str(decision.state.phase)


def test_a_status_someone_else_wrote_is_restored_said_and_not_acted_on() -> None:
    api = OneJobApi(running_job())
    ctx = OperatorContext(kube=api, timing=TIMING)  # type: ignore[arg-type]
    assert reconciled(ctx, api) == "Running"
    api.calls.clear()

    api.write(FORGED)  # phase Succeeded, restarts 99, beside a Running=True condition
    assert reconciled(ctx, api) == "Running"
    # No clean-up of a finished job: the running gang is left alone.
    assert api.took("delete") == []
    # Its own status is written back at once, whole: what was added is removed.
    [patch] = api.took("status")
    assert (patch["phase"], patch["restarts"], patch["completionTime"]) == ("Running", 0, None)
    stored = api.job["status"]
    assert (stored["phase"], stored["restarts"], "completionTime" in stored) == (
        "Running",
        0,
        False,
    )
    [(kind, reason, message)] = api.took("event")
    assert (kind, reason) == ("Warning", "StatusRestored")
    assert "phase Succeeded, not Running" in message and "restarts 99, not 0" in message
    assert "completionTime 2026-01-01T12:00:03Z added" in message
    assert ctx.phases.phases["uid-1"] == "Running"

    # Its own status back: nothing more to write or say.
    assert reconciled(ctx, api) == "Running"
    assert api.took("status") == [] and api.took("event") == []

    # Forged again: restored and said again.
    api.write({"restarts": 7})
    reconciled(ctx, api)
    assert [p["restarts"] for p in api.took("status")] == [0]
    assert [reason for _, reason, _ in api.took("event")] == ["StatusRestored"]


def test_the_operators_own_writes_and_other_changes_of_the_job_are_not_someone_elses() -> None:
    api = OneJobApi(running_job())
    ctx = OperatorContext(kube=api, timing=TIMING)  # type: ignore[arg-type]
    reconciled(ctx, api)
    # An edit of the spec or the labels: a newer version, the same status.
    api.job["metadata"]["resourceVersion"] = str(int(api.job["metadata"]["resourceVersion"]) + 1)
    api.job["metadata"]["labels"] = {"team": "b"}
    api.calls.clear()
    reconciled(ctx, api)
    assert api.took("event") == []

    # A failure restarts the gang; the status write is applied but its answer is lost (the
    # reconcile fails on it), and the watch brings the job as the write left it.
    api.unanswered = True
    failed = [make_pod(0, phase="Failed", exit_code=137, owner_uid="uid-1", uid="p0")]
    pods = {("ns", "job"): [*failed, PODS["ns", "job"][1]]}
    with pytest.raises(TimeoutError):
        asyncio.run(reconcile(ctx, copy.deepcopy(api.job), pods, None))
    assert api.job["status"]["restarts"] == 1
    decision = asyncio.run(reconcile(ctx, copy.deepcopy(api.job), pods, None))
    assert decision.status["restarts"] == 1  # its own write, not restored, not counted twice
    assert "StatusRestored" not in {reason for _, reason, _ in api.took("event")}


def test_a_new_leader_takes_the_status_it_finds_as_the_other_operators() -> None:
    api = OneJobApi(running_job())
    ctx = OperatorContext(kube=api, timing=TIMING)  # type: ignore[arg-type]
    reconciled(ctx, api)
    loop = Resyncer(ctx, PODS, None)
    loop.leadership_changed(False)  # meanwhile another operator leads and writes
    api.write({"restarts": 1, "attempt": 1})
    loop.leadership_changed(True)
    api.calls.clear()
    reconciled(ctx, api)
    assert "StatusRestored" not in {reason for _, reason, _ in api.took("event")}


@pytest.mark.parametrize(
    ("target", "patch", "result"),
    [  # RFC 7386, appendix A
        ({"a": "b"}, {"a": "c"}, {"a": "c"}),
        ({"a": "b"}, {"b": "c"}, {"a": "b", "b": "c"}),
        ({"a": "b"}, {"a": None}, {}),
        ({"a": "b", "b": "c"}, {"a": None}, {"b": "c"}),
        ({"a": ["b"]}, {"a": "c"}, {"a": "c"}),
        ({"a": "c"}, {"a": ["b"]}, {"a": ["b"]}),
        ({"a": {"b": "c"}}, {"a": {"b": "d", "c": None}}, {"a": {"b": "d"}}),
        ({"a": [{"b": "c"}]}, {"a": [1]}, {"a": [1]}),
        (["a", "b"], ["c", "d"], ["c", "d"]),
        ({"a": "b"}, ["c"], ["c"]),
        ({"a": "foo"}, None, None),
        ({"a": "foo"}, "bar", "bar"),
        ({"e": None}, {"a": 1}, {"e": None, "a": 1}),
        ([1, 2], {"a": "b", "c": None}, {"a": "b"}),
        ({}, {"a": {"bb": {"ccc": None}}}, {"a": {"bb": {}}}),
    ],
)
def test_a_merge_patch_is_applied_as_the_api_server_does(
    target: Any, patch: Any, result: Any
) -> None:
    assert merged(target, patch) == result


def test_the_restoring_patch_leaves_exactly_the_operators_status() -> None:
    forged = {"phase": "Succeeded", "progress": {"step": 9, "loss": 0.1}, "extra": [1]}
    own = {"phase": "Running", "progress": {"step": 3}, "restarts": 0}
    assert merged(forged, replacing(forged, own)) == own
