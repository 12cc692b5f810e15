"""Background work never dies silently: the node watch and the resync loop survive injected
failures (error answers, malformed answers, bugs, a CancelledError of a request) and recover;
/healthz reports one that stalled or ended; only a real cancellation ends them. (The lease
loop's: test_leader.py.)"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import kopf
import pytest
from aiohttp import web
from meshrun_operator.background import Liveness, Stalled
from meshrun_operator.client.errors import ApiTimeout
from meshrun_operator.client.login import Login
from meshrun_operator.client.rest import Rest
from meshrun_operator.runtime import resync
from meshrun_operator.runtime.context import OperatorContext
from meshrun_operator.runtime.handlers import alive
from meshrun_operator.runtime.resync import Resyncer
from meshrun_operator.seen import nodes as nodewatch
from meshrun_operator.seen.nodes import NodeWatch
from test_login import kubeconfig, serving
from test_resync import job
from waiting import until

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


def node(name: str, ready: bool = True) -> dict[str, Any]:
    condition = {"type": "Ready", "status": "True" if ready else "False"}
    return {
        "metadata": {"name": name, "resourceVersion": "7"},
        "status": {"conditions": [condition]},
    }


def test_the_node_watch_survives_every_kind_of_failure_and_recovers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A list answered 500, a list that is not JSON, a node without a name, a request's
    CancelledError in the middle of a watch, a watch cut off: each is retried after a backoff
    and the watch ends up current; stop() is the one thing that ends it."""
    lists = [
        web.json_response({"kind": "Status"}, status=500),
        web.Response(text="{not json"),
        web.json_response({"metadata": {"resourceVersion": "5"}, "items": [{"spec": {}}]}),
    ]
    watches = 0
    hang = asyncio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        nonlocal watches
        if request.query.get("watch") != "true":
            if lists:
                return lists.pop(0)
            return web.json_response({"metadata": {"resourceVersion": "5"}, "items": [node("n1")]})
        watches += 1
        stream = web.StreamResponse()
        await stream.prepare(request)
        event = {"type": "MODIFIED", "object": node("n1", ready=watches > 2)}
        await stream.write(json.dumps(event).encode() + b"\n")
        if watches == 1:
            return stream  # cut off: the next watch resumes from the version
        await hang.wait()
        return stream

    real_node_info = nodewatch.node_info
    cut = {"n": 0}

    def node_info(body: Any) -> Any:
        if body.get("metadata", {}).get("name") == "n1" and watches == 2 and not cut["n"]:
            cut["n"] += 1
            raise asyncio.CancelledError  # as a request cut off under the watch raises it
        return real_node_info(body)

    monkeypatch.setattr(nodewatch, "node_info", node_info)
    changes: list[int] = []

    async def scenario() -> None:
        async with serving(handler) as port:
            config = kubeconfig(tmp_path, {"token": "t"}, f"http://127.0.0.1:{port}")
            rest = Rest(Login(str(config)), ApiTimeout.of(5))
            watch = NodeWatch(rest, lambda: changes.append(1), watch_seconds=30)
            watch.liveness.backoff_base = 0.01
            watch.start()
            try:
                await until(lambda: watches >= 3, "the third watch")
                await until(lambda: "n1" in watch and watch["n1"][0].ready, "n1 ready again")
                assert watch.liveness.failures == 0 and not watch._task.done()  # type: ignore[union-attr]
                assert alive(watch.liveness, len(watch.nodes))["state"] == 1
                assert cut["n"] == 1 and not lists
            finally:
                watch.stop()
                hang.set()
                await asyncio.sleep(0.05)
                await rest.close()
            with pytest.raises(kopf.PermanentError, match="node watch ended: cancelled"):
                alive(watch.liveness, 0)

    asyncio.run(scenario())


def test_healthz_fails_for_a_node_watch_that_hears_nothing(tmp_path: Path) -> None:
    never = asyncio.Event()

    async def handler(request: web.Request) -> web.Response:
        await never.wait()  # the API server accepts the connection and never answers
        return web.json_response({})

    async def scenario() -> None:
        async with serving(handler) as port:
            config = kubeconfig(tmp_path, {"token": "t"}, f"http://127.0.0.1:{port}")
            rest = Rest(Login(str(config)), ApiTimeout.of(30))
            watch = NodeWatch(rest, lambda: None)
            assert watch.liveness.deadline >= 2 * (nodewatch.WATCH_SECONDS + 30)
            watch.liveness.deadline = 0.3
            watch.start()
            try:
                assert alive(watch.liveness, 0)["failures"] == 0
                await asyncio.sleep(0.5)
                with pytest.raises(kopf.PermanentError, match="node watch made no progress"):
                    alive(watch.liveness, 0)
            finally:
                watch.stop()
                never.set()
                await rest.close()

    asyncio.run(scenario())


def test_the_resync_loop_survives_a_failing_pass_and_healthz_reports_a_stalled_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    done: list[str] = []

    async def reconcile(ctx: Any, body: dict[str, Any], pods: Any, nodes: Any) -> None:
        done.append(body["metadata"]["uid"])

    monkeypatch.setattr(resync, "reconcile", reconcile)
    failures: list[BaseException] = [ValueError("a bug"), asyncio.CancelledError()]

    async def scenario() -> None:
        loop = Resyncer(OperatorContext(kube=None, resync_seconds=0.05), None, None)  # type: ignore[arg-type]
        loop.liveness.backoff_base = 0.01
        loop.jobs = {"a": job("a")}
        periodic = loop._periodic

        def failing(uid: str, body: dict[str, Any], now: Any) -> bool:
            if failures:
                raise failures.pop(0)
            return periodic(uid, body, now)

        monkeypatch.setattr(loop, "_periodic", failing)
        task = asyncio.create_task(loop.run())
        loop.liveness.task = task
        await until(lambda: done.count("a") >= 2, "job a reconciled after the failures")
        assert not failures and not task.done()
        assert loop.health(stall_seconds=5)["secondsSincePass"] < 1

        stuck, entered = asyncio.Event(), asyncio.Event()

        async def stuck_pass() -> None:
            entered.set()
            await stuck.wait()  # a pass that never completes

        monkeypatch.setattr(loop, "_pass", stuck_pass)
        # The pass under way when _pass was replaced still completes, and counts as progress:
        # the silence is timed from when the stuck pass began, not from the replacement (a
        # loaded machine may end that last pass well after it).
        await until(entered.is_set, "the stuck pass begun", seconds=30)
        await asyncio.sleep(0.4)
        with pytest.raises(Stalled, match="resync loop made no progress"):
            loop.health(stall_seconds=0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        with pytest.raises(Stalled, match="resync loop ended: cancelled"):
            loop.health(stall_seconds=5)

    asyncio.run(scenario())


def test_the_backoff_doubles_up_to_its_cap_and_starts_over_after_progress() -> None:
    liveness = Liveness("loop", deadline=10, backoff_base=1, backoff_max=5)
    waits = []
    for _ in range(5):
        liveness.failures += 1
        waits.append(liveness.backoff())
    assert waits == [1, 2, 4, 5, 5]
    liveness.progressed()
    liveness.failures += 1
    assert liveness.backoff() == 1
