"""The resync loop: every known job is reconciled when it or its pods change, and periodically.

Deadlines, backoff and gang timeouts need a job to be looked at again even when nothing
changes. kopf's timers would do that, but every timer makes kopf put a finalizer on the job, and a
job with a finalizer cannot be deleted while the operator is down (nor can its namespace). So the
operator runs this loop of its own instead, started by kopf's startup handler with the pod and
node indexes (handlers.py). Children are owned by the job, so the garbage collector, not a
finalizer, cleans up after a deletion.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from meshrun_operator import metrics
from meshrun_operator.actions import StillTerminating
from meshrun_operator.context import OperatorContext
from meshrun_operator.kube import StaleJob
from meshrun_operator.reconcile import reconcile

logger = logging.getLogger("meshrun.operator")


class Resyncer:
    """Reconciles the known jobs: the changed ones at once, all of them every resync period."""

    def __init__(
        self, ctx: OperatorContext, pods_index: Any, nodes_index: Any, concurrency: int = 32
    ) -> None:
        self.ctx = ctx
        self.pods_index = pods_index
        """kopf's index of the jobs' pods (live: kopf keeps it current)."""
        self.nodes_index = nodes_index
        """kopf's index of node readiness, or None when nodes are not watched."""
        self.jobs: dict[str, dict[str, Any]] = {}
        """The latest body of every job, by uid."""
        self.dirty: set[str] = set()
        """Jobs to reconcile at the next wake-up."""
        self.wake = asyncio.Event()
        self.limit = asyncio.Semaphore(concurrency)
        self.node_ready: dict[str, bool] = {}
        """Last readiness seen per node: only a change concerns the jobs."""
        self.last_pass = time.monotonic()

    def poke(self, uid: str | None) -> None:
        """Reconcile ``uid`` soon."""
        if uid:
            self.dirty.add(uid)
            self.wake.set()

    def poke_all(self) -> None:
        """Reconcile every job soon."""
        self.dirty.update(self.jobs)
        self.wake.set()

    def forget(self, uid: str) -> None:
        self.jobs.pop(uid, None)
        self.dirty.discard(uid)
        self.ctx.forget(uid)

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
        if body is None:
            return
        async with self.limit:
            try:
                await reconcile(self.ctx, body, self.pods_index, self.nodes_index)
            except StaleJob as stale:
                # The watch brings the newer job, which pokes it again: decided then.
                logger.debug("job %s: %s", uid, stale)
            except StillTerminating as waiting:
                logger.debug("job %s: %s", uid, waiting)
            except Exception as error:  # one job's trouble must not stop the loop
                metrics.RECONCILE_ERRORS.labels(kind=type(error).__name__).inc()
                logger.exception("reconcile of job %s failed; retrying at the next resync", uid)
