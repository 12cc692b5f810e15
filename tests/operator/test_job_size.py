"""One job's size: the operator's cap on the pods of one job (--max-pods-per-job), pods created
in batches that double, as the Job controller's slow start, a Workload built from one pod per
stage, and a gang's creates and deletes when the API server stops or fails (no cluster; real
HTTP servers)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from meshrun_operator.children.builders import build_pod
from meshrun_operator.children.owner import JobRef
from meshrun_operator.client.answers import Refused
from meshrun_operator.client.errors import ApiError, ApiTimeout
from meshrun_operator.client.kube import Kube
from meshrun_operator.client.login import Login
from meshrun_operator.client.rest import Rest
from meshrun_operator.kueue import QueueRef
from meshrun_operator.lifecycle.evaluation import Admission, evaluate
from meshrun_operator.main import admission, parse_args
from meshrun_operator.runtime import kueue_link
from meshrun_operator.runtime.actions import _create_children
from meshrun_operator.runtime.context import OperatorContext
from meshrun_operator.runtime.kueue_link import KueueLink
from operator_factories import make_job, observe
from operator_lifecycle_helpers import run
from test_login import kubeconfig, serving

pytestmark = pytest.mark.unit


def test_a_job_larger_than_the_cap_is_invalid_naming_the_field() -> None:
    four = make_job(resources={"numNodes": 4, "numProcPerNode": 4},
                    training={"steps": 10, "globalBatchSize": 32, "microBatchSize": 2})  # fmt: skip
    error = evaluate(four["spec"], "job", Admission(max_pods=3)).error
    assert error is not None and error.field == "spec.resources.numNodes"
    assert error.rule == (
        "4 pods are more than the 3 this operator makes for one job (its --max-pods-per-job, "
        "Helm value operator.maxPodsPerJob)"
    )
    assert evaluate(four["spec"], "job", Admission(max_pods=4)).error is None
    assert evaluate(four["spec"], "job").error is None  # no cap unless the operator sets one


def test_an_elastic_job_is_capped_at_its_largest_size() -> None:
    spec = {
        "resources": {"numNodes": 2, "numProcPerNode": 2, "accelerator": "nvidia.com/gpu"},
        "training": {"steps": 100, "globalBatchSize": 16, "microBatchSize": 1,
                     "checkpoint": {"everySteps": 5}},
        "elastic": {"minDataParallel": 2, "maxDataParallel": 8},
    }  # fmt: skip
    error = evaluate(make_job(**spec)["spec"], "job", Admission(max_pods=3)).error
    assert error is not None and error.field == "spec.elastic.maxDataParallel"
    assert error.rule.startswith("4 pods are more than the 3")  # dp 8 x 1 x 1 / 2 per pod
    assert evaluate(make_job(**spec)["spec"], "job", Admission(max_pods=4)).error is None


def test_the_flag() -> None:
    assert parse_args([]).max_pods_per_job == 1024
    assert admission(parse_args(["--max-pods-per-job", "8"])).max_pods == 8
    with pytest.raises(SystemExit):
        parse_args(["--max-pods-per-job", "0"])


class Recorder(Kube):
    """A Kube whose creates are recorded with how many were in flight together; ``refuse``:
    the names answered with a refusal (a quota)."""

    def __init__(self, refuse: frozenset[str] = frozenset()) -> None:
        self.refuse = refuse
        self.sent: list[str] = []
        self.in_flight = 0
        self.batches: list[int] = []
        self.ticks = 0

    async def create(self, obj: Mapping[str, Any], sent: Callable[[], None] | None = None) -> bool:
        name = obj["metadata"]["name"]
        self.sent.append(name)
        if sent is not None:
            sent()
        self.in_flight += 1
        if self.in_flight == 1:
            self.batches.append(0)
        self.batches[-1] += 1
        await asyncio.sleep(0.001)  # the API server's answer
        self.in_flight -= 1
        if name in self.refuse:
            raise Refused("Pod", name, 403, "exceeded quota: gpus", None)
        return True


def pods(count: int) -> list[dict[str, Any]]:
    return [{"kind": "Pod", "metadata": {"name": f"p-{i}"}} for i in range(count)]


def test_creates_go_in_batches_that_double_and_stop_at_a_refusal() -> None:
    kube = Recorder()
    results = asyncio.run(kube.create_all(pods(20)))
    assert results == [True] * 20
    assert kube.batches == [1, 2, 4, 8, 5]  # never more in flight than the batch
    refused = Recorder(refuse=frozenset({"p-4"}))
    results = asyncio.run(refused.create_all(pods(20)))
    # The batch with the refusal is the last: 7 creates sent, not 20.
    assert refused.sent == [f"p-{i}" for i in range(7)]
    assert results[:4] == [True] * 4 and results[5:7] == [True, True]
    assert all(isinstance(r, Refused) for r in (results[4], *results[7:]))
    assert all(r is results[4] for r in results[7:])  # the unsent ones carry its reason


def test_other_work_runs_between_batches() -> None:
    kube = Recorder()

    async def both() -> list[int]:
        seen: list[int] = []

        async def watcher() -> None:
            while len(kube.sent) < 31:
                seen.append(len(kube.sent))
                await asyncio.sleep(0)

        await asyncio.gather(kube.create_all(pods(31)), watcher())
        return seen

    seen = asyncio.run(both())
    # The other task saw every batch boundary: 1, 3, 7 and 15 creates sent.
    assert {1, 3, 7, 15} <= set(seen)


def test_creates_that_never_reached_a_stopped_api_server_are_not_in_flight(
    tmp_path: Path,
) -> None:
    """The API server stops after the gang's first pod: the pods whose connection was refused,
    and those never sent, are not expected from the watch (the next pass creates them at once
    instead of waiting out the expectations' timeout); the one it answered is."""
    job = make_job(name="train", resources={"numNodes": 4, "numProcPerNode": 4},
                   training={"steps": 10, "globalBatchSize": 32, "microBatchSize": 2})  # fmt: skip
    ev = evaluate(job["spec"], "train")
    _, decision = run(job, observe(), 0)
    assert decision.create_pods == (0, 1, 2, 3)
    created: list[str] = []
    listening: list[Any] = []

    async def handler(request: web.Request) -> web.Response:
        body = await request.json()
        if body["kind"] == "Pod":
            created.append(body["metadata"]["name"])
            listening[0].close()  # the API server goes away after this answer
            return web.json_response(body, status=201, headers={"Connection": "close"})
        return web.json_response(body, status=201)

    async def scenario() -> OperatorContext:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        listening.append(site._server)
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        config = kubeconfig(tmp_path, {"token": "t"}, f"http://127.0.0.1:{port}")
        rest = Rest(Login(str(config)), ApiTimeout.of(5))
        ctx = OperatorContext(kube=Kube(rest))
        try:
            with pytest.raises(aiohttp.ClientConnectorError):
                await _create_children(ctx, JobRef("train", "ns", "uid-1"), ev, decision)
        finally:
            await rest.close()
            await runner.cleanup()
        return ctx

    ctx = asyncio.run(scenario())
    assert created == ["train-0"]
    assert set(ctx.expectations.creates["uid-1"]) == {"train-0"}


class WorkloadKube:
    """Records the Workload created; no LocalQueue (no flavor tolerations)."""

    def __init__(self) -> None:
        self.created: list[dict[str, Any]] = []

    async def create(self, obj: dict[str, Any]) -> bool:
        self.created.append(obj)
        return True

    async def get_custom(self, *_: Any) -> None:
        return None


def test_a_large_gangs_workload_is_built_from_one_pod_per_stage(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    strategy = {"type": "hybrid", "pipelineParallel": 4}
    training = {"steps": 10, "globalBatchSize": 2048, "microBatchSize": 1}
    resources = {"numNodes": 256, "numProcPerNode": 8}
    spec = make_job(resources=resources, strategy=strategy, training=training)["spec"]
    ev = evaluate(spec, "big")
    assert ev.plan is not None and ev.plan.num_nodes == 256, ev.error
    built: list[int] = []

    def counted(*args: Any, **kwargs: Any) -> dict[str, Any]:
        built.append(args[3])
        return build_pod(*args, **kwargs)

    monkeypatch.setattr(kueue_link, "build_pod", counted)
    kube = WorkloadKube()
    job = JobRef("big", "ns", "uid-1")
    asyncio.run(kueue_link.create_workload(kube, KueueLink(), job, ev, QueueRef("q")))  # type: ignore[arg-type]
    (workload,) = kube.created
    sets = workload["spec"]["podSets"]
    assert [s["count"] for s in sets] == [64, 64, 64, 64]
    assert built == [0, 64, 128, 192]  # four pods built, not 256


def test_a_failed_pod_delete_is_raised_once_every_delete_has_ended(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Deleting a gang, one delete refused and one slow: the error comes once every delete has
    its answer (none left running unheard), the second failure is logged."""
    ended: list[str] = []

    async def handler(request: web.Request) -> web.Response:
        name = request.path.rsplit("/", 1)[-1]
        if name == "p-slow":
            await asyncio.sleep(0.3)
        ended.append(name)
        if name.startswith("p-bad"):
            return web.json_response({"kind": "Status", "message": "etcd down"}, status=500)
        return web.json_response({"kind": "Status", "status": "Success"})

    async def scenario() -> None:
        async with serving(handler) as port:
            config = kubeconfig(tmp_path, {"token": "t"}, f"http://127.0.0.1:{port}")
            rest = Rest(Login(str(config)), ApiTimeout.of(5))
            names = ["p-bad", "p-slow", "p-bad2", "p-ok"]
            try:
                with pytest.raises(ApiError, match="etcd down"):
                    await Kube(rest).delete_pods("ns", names, False, {n: f"uid-{n}" for n in names})
                assert sorted(ended) == sorted(names), "a delete was still running"
            finally:
                await rest.close()

    asyncio.run(scenario())
    assert any("pod ns/p-bad2 not deleted" in r.getMessage() for r in caplog.records)
