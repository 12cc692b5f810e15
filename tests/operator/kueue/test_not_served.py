"""A cluster that does not serve Kueue's Workloads: the operator names it (condition
KueueNotInstalled), from the API server's own answer, instead of retrying blindly."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import replace

import pytest
from kueue_factories import pipeline_spec
from kueue_support import KueueEnv
from meshrun_operator import kinds
from meshrun_operator.children.owner import JobRef
from meshrun_operator.jobstatus import Reason
from meshrun_operator.kueue import QueueRef
from meshrun_operator.lifecycle.evaluation import evaluate
from meshrun_operator.runtime.kueue_link import KueueHold, KueueLink, create_workload
from operator_door import operator_kube

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]


def test_an_api_server_without_kueues_workloads_is_named(
    kubeconfig: str, kueue_env: KueueEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The API server's own answer for a resource it does not serve (404), which is what a
    # cluster without Kueue gives the Workload create: asked here under a plural Kueue lacks.
    (served,) = kinds.WORKLOAD.served
    unserved = replace(kinds.WORKLOAD, served=(replace(served, plural="nothing"),))
    monkeypatch.setitem(kinds.KINDS, kinds.WORKLOAD.kind, unserved)
    namespace = kueue_env.namespaces["team-a"]
    spec = pipeline_spec(2, 8, 2)
    job = JobRef(name="unserved", namespace=namespace, uid=str(uuid.uuid4()))

    async def create() -> None:
        async with operator_kube(kubeconfig) as kube:
            ev = evaluate(spec, job.name)
            await create_workload(kube, KueueLink(), job, ev, QueueRef("team-a"))

    with pytest.raises(KueueHold) as held:
        asyncio.run(create())
    assert held.value.hold.reason == Reason.KUEUE_NOT_INSTALLED
    assert "does not serve Kueue's kueue.x-k8s.io/v1beta2 Workloads" in held.value.hold.message
