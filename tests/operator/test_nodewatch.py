"""The operator's node watch on the real API server: a listing in pages, a node's readiness as it
flips (and since when), its labels, its deletion; heartbeats reach no job."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime

import pytest
from meshrun_operator.client.errors import ApiTimeout
from meshrun_operator.client.login import Login
from meshrun_operator.client.rest import Rest
from meshrun_operator.seen import nodes
from meshrun_operator.seen.nodes import NodeInfo, NodeWatch
from operator_harness import Kubectl
from waiting import until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]

RACK = "topology.meshrun.dev/rack"


def ready_patch(ready: bool, transition: str) -> str:
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    condition = {
        "type": "Ready",
        "status": "True" if ready else "False",
        "reason": "Test",
        "lastHeartbeatTime": now,
        "lastTransitionTime": transition,
    }
    return json.dumps({"status": {"conditions": [condition]}})


def test_the_node_watch_follows_readiness_labels_and_deletion(
    kubeconfig: str, kubectl: Kubectl, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(nodes, "PAGE", 2)  # the listing comes in several pages
    name = f"watched-{uuid.uuid4().hex[:8]}"
    # A node no kubelet (and no KWOK controller) keeps: only this test changes its status.
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {RACK: "rack-7"}},
        "spec": {"taints": [{"key": "meshrun.dev/test", "effect": "NoSchedule"}]},
    }
    kubectl("apply", "-f", "-", input=json.dumps(node))
    status = ("--subresource=status", "--type=merge", "-p")
    kubectl("patch", "node", name, *status, ready_patch(True, "2026-01-01T00:00:00Z"))
    listed = kubectl("get", "nodes", "-o", "name").stdout.split()

    async def scenario() -> None:
        # The jobs are told of any node's change, and tests beside this one add and remove
        # nodes of their own: only the changes that concern this test's node count here.
        concerned: list[str] = []
        changes: list[float] = []
        rest = Rest(Login(kubeconfig), ApiTimeout.of(10))
        watch = NodeWatch(rest, lambda: changes.extend([1.0] * (name in concerned)))
        apply = watch._apply

        def noting(changed: Mapping[str, NodeInfo], gone: list[str]) -> None:
            concerned[:] = [*changed, *gone]
            apply(changed, gone)

        watch._apply = noting  # type: ignore[method-assign]
        watch.start()
        try:
            await asyncio.wait_for(watch.listed.wait(), 30)
            # Every node, though listed two at a time; the labels and readiness of each. Tests
            # beside this one delete nodes of their own meanwhile: those listed before and
            # after the watch's listing are the ones it must hold (no await in between, so
            # the watch has not yet applied a deletion after the second listing).
            still = set(kubectl("get", "nodes", "-o", "name").stdout.split())
            assert {f"node/{n}" for n in watch.nodes} >= set(listed) & still
            assert watch.labels.get(name) == ({RACK: "rack-7"} | watch.nodes[name].labels,)
            assert watch.labels.get("no-such-node") == ()
            assert name in watch and watch[name][0].ready and "no-such-node" not in watch
            # A heartbeat alone changes nothing the operator keeps: no job is told.
            kubectl("patch", "node", name, *status, ready_patch(True, "2026-01-01T00:00:00Z"))
            await asyncio.sleep(1)
            assert changes == []
            # Readiness flips: the jobs are told, and the view has the time it flipped.
            kubectl("patch", "node", name, *status, ready_patch(False, "2026-02-03T04:05:06Z"))
            await until(
                lambda: not watch[name][0].ready, "the node NotReady", seconds=30, interval=0.1
            )
            assert watch[name][0].since == datetime(2026, 2, 3, 4, 5, 6, tzinfo=UTC)
            assert changes == [1.0]
            # A new label is kept (a rack is a domain of placement).
            kubectl("label", "node", name, f"{RACK}=rack-8", "--overwrite")
            await until(
                lambda: watch.labels.get(name)[0][RACK] == "rack-8",
                "the new rack",
                seconds=30,
                interval=0.1,
            )
            # Deleted: gone (counted as deleted by the jobs), and the jobs are told.
            kubectl("delete", "node", name, "--wait=true")
            await until(lambda: name not in watch, "the node gone", seconds=30, interval=0.1)
            assert changes == [1.0, 1.0]
        finally:
            watch.stop()
            await rest.close()
            kubectl("delete", "node", name, "--ignore-not-found", "--wait=false")

    asyncio.run(scenario())
