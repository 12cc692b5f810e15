"""kopf wiring: indexes of pods and nodes, the create/resume handlers, and the resync loop.

Deadlines, backoff and gang timeouts need a job to be looked at again even when nothing
changes. kopf's timers would do that, but every timer makes kopf put a finalizer on the job, and a
job with a finalizer cannot be deleted while the operator is down (nor can its namespace). So the
operator runs one resync loop of its own instead: it reconciles a job at once when the job or one
of its pods changes (watch events), and every job every ``--resync-seconds``. Children are owned
by the job, so the garbage collector, not a finalizer, cleans up after a deletion.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from typing import Any

import kopf

from meshrun_operator import metrics, names
from meshrun_operator.observe import PodView, node_ready, pod_view
from meshrun_operator.reconcile import OperatorContext, plain, reconcile

logger = logging.getLogger("meshrun.operator")


class Resyncer:
    """The operator's own resync loop over every known job."""

    def __init__(self, ctx: OperatorContext, concurrency: int = 32) -> None:
        self.ctx = ctx
        self.jobs: dict[str, dict[str, Any]] = {}
        self.dirty: set[str] = set()
        self.wake = asyncio.Event()
        self.limit = asyncio.Semaphore(concurrency)
        self.pods_index: Any = None
        self.nodes_index: Any = None
        self.task: asyncio.Task[None] | None = None
        self.node_ready: dict[str, bool] = {}
        self.last_pass = time.monotonic()

    def learn_indexes(self, kwargs: Mapping[str, Any]) -> None:
        """kopf hands indexes only to handlers; the (live) index objects are kept from there."""
        self.pods_index = kwargs.get("meshrun_pods", self.pods_index)
        self.nodes_index = kwargs.get("meshrun_nodes", self.nodes_index)

    def poke(self, uid: str | None) -> None:
        """Reconcile ``uid`` soon; starts the loop on first use.

        The loop is created from a handler so that it inherits kopf's context (kopf.event
        needs the operator's settings from it).
        """
        if uid:
            self.dirty.add(uid)
            self.wake.set()
        if self.task is None:
            self.task = asyncio.create_task(self.run(), name="meshrun-resync")

    def forget(self, uid: str) -> None:
        self.jobs.pop(uid, None)
        self.dirty.discard(uid)
        self.ctx.phases.set(uid, None)
        self.ctx.locks.pop(uid, None)
        self.ctx.latest.pop(uid, None)

    async def run(self) -> None:
        last_full = 0.0
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), timeout=self.ctx.resync_seconds)
            self.wake.clear()
            now = time.monotonic()
            if now - last_full >= self.ctx.resync_seconds:
                due, last_full = set(self.jobs), now
            else:
                due = self.dirty & set(self.jobs)
            self.dirty.clear()
            await asyncio.gather(*(self.one(uid) for uid in due))
            self.last_pass = time.monotonic()

    async def one(self, uid: str) -> None:
        body = self.jobs.get(uid)
        if body is None or self.pods_index is None:
            return
        async with self.limit:
            try:
                await reconcile(self.ctx, body, self.pods_index, self.nodes_index)
            except kopf.TemporaryError as waiting:
                logger.debug("job %s: %s", uid, waiting)
            except Exception as error:  # one job's trouble must not stop the loop
                metrics.RECONCILE_ERRORS.labels(kind=type(error).__name__).inc()
                logger.exception("reconcile of job %s failed; retrying at the next resync", uid)


def register(registry: kopf.OperatorRegistry, ctx: OperatorContext) -> Resyncer:
    """Register the indexes and handlers on ``registry`` (an explicit one, not kopf's global)."""
    resyncer = Resyncer(ctx)

    @kopf.on.probe(id="resync", registry=registry)
    def resync_alive(**_: Any) -> float:
        """/healthz fails when the resync loop died: the operator would silently stop acting."""
        task = resyncer.task
        if task is not None and task.done():
            why = "cancelled" if task.cancelled() else repr(task.exception())
            raise RuntimeError(f"the resync loop ended: {why}")
        return round(time.monotonic() - resyncer.last_pass, 1)

    @kopf.on.login(id="login", registry=registry)
    def login(**kwargs: Any) -> Any:
        return kopf.login_via_client(**kwargs)

    @kopf.index(
        "v1", "pods", id="meshrun_pods", labels={names.LABEL_JOB: kopf.PRESENT}, registry=registry
    )
    def meshrun_pods(**kwargs: Any) -> dict[tuple[str, str], PodView]:
        key = (str(kwargs["namespace"]), str(kwargs["labels"][names.LABEL_JOB]))
        return {key: pod_view(plain(kwargs["body"]))}

    if ctx.watch_nodes:

        @kopf.index("v1", "nodes", id="meshrun_nodes", registry=registry)
        def meshrun_nodes(**kwargs: Any) -> dict[str, bool]:
            return {str(kwargs["name"]): node_ready(plain(kwargs["body"]))}

        @kopf.on.event("v1", "nodes", id="node-changed", registry=registry)
        async def node_changed(**kwargs: Any) -> None:
            # Heartbeats modify every node every few seconds; only a change of readiness (or a
            # deletion) concerns the jobs, and then all of them are looked at.
            resyncer.learn_indexes(kwargs)
            name = str(kwargs["name"])
            ready = None if kwargs["type"] == "DELETED" else node_ready(plain(kwargs["body"]))
            if resyncer.node_ready.get(name, ready) != ready:
                resyncer.dirty.update(resyncer.jobs)
                resyncer.wake.set()
            if ready is None:
                resyncer.node_ready.pop(name, None)
            else:
                resyncer.node_ready[name] = ready

    @kopf.on.event(
        "v1", "pods", id="pod-changed", labels={names.LABEL_JOB: kopf.PRESENT}, registry=registry
    )
    async def pod_changed(**kwargs: Any) -> None:
        resyncer.learn_indexes(kwargs)
        owners = kwargs["body"].get("metadata", {}).get("ownerReferences") or []
        resyncer.poke(next((o.get("uid") for o in owners if o.get("controller")), None))

    @kopf.on.event(names.GROUP, names.VERSION, names.PLURAL, id="job-changed", registry=registry)
    async def job_changed(**kwargs: Any) -> None:
        resyncer.learn_indexes(kwargs)
        uid = str(kwargs["uid"])
        if kwargs["type"] == "DELETED" or kwargs["body"].get("metadata", {}).get(
            "deletionTimestamp"
        ):
            resyncer.forget(uid)
            return
        resyncer.jobs[uid] = plain(kwargs["body"])
        resyncer.poke(uid)

    @kopf.on.create(names.GROUP, names.VERSION, names.PLURAL, id="reconcile", registry=registry)
    @kopf.on.resume(names.GROUP, names.VERSION, names.PLURAL, id="reconcile", registry=registry)
    async def on_create(**kwargs: Any) -> None:
        resyncer.learn_indexes(kwargs)
        decision = await reconcile(
            ctx, plain(kwargs["body"]), kwargs["meshrun_pods"], resyncer.nodes_index
        )
        if decision.invalid:
            raise kopf.PermanentError(str(decision.state.get("message")))

    return resyncer
