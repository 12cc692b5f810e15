"""The resync loop's scheduling: a slow reconcile delays no other job, a failing one backs off;
/healthz's stall rule."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from meshrun_operator.children.owner import JobRef
from meshrun_operator.client.errors import ApiError, ApiTimeout
from meshrun_operator.client.kube import Kube
from meshrun_operator.client.login import Login
from meshrun_operator.client.rest import Rest
from meshrun_operator.jobstatus import Phase
from meshrun_operator.runtime import reconcile as reconcile_module
from meshrun_operator.runtime import resync
from meshrun_operator.runtime.context import OperatorContext
from meshrun_operator.runtime.resync import Failing, Resyncer, job_is_gone
from meshrun_operator.timing import Timing
from operator_factories import make_job, make_pod
from operator_lifecycle_helpers import TIMING, failed, running_job
from test_login import kubeconfig, serving
from waiting import until

from meshrun.api.crd import GROUP, PLURAL

pytestmark = pytest.mark.unit


def job(uid: str) -> dict[str, Any]:
    return {"metadata": {"uid": uid, "name": uid, "namespace": "ns"}}


async def after_a_pass(loop: Resyncer) -> None:
    """Return as soon as the loop completes its next pass."""
    before = loop.last_pass
    await until(lambda: loop.last_pass != before, "a pass of the resync loop", interval=0.005)


def test_a_hanging_reconcile_delays_no_other_job_and_health_reports_it_without_failing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    done: list[str] = []
    release = asyncio.Event()

    async def reconcile(ctx: Any, body: dict[str, Any], pods: Any, nodes: Any) -> None:
        if body["metadata"]["uid"] == "slow":
            await release.wait()
        done.append(body["metadata"]["uid"])

    monkeypatch.setattr(resync, "reconcile", reconcile)

    async def scenario() -> None:
        loop = Resyncer(OperatorContext(kube=None, resync_seconds=0.05), None, None)  # type: ignore[arg-type]
        loop.jobs = {"slow": job("slow"), "quick": job("quick")}
        task = asyncio.create_task(loop.run())
        await until(lambda: "slow" in loop.running, "the slow job's reconcile begun", seconds=30)
        await asyncio.sleep(0.3)  # the slow job waits longer than the stall_seconds below
        # Quick is reconciled again and again meanwhile: awaited, not counted after the sleep
        # (a pass every 0.05 s, but a loaded machine may run the loop only a few times in it).
        await until(lambda: done.count("quick") > 2, "quick reconciled three times", seconds=30)
        assert "slow" not in done
        assert loop.health(stall_seconds=10)["inFlight"] == 1
        # One job whose requests hang does not make the operator restart: it is reported. (Read
        # just after a pass: on a loaded machine a pass may come later than resync_seconds.)
        await after_a_pass(loop)
        health = loop.health(stall_seconds=0.25)
        assert health["stalledJobs"] == 1 and health["stalled"][0].startswith("ns/slow (slow): ")
        release.set()
        await until(lambda: "slow" in done, "the slow job's reconcile", interval=0.005)
        await after_a_pass(loop)
        health = loop.health(stall_seconds=0.25)
        assert health["longestWaitSeconds"] < 0.25
        assert health["stalledJobs"] == 0 and health["stalled"] == []
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("error", "completes"),
    [
        (aiohttp.ServerTimeoutError("Timeout on reading data from socket"), False),
        (ValueError("a bug"), True),
    ],
)
def test_only_an_api_server_that_does_not_answer_counts_as_a_stall(
    error: Exception, completes: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def reconcile(ctx: Any, body: dict[str, Any], pods: Any, nodes: Any) -> None:
        raise error

    monkeypatch.setattr(resync, "reconcile", reconcile)

    async def scenario() -> None:
        loop = Resyncer(OperatorContext(kube=None), None, None)  # type: ignore[arg-type]
        loop.jobs = {"a": job("a")}
        loop.waiting_since["a"] = 0.0
        await loop.one("a")
        # A job whose reconcile keeps failing on an answer (a bug, a 403) does not make the
        # operator restart; one whose API calls time out does.
        assert ("a" not in loop.waiting_since) is completes

    asyncio.run(scenario())


def test_ended_jobs_leave_the_periodic_pass_until_their_ttl_or_a_failed_reconcile() -> None:
    loop = Resyncer(OperatorContext(kube=None), None, None)  # type: ignore[arg-type]
    now = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)

    def ended(phase: str, ttl: int | None = None, done: str = "2026-01-01T11:59:00Z") -> Any:
        body = job("a")
        body["status"] = {"phase": phase, "completionTime": done}
        body["spec"] = {"runPolicy": {} if ttl is None else {"ttlSecondsAfterFinished": ttl}}
        return body

    assert loop._periodic("a", ended("Running"), now)  # deadlines and backoff need the clock
    assert not loop._periodic("a", ended("Succeeded"), now)  # only events wake it
    assert not loop._periodic("a", ended("Failed", ttl=120), now)  # TTL not yet run out
    assert loop._periodic("a", ended("Failed", ttl=60), now)  # ran out: delete it now
    # A delete sent to an API server that did not answer: looked at until it is confirmed or
    # expires (and is sent again), though no event may ever come for it.
    loop.ctx.expectations.expect_deletes("a", ["pod-uid"])
    assert loop._periodic("a", ended("Failed"), now)
    loop.ctx.expectations.settle("a", [])  # the pod is gone
    assert not loop._periodic("a", ended("Failed"), now)
    loop.failing["a"] = Failing(1, "ValueError: a bug", 0.0)
    assert loop._periodic("a", ended("Succeeded"), now)  # its cleanup failed: try again


def test_a_burst_of_pod_events_is_one_reconcile_and_a_new_job_is_not_kept_waiting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    done: list[tuple[str, float]] = []

    async def reconcile(ctx: Any, body: dict[str, Any], pods: Any, nodes: Any) -> None:
        done.append((body["metadata"]["uid"], asyncio.get_running_loop().time()))

    monkeypatch.setattr(resync, "reconcile", reconcile)

    batch = 2.0  # far longer than the burst takes, and than a loaded machine's stalls

    async def until(condition: Callable[[], bool], seconds: float) -> None:
        deadline = asyncio.get_running_loop().time() + seconds
        while not condition() and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.005)

    async def scenario() -> None:
        ctx = OperatorContext(kube=None, resync_seconds=60)  # type: ignore[arg-type]
        loop = Resyncer(ctx, None, None, batch_seconds=batch)
        loop.jobs = {"launching": job("launching"), "new": job("new")}
        task = asyncio.create_task(loop.run())
        await until(lambda: len(done) >= 2, 5)  # the first pass looks at every job
        done.clear()
        start = asyncio.get_running_loop().time()
        for _ in range(50):  # a launch: its pods change many times a second
            loop.poke("launching", batch=True)
            await asyncio.sleep(0.001)
        burst = asyncio.get_running_loop().time() - start
        loop.poke("new")  # a new job (or a new spec) is acted on at once
        await until(lambda: bool(done), batch / 2)
        assert [uid for uid, _ in done] == ["new"], f"after a burst of {burst:.3f} s"
        await until(lambda: len(done) >= 2, 3 * batch)
        assert [uid for uid, _ in done] == ["new", "launching"]
        assert 0.75 * batch <= done[1][1] - start <= 1.5 * batch
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("status", "details", "gone"),
    [
        (404, {"group": GROUP, "kind": PLURAL, "name": "j"}, True),
        (404, {"kind": "pods", "name": "j-0"}, False),
        (409, {"group": GROUP, "kind": PLURAL, "name": "j"}, False),
    ],
)
def test_only_the_job_itself_missing_counts_as_gone(
    status: int, details: dict[str, str], gone: bool
) -> None:
    body = json.dumps({"kind": "Status", "code": status, "details": details})
    assert job_is_gone(ApiError(status, "x", body)) is gone
    assert job_is_gone(ApiError(404, "Not Found", "not json")) is False


def test_a_child_wakes_only_the_job_of_its_own_namespace_and_name() -> None:
    loop = Resyncer(OperatorContext(kube=None), None, None)  # type: ignore[arg-type]
    loop.jobs = {"victim": {"metadata": {"uid": "victim", "name": "train", "namespace": "team-b"}}}
    loop.poke_owner(("evil", "train", "victim"))  # a pod elsewhere naming the job's uid
    loop.poke_owner(("team-b", "other", "victim"))
    loop.poke_owner(None)
    assert not loop.dirty and not loop.batched
    loop.poke_owner(("team-b", "train", "victim"), batch=True)
    assert set(loop.batched) == {"victim"}


def failures_logged(caplog: pytest.LogCaptureFixture) -> list[tuple[str, bool]]:
    """(message, with a traceback) of each failed reconcile the operator logged."""
    return [
        (r.getMessage(), r.exc_info is not None)
        for r in caplog.records
        if r.getMessage().startswith("reconcile of job")
    ]


def test_a_failing_reconcile_backs_off_doubling_and_logs_its_traceback_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    errors: list[Exception | None] = [ValueError("a bug")] * 5 + [KeyError("other"), None]
    errors += [ValueError("a bug")]

    async def reconcile(ctx: Any, body: dict[str, Any], pods: Any, nodes: Any) -> None:
        error = errors.pop(0)
        if error is not None:
            raise error

    monkeypatch.setattr(resync, "reconcile", reconcile)
    timing = Timing(error_backoff_base_seconds=2, error_backoff_max_seconds=10)

    async def scenario() -> None:
        loop = Resyncer(OperatorContext(kube=None, timing=timing), None, None)  # type: ignore[arg-type]
        loop.jobs = {"a": job("a")}
        delays = []
        for _ in range(len(errors)):
            await loop.one("a")
            failing = loop.failing.get("a")
            delays.append(None if failing is None else round(failing.retry_at - time.monotonic()))
        # Doubling from the base to the cap; another error starts no new streak, a success does.
        assert delays == [2, 4, 8, 10, 10, 10, None, 2]

    with caplog.at_level(logging.INFO, logger="meshrun.operator"):
        asyncio.run(scenario())
    logged = failures_logged(caplog)
    assert [traceback for _, traceback in logged] == [
        True, False, False, False, False,  # the same error again: one line each
        True,  # another error: in full
        False,  # succeeded
        True,  # failing again after a success: in full
    ]  # fmt: skip
    assert "ns/a (a)" in logged[0][0] and "failed again (2 in a row" in logged[1][0]
    assert "succeeded after 6 failure(s)" in logged[6][0]


def test_a_failing_job_is_not_retried_at_every_pass_but_a_new_spec_is_acted_on_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tries: list[float] = []

    async def reconcile(ctx: Any, body: dict[str, Any], pods: Any, nodes: Any) -> None:
        tries.append(time.monotonic())
        raise ValueError("the same bug")

    monkeypatch.setattr(resync, "reconcile", reconcile)
    timing = Timing(error_backoff_base_seconds=0.2, error_backoff_max_seconds=0.4)

    async def scenario() -> None:
        ctx = OperatorContext(kube=None, resync_seconds=0.01, timing=timing)  # type: ignore[arg-type]
        loop = Resyncer(ctx, None, None, batch_seconds=0.01)
        loop.jobs = {"a": job("a")}
        task = asyncio.create_task(loop.run())
        await asyncio.sleep(1.0)
        # Tried at about 0, 0.2, 0.6 and 1.0 s, not at each of the hundred passes; a pod event
        # does not cut the wait short.
        loop.poke("a", batch=True)
        await asyncio.sleep(0.05)
        gaps = [b - a for a, b in pairwise(tries)]
        assert 2 <= len(tries) <= 5, gaps
        assert gaps[0] >= 0.19 and all(gap >= 0.39 for gap in gaps[1:]), gaps
        # An edited spec (a new generation) is reconciled at once, backoff or not.
        before = len(tries)
        loop.poke("a")
        await asyncio.sleep(0.05)
        assert len(tries) == before + 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())


def test_a_job_waits_as_long_as_the_api_servers_retry_after(tmp_path: Path) -> None:
    """Every request answered 429 with Retry-After: 7 (the API server's priority and fairness
    throttling): the job's next reconcile waits 7 s, not the 2 s of its first backoff."""
    sent: list[str] = []

    async def handler(request: web.Request) -> web.Response:
        sent.append(f"{request.method} {request.path}")
        body = {"kind": "Status", "code": 429, "reason": "TooManyRequests", "message": "slow down"}
        return web.json_response(body, status=429, headers={"Retry-After": "7"})

    async def scenario() -> None:
        async with serving(handler) as port:
            config = kubeconfig(tmp_path, {"token": "t"}, f"http://127.0.0.1:{port}")
            rest = Rest(Login(str(config)), ApiTimeout.of(5))
            ctx = OperatorContext(kube=Kube(rest), timing=Timing(error_backoff_base_seconds=2))
            loop = Resyncer(ctx, {}, None)
            loop.jobs = {"uid-1": make_job()}
            try:
                await loop.one("uid-1")
                # The Service was refused: the pass wrote nothing, and is requeued.
                assert sent[-1].endswith("/services") and "uid-1" not in loop.failing, sent
                assert "uid-1" in loop.batched
                asked = time.monotonic()
                await loop.one("uid-1")
            finally:
                await rest.close()
            # The next pass wrote the status saying so (refused too).
            assert sent[0].endswith("/services") and sent[-1].endswith("/job/status"), sent
            failing = loop.failing["uid-1"]
            # 7 s from its failure, which came between the two readings of the clock (not
            # measured from the assertion: a loaded machine may take a while to get there).
            assert asked + 7 <= failing.retry_at <= time.monotonic() + 7
            assert "TooManyRequests" in failing.said

    asyncio.run(scenario())


def status_answer(code: int, message: str, **details: Any) -> dict[str, Any]:
    """The Status object of an error answer, as the API server writes it."""
    reason = {403: "Forbidden", 404: "NotFound"}[code]
    return {"kind": "Status", "code": code, "reason": reason, "message": message, **details}


class GoneJobKube:
    """The API door of a job deleted meanwhile: its status patch is answered 404 for the job."""

    may_write = staticmethod(lambda: True)

    async def delete_pods(self, namespace: str, pods: Any, force: bool, uids: Any) -> None:
        return None

    async def patch_status(self, namespace: str, name: str, *_: Any) -> dict[str, Any]:
        details = {"name": name, "group": GROUP, "kind": PLURAL}
        status = status_answer(404, f"{name} not found", details=details)
        raise ApiError(404, "Not Found", json.dumps(status))

    async def post_event(self, *_: Any) -> None:
        return None


def test_a_job_the_api_server_says_is_gone_is_dropped_from_everything_at_once() -> None:
    """Its DELETED event never came (a namespace deleted with it): the first 404 for the job
    drops it from the loop, the per-job memory and the gauge, and a late event of it is
    ignored."""
    gone, other = running_job(), running_job()
    other["metadata"] = {**other["metadata"], "uid": "uid-2", "name": "other"}
    pods = [failed(0, 137, owner_uid="uid-1", uid="p0"), make_pod(1, owner_uid="uid-1", uid="p1")]
    ctx = OperatorContext(kube=GoneJobKube(), timing=TIMING)  # type: ignore[arg-type]
    loop = Resyncer(ctx, {("ns", "job"): pods}, None)
    loop.jobs = {"uid-1": gone, "uid-2": other}
    ctx.phases.set("uid-2", Phase.RUNNING)

    asyncio.run(loop.one("uid-1"))  # a restart: its status is written first, and refused 404
    assert set(loop.jobs) == {"uid-2"} and "uid-1" not in loop.failing
    assert ctx.phases.phases == {"uid-2": "Running"}  # the gauge counts the live job only
    for memory in (ctx.locks, ctx.latest, ctx.attempts, ctx.deferred, ctx.unwritten):
        assert "uid-1" not in memory
    assert not ctx.expectations.pending("uid-1")
    # The watch's older news of it does not bring it back; its deletion ends the memory.
    loop.job_changed("uid-1", gone, deleted=False)
    assert "uid-1" not in loop.jobs and not loop.dirty and not loop.batched
    loop.job_changed("uid-1", gone, deleted=True)
    assert "uid-1" not in loop.dropped


TERMINATING = "namespace ns is being terminated"
NAMESPACE_TERMINATING = status_answer(
    403,
    f'services "job" is forbidden: unable to create new content in namespace ns: {TERMINATING}',
    details={
        "name": "job",
        "kind": "services",
        "causes": [{"reason": "NamespaceTerminating", "message": TERMINATING}],
    },
)
NAMESPACE_NOT_FOUND = status_answer(
    404, 'namespaces "ns" not found', details={"name": "ns", "kind": "namespaces"}
)
QUOTA = status_answer(
    403,
    'services "job" is forbidden: exceeded quota: q',
    details={"name": "job", "kind": "services"},
)


@pytest.mark.parametrize(
    ("answer", "dropped"),
    [(NAMESPACE_TERMINATING, True), (NAMESPACE_NOT_FOUND, True), (QUOTA, False)],
    ids=["terminating", "gone", "quota"],
)
def test_the_jobs_of_a_namespace_being_deleted_are_dropped_at_the_first_refusal(
    answer: dict[str, Any], dropped: bool, tmp_path: Path
) -> None:
    """A create (the job's Service, an Event) refused because the namespace is being deleted
    or gone drops every job of that namespace; a quota's 403 is a refusal to wait out."""

    async def handler(request: web.Request) -> web.Response:
        if request.method == "POST":
            return web.json_response(answer, status=answer["code"])
        status = await request.json() if request.method == "PATCH" else {}
        meta = {"name": "job", "namespace": "ns", "uid": "uid-1", "resourceVersion": "2"}
        return web.json_response({"metadata": meta, **status})

    async def scenario() -> None:
        async with serving(handler) as port:
            config = kubeconfig(tmp_path, {"token": "t"}, f"http://127.0.0.1:{port}")
            rest = Rest(Login(str(config)), ApiTimeout.of(5))
            ctx = OperatorContext(kube=Kube(rest))
            loop = Resyncer(ctx, {}, None)
            neighbour, elsewhere = make_job("neighbour"), make_job("elsewhere")
            neighbour["metadata"]["uid"] = "uid-2"
            elsewhere["metadata"].update(uid="uid-3", namespace="other")
            loop.jobs = {"uid-1": make_job(), "uid-2": neighbour, "uid-3": elsewhere}
            try:
                await loop.one("uid-1")
            finally:
                await rest.close()
            kept = {"uid-3"} if dropped else {"uid-1", "uid-2", "uid-3"}
            assert set(loop.jobs) == kept
            assert set(loop.dropped) == ({"uid-1", "uid-2"} if dropped else set())
            assert not loop.failing  # not an error to retry either way

    asyncio.run(scenario())


def test_a_new_spec_is_planned_off_the_event_loop_and_a_known_one_is_not_planned_again() -> None:
    """Planning an ``auto`` job runs on a thread: other work on the event loop goes on
    meanwhile (an author who edits the spec in a loop slows no one else's jobs)."""
    body = make_job(strategy={"type": "auto"}, resources={"numNodes": 16, "numProcPerNode": 8},
                    model={"preset": "7b"},
                    training={"steps": 10, "globalBatchSize": 512})  # fmt: skip
    del body["spec"]["training"]["microBatchSize"]  # auto chooses it
    ctx = OperatorContext(kube=None)  # type: ignore[arg-type]
    job = JobRef("job", "ns", "uid-1")

    async def scenario() -> tuple[int, Any, Any]:
        ticks, done = 0, False

        async def ticker() -> None:
            nonlocal ticks
            while not done:
                ticks += 1
                await asyncio.sleep(0)

        task = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        before = ticks
        first = await reconcile_module.evaluation(ctx, job, body["spec"], 1, None)
        during = ticks - before
        again = await reconcile_module.evaluation(ctx, job, body["spec"], 1, None)
        done = True
        await task
        return during, first, again

    during, first, again = asyncio.run(scenario())
    assert first.error is None and first.plan is not None, first.error
    assert during >= 2, "the event loop stood still while the spec was planned"
    assert again is first  # the same generation: not planned again


def test_new_specs_are_planned_on_one_thread_of_their_own() -> None:
    """Many new jobs at once are planned one after another on the evaluations' one thread, not
    on a thread each: planning holds the GIL, and every thread that allocates keeps a malloc
    arena of its own."""
    ctx = OperatorContext(kube=None)  # type: ignore[arg-type]
    threads: list[str] = []
    plan = ctx.evaluations.of

    def recorded(*args: Any, **kwargs: Any) -> Any:
        threads.append(threading.current_thread().name)
        return plan(*args, **kwargs)

    ctx.evaluations.of = recorded  # type: ignore[method-assign]

    async def scenario() -> list[Any]:
        jobs = [JobRef(f"job-{i}", "ns", f"uid-{i}") for i in range(8)]
        return await asyncio.gather(
            *(reconcile_module.evaluation(ctx, job, make_job()["spec"], 1, None) for job in jobs)
        )

    evaluated = asyncio.run(scenario())
    assert all(ev.error is None and ev.plan is not None for ev in evaluated)
    assert len(threads) == 8 and len(set(threads)) == 1, threads
    assert threads[0].startswith("meshrun-planner") and threads[0] != "MainThread"
