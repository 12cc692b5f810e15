"""/healthz and kopf's watch streams: a watcher that ended makes it fail, one kopf cancelled
does not. The watchers are kopf's own, run against a real HTTP server."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import kopf
import pytest
from aiohttp import web
from kopf._cogs.aiokits import aiotoggles
from kopf._cogs.clients import auth
from kopf._cogs.structs import credentials, references
from kopf._core.reactor import orchestration
from meshrun_operator.background import Stalled
from meshrun_operator.runtime.watchers import Watchers
from test_login import serving

from meshrun.api.crd import GROUP, PLURAL, VERSION

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

JOBS = references.Resource(GROUP, VERSION, PLURAL, namespaced=True)
PODS = references.Resource("", "v1", "pods", namespaced=True)

DEEP = 3000
"""Levels of a pod template nested deeper than Python's JSON decoder goes (about 1,000)."""


def listing(plural: str) -> str:
    """A list of one object; a job's pod template nested DEEP levels."""
    template = "[" * DEEP + "]" * DEEP if plural == PLURAL else "{}"
    item = '{"metadata":{"name":"a","namespace":"ns","uid":"u","resourceVersion":"1"},'
    item += f'"spec":{{"podTemplate":{template}}}}}'
    return f'{{"kind":"List","metadata":{{"resourceVersion":"1"}},"items":[{item}]}}'


async def no_processing(**_: Any) -> None:
    return None


def test_healthz_fails_when_a_kopf_watcher_dies_and_not_when_kopf_cancels_one(
    tmp_path: Path,
) -> None:
    quiet = asyncio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        plural = request.path.rstrip("/").rsplit("/", 1)[-1]
        if request.query.get("watch") != "true":
            return web.Response(text=listing(plural), content_type="application/json")
        stream = web.StreamResponse()
        await stream.prepare(request)
        await quiet.wait()  # a watch with nothing to tell
        return stream

    async def scenario() -> None:
        async with serving(handler) as port:
            info = kopf.ConnectionInfo(server=f"http://127.0.0.1:{port}", token="t")
            vault = credentials.Vault({"test": info})
            auth.vault_var.set(vault)
            ensemble = orchestration.Ensemble(
                operator_indexed=aiotoggles.ToggleSet(all),
                operator_paused=aiotoggles.ToggleSet(any),
                peering_missing=aiotoggles.Toggle(),
            )
            watchers = Watchers()
            watchers.install()
            try:
                # The pods' watcher lists and watches; kopf cancels it as its namespace goes.
                await orchestration.spawn_missing_watchers(
                    processor=no_processing,
                    settings=kopf.OperatorSettings(),
                    indexed_resources=set(),
                    watched_resources=[PODS],
                    watched_namespaces=["ns"],
                    ensemble=ensemble,
                )
                await asyncio.sleep(0.2)
                assert watchers.check()["watching"] == ["pods.v1@ns"]
                await orchestration.terminate_redundancies(
                    ensemble=ensemble, remaining_resources=[PODS], remaining_namespaces=[]
                )
                assert watchers.check()["watching"] == []  # cancelled on purpose: healthy

                # The jobs' watcher dies on a listing it cannot decode, as kopf's did on a job
                # whose pod template was nested thousands of levels deep.
                await orchestration.spawn_missing_watchers(
                    processor=no_processing,
                    settings=kopf.OperatorSettings(),
                    indexed_resources=set(),
                    watched_resources=[JOBS],
                    watched_namespaces=[None],
                    ensemble=ensemble,
                )
                dead = next(iter(ensemble.watcher_tasks.values()))
                with contextlib.suppress(RecursionError):
                    await dead
                await asyncio.sleep(0)  # its done callbacks run
                with pytest.raises(Stalled, match=r"watcher for paralleltrainingjobs.* ended"):
                    watchers.check()
                with pytest.raises(Stalled, match="RecursionError"):
                    watchers.check()  # until kopf watches the jobs again
            finally:
                watchers.uninstall()
                quiet.set()
                await orchestration.terminate_redundancies(
                    ensemble=ensemble, remaining_resources=[], remaining_namespaces=[]
                )
                await vault.close()

    asyncio.run(scenario())
