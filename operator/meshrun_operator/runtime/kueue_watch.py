"""kopf wiring for Kueue: the index of the operator's Workloads, and a Workload's change waking
its job. (The nodes' labels, the topology domains status.placement shows, come from the node
watch: nodewatch.py.)

kopf watches only resources the API server serves: on a cluster without Kueue the Workload
index stays empty and nothing waits for it, and kopf starts watching Workloads when Kueue's CRD
appears. The index is handed to the reconciler by a startup handler, like the pod index: kopf
fills it before any job is looked at, so after an operator restart a running job's
Workload is known before its pods are judged.
"""

from __future__ import annotations

from typing import Any

import kopf

from meshrun_operator import kueue, names
from meshrun_operator.plaindata import kept
from meshrun_operator.runtime.handlers import OperatorMemo
from meshrun_operator.seen.views import owning_job

VERSION = kueue.API_VERSION.split("/")[1]


def register(registry: kopf.OperatorRegistry, with_kueue: bool) -> None:
    """Register the Workload index and its handler (``with_kueue``)."""
    mine = {names.LABEL_JOB: kopf.PRESENT}

    if with_kueue:

        @kopf.index(
            kueue.GROUP,
            VERSION,
            kueue.WORKLOAD_PLURAL,
            id="meshrun_workloads",
            labels=mine,
            registry=registry,
        )
        async def meshrun_workloads(
            namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any
        ) -> dict[tuple[str, str], dict[str, Any]]:
            return {(str(namespace), str(labels[names.LABEL_JOB])): kept(body)}

        @kopf.on.event(
            kueue.GROUP,
            VERSION,
            kueue.WORKLOAD_PLURAL,
            id="workload-changed",
            labels=mine,
            registry=registry,
        )
        async def workload_changed(memo: OperatorMemo, body: kopf.Body, **_: Any) -> None:
            # Kueue admitted, queued or evicted it: the job decides again at once.
            memo.resync.poke_owner(owning_job(body.get("metadata") or {}))

    @kopf.on.startup(id="kueue-indexes", registry=registry)
    async def kueue_indexes(memo: OperatorMemo, **kwargs: Any) -> None:
        if memo.ctx.kueue is not None:
            memo.ctx.kueue.index = kwargs.get("meshrun_workloads")
