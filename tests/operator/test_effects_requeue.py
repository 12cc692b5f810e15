"""What a pass's acts meet is decided on by the next pass, not by deciding again inside the pass:
a refused create, a pod the API server rejects, a Kueue hold. The pass that met it writes no
status and is requeued; the next one writes the status once, from what it observes (the real
reconcile and resync loop; the API server is a store of one job that answers creates as told)."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest
from meshrun_operator import names
from meshrun_operator.client.answers import ChildRejected, Holder, Refused
from meshrun_operator.runtime import resync
from meshrun_operator.runtime.context import OperatorContext
from meshrun_operator.runtime.kueue_link import KueueLink
from meshrun_operator.runtime.reconcile import Requeue, reconcile
from meshrun_operator.runtime.resync import Resyncer
from operator_factories import make_job
from operator_lifecycle_helpers import TIMING
from test_own_status import OneJobApi

pytestmark = pytest.mark.unit

QUOTA = 'pods "job-1" is forbidden: exceeded quota: gpus'


class CreatingApi(OneJobApi):
    """One job, and the answers to its creates: ``refuse`` (pod name -> Refused), ``reject``
    (pod name -> the API server's words), ``taken`` (kinds whose name someone else holds)."""

    def __init__(self, job: dict[str, Any]) -> None:
        super().__init__(job)
        self.refuse: dict[str, Refused] = {}
        self.reject: dict[str, str] = {}
        self.taken: set[str] = set()
        self.sent: list[str] = []

    async def create(self, obj: dict[str, Any]) -> bool:
        self.sent.append(f"{obj['kind']} {obj['metadata']['name']}")
        return obj["kind"] not in self.taken

    async def create_all(
        self, objs: list[dict[str, Any]], unsent: Any = None
    ) -> list[bool | Refused]:
        results: list[bool | Refused] = []
        for obj in objs:
            name = obj["metadata"]["name"]
            self.sent.append(f"Pod {name}")
            if name in self.reject:
                raise ChildRejected("Pod", name, self.reject[name])
            results.append(self.refuse.get(name, True))
        return results

    async def holder(self, kind: str, namespace: str, name: str, api_version: Any = None) -> Any:
        return Holder(None, -1, False, labels={"app": "db"})  # someone else's

    async def get_custom(self, *_: Any) -> None:
        return None  # no WorkloadPriorityClass, no LocalQueue


def passes(ctx: OperatorContext, api: CreatingApi) -> Any:
    """One reconcile of the job as the API server holds it (no pod is seen: the watch lags)."""
    return asyncio.run(reconcile(ctx, copy.deepcopy(api.job), {}, None))


def test_a_refused_create_is_decided_by_the_next_pass_with_one_status_write() -> None:
    api = CreatingApi(make_job())
    api.refuse["job-1"] = Refused("Pod", "job-1", 403, QUOTA)
    ctx = OperatorContext(kube=api, timing=TIMING)  # type: ignore[arg-type]
    with pytest.raises(Requeue):
        passes(ctx, api)
    # The pass that met the refusal wrote nothing and told nothing.
    assert api.took("status") == [] and api.took("event") == []
    assert api.sent == ["Service job", "Pod job-0", "Pod job-1"]
    decision = passes(ctx, api)
    [status] = api.took("status")
    refused = next(c for c in status["conditions"] if c["type"] == "CreationRefused")
    assert (refused["status"], refused["reason"]) == ("True", "QuotaExceeded")
    # job-0 was created: the attempt started with it, and the Event counts it alone.
    assert status["attemptStartTime"] is not None and status["nextAttemptTime"] is not None
    events = {(reason, message) for _, reason, message in api.took("event")}
    assert ("PodsCreated", "creating 1 pod(s) for attempt 0") in events
    assert "QuotaExceeded" in {reason for reason, _ in events}
    # Nothing was created again by the pass that decided on the refusal.
    assert decision.create_pods == () and api.sent == ["Service job", "Pod job-0", "Pod job-1"]
    # Decided once: a third pass has nothing to write or say, and nothing to requeue.
    passes(ctx, api)
    assert api.took("status") == [] and api.took("event") == []


def test_a_name_someone_else_holds_starts_no_attempt() -> None:
    api = CreatingApi(make_job())
    api.taken.add("Service")
    ctx = OperatorContext(kube=api, timing=TIMING)  # type: ignore[arg-type]
    with pytest.raises(Requeue):
        passes(ctx, api)
    assert api.sent == ["Service job"] and api.took("status") == []
    passes(ctx, api)
    [status] = api.took("status")
    refused = next(c for c in status["conditions"] if c["type"] == "CreationRefused")
    assert refused["reason"] == "NameConflict" and status["phase"] == "Pending"
    # No pod was sent: the attempt has not started, and no Event says pods were created.
    assert status.get("attemptStartTime") is None
    reasons = [reason for _, reason, _ in api.took("event")]
    assert "NameConflict" in reasons and "PodsCreated" not in reasons


def test_a_rejected_pod_makes_the_spec_invalid_at_the_next_pass_and_no_pod_is_sent_again() -> None:
    api = CreatingApi(make_job())
    api.reject["job-0"] = "spec.containers[0].image: Invalid value"
    ctx = OperatorContext(kube=api, timing=TIMING)  # type: ignore[arg-type]
    with pytest.raises(Requeue):
        passes(ctx, api)
    assert api.took("status") == []
    sent = list(api.sent)
    decision = passes(ctx, api)
    [status] = api.took("status")
    invalid = next(c for c in status["conditions"] if c["type"] == "Invalid")
    assert invalid["status"] == "True" and "spec.podTemplate" in invalid["message"]
    assert decision.invalid and decision.create_pods == () and api.sent == sent


def test_a_kueue_hold_is_shown_by_the_next_pass_and_the_workload_not_tried_again_meanwhile() -> (
    None
):
    job = make_job(scheduling={"queueName": "team-a"})
    job["metadata"]["labels"] = {names.PRIORITY_CLASS_LABEL: "urgent"}
    api = CreatingApi(job)
    ctx = OperatorContext(kube=api, timing=TIMING, kueue=KueueLink())  # type: ignore[arg-type]
    with pytest.raises(Requeue):
        passes(ctx, api)  # the WorkloadPriorityClass is not found: no Workload
    assert api.took("status") == [] and api.sent == []
    passes(ctx, api)
    [status] = api.took("status")
    suspended = next(c for c in status["conditions"] if c["type"] == "Suspended")
    assert status["phase"] == "Suspended" and suspended["reason"] == "WorkloadPriorityClassNotFound"
    assert "urgent" in status["message"]
    passes(ctx, api)  # held: neither a Workload nor a pod is sent, nothing requeued
    assert api.sent == [] and api.took("status") == []


def test_a_requeued_job_is_reconciled_again_soon_and_not_counted_as_failing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    done: list[str] = []

    async def reconcile(ctx: Any, body: dict[str, Any], pods: Any, nodes: Any) -> None:
        done.append(body["metadata"]["uid"])
        if len(done) == 1:
            raise Requeue("a create was refused")

    monkeypatch.setattr(resync, "reconcile", reconcile)

    async def scenario() -> None:
        ctx = OperatorContext(kube=None, resync_seconds=60)  # type: ignore[arg-type]
        loop = Resyncer(ctx, None, None, batch_seconds=0.05)
        loop.jobs = {"uid-1": make_job()}
        loop.poke("uid-1")
        task = asyncio.create_task(loop.run())
        # Soon: well within the 60 s resync (up to 5 s, for a loaded machine), not after it.
        for _ in range(500):
            if len(done) == 2:
                break
            await asyncio.sleep(0.01)
        assert done == ["uid-1", "uid-1"] and loop.failing == {}
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
