"""Leader election without a split-brain window, in process: a standby counts the lease from
when its read returned; a write that waited (for a login, for a connection) while the lease
ran out is never sent; the lease loop survives any failure of its own."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from meshrun_operator.background import Stalled
from meshrun_operator.client.errors import NO_ANSWER, ApiTimeout, NotLeader
from meshrun_operator.client.kube import Kube
from meshrun_operator.client.login import Login
from meshrun_operator.client.rest import Rest
from meshrun_operator.runtime.leader import Elector, LeaseRef, LeaseTiming
from test_login import credential_program, kubeconfig, runs, serving

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


class MemoryLeases:
    """The three Lease calls over a dict, with the API server's optimistic concurrency; a read
    may be held (``hold``) between being sent and being answered, the way a slow API server
    answers a GET with the record as it is when the GET is served, not when it was sent."""

    def __init__(self) -> None:
        self.record: dict[str, Any] | None = None
        self.version = 0
        self.hold: dict[str, asyncio.Event] = {}
        """Reads by a candidate (identity) wait for this event, then see the record."""
        self.failures: list[BaseException] = []
        """Raised by the next reads, one each."""
        self.reader = ""

    async def read(self, namespace: str, name: str) -> dict[str, Any] | None:
        if self.failures:
            raise self.failures.pop(0)
        gate = self.hold.pop(self.reader, None)
        if gate is not None:
            await gate.wait()
        if self.record is None:
            return None
        return {"metadata": {"resourceVersion": str(self.version)}, "spec": dict(self.record)}

    async def create(self, namespace: str, name: str, spec: dict[str, Any]) -> bool:
        if self.record is not None:
            return False
        self.record, self.version = dict(spec), self.version + 1
        return True

    async def replace(self, namespace: str, name: str, version: str, spec: dict[str, Any]) -> bool:
        if str(self.version) != version:
            return False
        self.record, self.version = dict(spec), self.version + 1
        return True


def candidate(leases: MemoryLeases, name: str, timing: LeaseTiming) -> Elector:
    return Elector(leases, LeaseRef("lease", "ns", name), timing)  # type: ignore[arg-type]


async def attempt(leases: MemoryLeases, elector: Elector) -> None:
    leases.reader = elector.lease.identity
    await elector._try_acquire_or_renew()


def test_a_standby_counts_the_lease_from_when_its_read_returned() -> None:
    """B's read is sent, then A renews, then the API server serves B's read (A's renewed
    record). Counting from when the read was sent, B would take over while A still acts."""
    timing = LeaseTiming(duration=1.0, renew_deadline=0.8, retry=0.05)
    leases = MemoryLeases()
    a, b = candidate(leases, "a", timing), candidate(leases, "b", timing)

    async def scenario() -> None:
        await attempt(leases, a)
        assert a.leading()
        await attempt(leases, b)  # B sees A's first record
        served = asyncio.Event()
        leases.hold["b"] = served
        slow_read = asyncio.create_task(attempt(leases, b))
        await asyncio.sleep(0.4)
        await attempt(leases, a)  # A renews (and is then frozen: it never renews again)
        served.set()
        await slow_read
        a_ends = time.monotonic() + a.write_seconds()
        while not b.leading():
            await attempt(leases, b)
            await asyncio.sleep(0.01)
        took_over = time.monotonic()
        assert not a.leading(), "both lead"
        assert took_over >= a_ends, f"B took over {a_ends - took_over:.2f} s before A stopped"

    asyncio.run(scenario())


@asynccontextmanager
async def api_server(seen: list[str], hold_seconds: float) -> AsyncIterator[int]:
    """A server whose GETs take ``hold_seconds``; every request is recorded when it arrives."""

    async def handler(request: web.Request) -> web.Response:
        seen.append(request.method)
        if request.method == "GET":
            await asyncio.sleep(hold_seconds)
        return web.json_response({"kind": "Pod", "metadata": {"name": "p"}})

    async with serving(handler) as port:
        yield port


POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ns"}}


@pytest.mark.parametrize("bound", ["the check once connected", "the deadline"])
def test_a_write_that_waited_for_a_connection_past_the_lease_is_never_sent(
    tmp_path: Path, bound: str
) -> None:
    timing = LeaseTiming(duration=2.0, renew_deadline=0.8, retry=0.1)
    leases = MemoryLeases()
    leader = candidate(leases, "a", timing)
    seen: list[str] = []

    async def scenario() -> None:
        # the GET holds the only connection past the renew deadline
        async with api_server(seen, hold_seconds=2 * timing.renew_deadline) as port:
            config = kubeconfig(tmp_path, {"token": "t"}, f"http://127.0.0.1:{port}")
            kube = Kube(Rest(Login(str(config)), ApiTimeout.of(5), connections=1))
            kube.may_write = leader.leading
            if bound == "the deadline":
                kube.write_seconds = leader.write_seconds
            # leads, then freezes (no renewal follows): taken last, so that setting up the
            # server and client on a loaded machine does not spend its lead
            await attempt(leases, leader)
            try:
                busy = asyncio.create_task(kube.call("get", "pods", "GET", "/api/v1/pods"))
                await asyncio.sleep(0.05)  # the GET holds the only connection
                assert leader.leading()
                with pytest.raises((NotLeader, *NO_ANSWER)):
                    await kube.create(POD)  # allowed when asked, waits for the connection
                await busy
            finally:
                await kube.rest.close()
        assert seen == ["GET"], f"the old leader sent {seen[1:]}"
        assert not leader.leading()

    asyncio.run(scenario())


def test_a_write_that_waited_for_a_login_past_the_lease_is_never_sent(tmp_path: Path) -> None:
    timing = LeaseTiming(duration=1.0, renew_deadline=0.3, retry=0.1)
    leases = MemoryLeases()
    leader = candidate(leases, "a", timing)
    seen: list[str] = []
    (tmp_path / "token").write_text("slow")

    async def scenario() -> None:
        await attempt(leases, leader)
        async with api_server(seen, hold_seconds=0) as port:
            program = credential_program(tmp_path, seconds=0.8)  # longer than the lease lasts
            config = kubeconfig(tmp_path, program, f"http://127.0.0.1:{port}")
            kube = Kube(Rest(Login(str(config)), ApiTimeout.of(5)))
            kube.may_write = leader.leading
            try:
                with pytest.raises(NotLeader, match="while it waited"):
                    await kube.create(POD)
            finally:
                await kube.rest.close()
        assert runs(tmp_path) == 1 and seen == []

    asyncio.run(scenario())


def test_the_lease_loop_survives_any_failure_and_healthz_reports_a_stalled_one() -> None:
    timing = LeaseTiming(duration=1.0, renew_deadline=0.5, retry=0.02)
    leases = MemoryLeases()
    leases.failures = [KeyError("spec"), asyncio.CancelledError(), TypeError("a bug")]
    elector = candidate(leases, "a", timing)
    leases.reader = "a"
    elector.liveness.deadline = 0.5
    changes: list[bool] = []

    async def scenario() -> None:
        task = asyncio.create_task(elector.run(changes.append))
        elector.liveness.task = task
        deadline = time.monotonic() + 10
        while not elector.leading() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert elector.leading() and changes == [True] and not task.done()
        assert leases.failures == [] and elector.liveness.check()["failures"] == 0

        frozen = asyncio.Event()  # the API server stops answering the Lease reads
        leases.hold["a"] = frozen
        await asyncio.sleep(0.7)
        with pytest.raises(Stalled, match="lease loop made no progress"):
            elector.liveness.check()
        assert not elector.leading()
        frozen.set()
        await asyncio.sleep(0.2)
        assert elector.leading() and elector.liveness.check()["failures"] == 0

        task.cancel()  # shutting down is the one thing that ends it
        with pytest.raises(asyncio.CancelledError):
            await task
        with pytest.raises(Stalled, match="lease loop ended: cancelled"):
            elector.liveness.check()

    asyncio.run(scenario())
