"""The resync loop: every known job is reconciled when it or its pods change, and periodically.

Deadlines, backoff and gang timeouts need a job to be looked at again even when nothing
changes. kopf's timers would do that, but every timer makes kopf put a finalizer on the job, and a
job with a finalizer cannot be deleted while the operator is down (nor can its namespace). So the
operator runs this loop of its own instead, started by kopf's startup handler with the pod and
node indexes (handlers.py). Children are owned by the job, so the garbage collector, not a
finalizer, cleans up after a deletion.

Each reconcile runs as a task of its own: the loop never waits for one, so a job whose reconcile
is slow (a trainer's /progress that dribbles, an API call that waits for its timeout) delays
only itself. A job changing while its reconcile runs is reconciled again once that one ends.

A job that ended (Succeeded or Failed) is left out of the periodic pass: nothing about it
changes with time but its TTL, so it is looked at (and its spec read and planned) only when it
or its pods change, when its TTL runs out, or again after a reconcile of it failed or while a
delete of its pods is unconfirmed (sent to an API server that did not answer).

A job the API server says is gone (404 for the job itself), or whose namespace is being deleted
or gone (NamespaceGone), is dropped at once from every index, the gauge and this loop, with every
other job of that namespace: a watch that never delivers their deletion (a namespace deleted
with its jobs) no longer keeps them reconciled, counted and posting Events forever. A late
event of a dropped job does not bring it back.

A reconcile whose acts met an answer the next pass decides on (Requeue: a refused create, a
rejected pod, a Kueue hold) is run again within ``batch_seconds``, not counted as a failure.

A job whose reconcile fails is tried again after a delay of its own that doubles with each
failure in a row (``--error-backoff-base-seconds`` to ``--error-backoff-max-seconds``, and no
sooner than the API server's Retry-After), as a controller's rate-limited work queue does; a new
spec is acted on at once. The first failure is logged with its traceback, the same failure again
in one line; a success starts over.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from meshrun.api.crd import GROUP, PLURAL
from meshrun_operator import metrics
from meshrun_operator.background import Liveness
from meshrun_operator.client.errors import NO_ANSWER, ApiError, NamespaceGone, NotLeader
from meshrun_operator.client.kube import StaleJob
from meshrun_operator.clock import parse_time
from meshrun_operator.jobstatus import Phase
from meshrun_operator.plaindata import kept
from meshrun_operator.runtime.actions import StillTerminating
from meshrun_operator.runtime.context import OperatorContext
from meshrun_operator.runtime.reconcile import Requeue, reconcile

logger = logging.getLogger("meshrun.operator")

STALLED_SHOWN = 10
"""Stalled jobs /healthz names (it counts them all)."""

DROPPED_SECONDS = 600.0
"""How long a job dropped as gone is not taken back from a late watch event."""


@dataclass(frozen=True)
class Failing:
    """A job whose reconciles fail: how often in a row, what the last one said, when next."""

    failures: int
    """Failed reconciles in a row."""
    said: str
    """The last failure as logged (its type and words): another one is logged in full."""
    retry_at: float
    """When the job is reconciled again at the earliest (monotonic), unless its spec changes."""


class Resyncer:
    """Reconciles the known jobs: the changed ones at once, all of them every resync period."""

    def __init__(
        self,
        ctx: OperatorContext,
        pods_index: Any,
        nodes_index: Any,
        concurrency: int = 32,
        leading: Callable[[], bool] = lambda: True,
        batch_seconds: float = 0.25,
        stall_seconds: float = 300.0,
    ) -> None:
        self.ctx = ctx
        self.pods_index = pods_index
        """kopf's index of the jobs' pods (live: kopf keeps it current)."""
        self.nodes_index = nodes_index
        """The node watch (nodewatch.NodeWatch, read like kopf's index of node readiness), or
        None when nodes are not watched."""
        self.leading = leading
        """True while this operator may act (always, without leader election)."""
        self.jobs: dict[str, dict[str, Any]] = {}
        """The latest body of every job, by uid."""
        self.dirty: set[str] = set()
        """Jobs to reconcile at the next wake-up."""
        self.urgent: set[str] = set()
        """Jobs new or with a new spec since the last wake-up: reconciled even while they back
        off."""
        self.batched: dict[str, float] = {}
        """Jobs to reconcile at a time of their own (monotonic), changes batched until then."""
        self.batch_seconds = batch_seconds
        self.running: dict[str, asyncio.Task[None]] = {}
        """The reconcile in flight of each job that has one."""
        self.waiting_since: dict[str, float] = {}
        """When each job became due for a reconcile that has not completed yet (monotonic)."""
        self.failing: dict[str, Failing] = {}
        """Jobs whose last reconcile raised, by uid: retried after their backoff, even if
        ended."""
        self.dropped: dict[str, float] = {}
        """Jobs dropped because the API server said they or their namespace are gone, by uid:
        when (monotonic). Their watch events are ignored for DROPPED_SECONDS."""
        self.wake = asyncio.Event()
        self.limit = asyncio.Semaphore(concurrency)
        self.last_pass = time.monotonic()
        """When the last pass completed (monotonic)."""
        self._last_full = 0.0
        self.liveness = Liveness("resync loop", stall_seconds)
        """Progress: a completed pass (its deadline: /healthz's ``stall_seconds``)."""

    def poke(self, uid: str | None, batch: bool = False) -> None:
        """Reconcile ``uid`` now, or with ``batch`` within ``batch_seconds``: a launch's pods
        change many times a second, and one reconcile then handles all of it."""
        if not uid:
            return
        if batch:
            self.batched.setdefault(uid, time.monotonic() + self.batch_seconds)
        else:
            self.dirty.add(uid)
            self.urgent.add(uid)
        self.wake.set()

    def poke_owner(self, owner: tuple[str, str, str] | None, batch: bool = False) -> None:
        """Reconcile the job that controls a child, ``owner`` being (namespace, job name, uid)
        from the child (``views.owning_job``), only when the job of that uid has that namespace
        and name: a child's ownerReference is whatever its maker wrote."""
        if owner is None:
            return
        namespace, name, uid = owner
        meta = (self.jobs.get(uid) or {}).get("metadata") or {}
        if (meta.get("namespace"), meta.get("name")) == (namespace, name):
            self.poke(uid, batch)

    def poke_all(self) -> None:
        """Reconcile every job soon."""
        self.dirty.update(self.jobs)
        self.wake.set()

    def job_changed(self, uid: str, body: Mapping[str, Any], deleted: bool) -> None:
        """A watch event of a job: keep its body and reconcile it (a new job or a new spec at
        once, anything else with its pods' batch); forget it when ``deleted``."""
        meta = body.get("metadata") or {}
        if deleted or meta.get("deletionTimestamp"):
            self.forget(uid)
            self.dropped.pop(uid, None)  # no event follows its deletion
            return
        if uid in self.dropped:
            if time.monotonic() - self.dropped[uid] < DROPPED_SECONDS:
                return  # the API server said it is gone; this event is older news
            del self.dropped[uid]
        known = self.jobs.get(uid)
        self.jobs[uid] = kept(body)
        # A new job or a new spec is acted on at once; the echo of the operator's own status
        # write (or any other change of status or metadata) joins the batch of its pods.
        same = known is not None and known["metadata"].get("generation") == meta.get("generation")
        self.poke(uid, batch=same)

    def drop(self, uid: str) -> None:
        """Forget a job the API server said is gone, and ignore its late watch events."""
        self.forget(uid)
        now = time.monotonic()
        for old in [u for u, at in self.dropped.items() if now - at >= DROPPED_SECONDS]:
            del self.dropped[old]
        self.dropped[uid] = now

    def drop_namespace(self, namespace: str) -> list[str]:
        """Drop every job of a namespace being deleted or gone; their uids."""
        uids = [u for u, job in self.jobs.items() if job["metadata"].get("namespace") == namespace]
        for uid in uids:
            self.drop(uid)
        return uids

    def forget(self, uid: str) -> None:
        """Drop everything kept about a job: its body, its place in this loop, its per-job
        memory and its count in the gauge (a reconcile in flight ends on its own)."""
        self.jobs.pop(uid, None)
        self.dirty.discard(uid)
        self.batched.pop(uid, None)
        self.waiting_since.pop(uid, None)
        self.failing.pop(uid, None)
        self.urgent.discard(uid)
        self.ctx.forget(uid)

    def leadership_changed(self, leading: bool) -> None:
        """Leader: look at every job at once. Standby: stop whatever is in flight. Either way
        the statuses the other operator writes meanwhile are its own, not someone else's."""
        self.ctx.statuses.clear()
        if leading:
            self.poke_all()
        else:
            self.stop_all()
            self.wake.set()

    def stop_all(self) -> None:
        """Cancel every reconcile in flight (leadership lost, or shutting down)."""
        for task in self.running.values():
            task.cancel()
        self.waiting_since.clear()

    async def run(self) -> None:
        """Pass after pass until cancelled; a pass that fails is logged and the loop goes on
        after a backoff (background.py)."""
        listed = getattr(self.nodes_index, "listed", None)
        if listed is not None:
            # Until the nodes are listed, every pod's node would look deleted.
            await listed.wait()
        try:
            while True:
                try:
                    await self._pass()
                except (Exception, asyncio.CancelledError) as error:
                    await self.liveness.failed(error)
                else:
                    self.last_pass = time.monotonic()
                    self.liveness.progressed()
        finally:
            self.stop_all()

    async def _pass(self) -> None:
        """Wait for a change or the next periodic pass, then start the due reconciles."""
        now = time.monotonic()
        wait = self._last_full + self.ctx.resync_seconds - now
        if self.batched:
            wait = min(wait, min(self.batched.values()) - now)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.wake.wait(), timeout=max(wait, 0.0))
        self.wake.clear()
        now = time.monotonic()
        if not self.leading():
            self.dirty.clear()
            self.batched.clear()
            self.stop_all()
            return
        ripe = [uid for uid, at in self.batched.items() if at <= now]
        for uid in ripe:
            del self.batched[uid]
        self.dirty.update(ripe)
        if now - self._last_full >= self.ctx.resync_seconds:
            wall = datetime.now(UTC)
            periodic = {uid for uid, body in self.jobs.items() if self._periodic(uid, body, wall)}
            due, self._last_full = periodic | (self.dirty & set(self.jobs)), now
            for uid in periodic:
                self.batched.pop(uid, None)
        else:
            due = self.dirty & set(self.jobs)
        self.dirty.clear()
        urgent, self.urgent = self.urgent, set()
        for uid in due - urgent:
            failing = self.failing.get(uid)
            if failing is not None and failing.retry_at > now:
                # Backing off: looked at again when its delay is over, not at every pass.
                due.discard(uid)
                self.batched[uid] = failing.retry_at
        for uid in due:
            self.waiting_since.setdefault(uid, now)
            if uid in self.running:
                self.dirty.add(uid)  # once the running one ends (see _done)
            else:
                self._start(uid)

    def _periodic(self, uid: str, body: dict[str, Any], now: datetime) -> bool:
        """Whether the periodic pass looks at the job: not when it ended, unless its TTL ran
        out, its last reconcile failed, a decided status waits to be written or a create or
        delete of its is unconfirmed."""
        status = body.get("status") or {}
        if status.get("phase") not in (Phase.SUCCEEDED, Phase.FAILED) or uid in self.failing:
            return True
        if uid in self.ctx.deferred:
            return True  # a decided status still waits to be written
        if self.ctx.expectations.pending(uid):
            return True  # a delete (or create) that got no answer is confirmed or sent again
        policy = (body.get("spec") or {}).get("runPolicy") or {}
        ttl = policy.get("ttlSecondsAfterFinished")
        if not isinstance(ttl, int):
            return False
        done = parse_time(status.get("completionTime"))
        return done is None or now >= done + timedelta(seconds=ttl)

    def _start(self, uid: str) -> None:
        task = asyncio.create_task(self.one(uid), name=f"reconcile {uid}")
        self.running[uid] = task

        def done(_: asyncio.Task[None]) -> None:
            self._done(uid)

        task.add_done_callback(done)

    def _done(self, uid: str) -> None:
        self.running.pop(uid, None)
        if uid in self.dirty:
            self.wake.set()

    async def one(self, uid: str) -> None:
        body = self.jobs.get(uid)
        if body is None:
            return
        async with self.limit:
            try:
                await self._reconcile(uid, body)
            except StaleJob as stale:
                # The watch brings the newer job, which pokes it again: decided then.
                logger.debug("job %s: %s", uid, stale)
            except StillTerminating as waiting:
                logger.debug("job %s: %s", uid, waiting)
            except Requeue as met:
                # The next pass decides on what the acts met (nothing was written): soon, with
                # whatever the watch brings meanwhile.
                logger.debug("job %s: requeued: %s", uid, met)
                self.poke(uid, batch=True)
            except NotLeader as standby:
                # Leadership was lost mid-reconcile: the new leader carries on.
                logger.info("job %s: %s", uid, standby)
            except NamespaceGone as gone:
                dropped = self.drop_namespace(gone.namespace)
                logger.info("%s: its %d job(s) forgotten", gone, len(dropped))
            except ApiError as error:
                if not job_is_gone(error):
                    self._failed(uid, error, error.retry_after)
                else:
                    # Deleted: its watch event may never come (a namespace deleted with it).
                    logger.info("job %s is gone: forgotten", self._named(uid))
                    self.drop(uid)
            except NO_ANSWER as error:
                # The API server did not answer in time: not completed, still waiting.
                self._failed(uid, error, traceback=False)
                return
            except Exception as error:  # one job's trouble must not stop the loop
                self._failed(uid, error)
            else:
                self._succeeded(uid)
        # Completed, or refused by an answer of the API server (restarting would not help).
        self.waiting_since.pop(uid, None)

    async def _reconcile(self, uid: str, body: Mapping[str, Any]) -> None:
        """One reconcile; a job forgotten meanwhile (deleted, dropped) leaves nothing behind of
        what the reconcile kept about it (its phase in the gauge, its last write)."""
        try:
            await reconcile(self.ctx, body, self.pods_index, self.nodes_index)
        finally:
            if uid not in self.jobs:
                self.ctx.forget(uid)

    def _failed(
        self,
        uid: str,
        error: BaseException,
        retry_after: float | None = None,
        traceback: bool = True,
    ) -> None:
        """Count the failure and set the job's backoff (no shorter than ``retry_after``); a
        failure other than the last one is logged in full (with its ``traceback``), the same
        one again in a line."""
        metrics.RECONCILE_ERRORS.labels(kind=type(error).__name__).inc()
        before = self.failing.get(uid)
        failures = before.failures + 1 if before is not None else 1
        delay = max(self.ctx.timing.error_backoff(failures), retry_after or 0.0)
        said = f"{type(error).__name__}: {error}"
        self.failing[uid] = Failing(failures, said, time.monotonic() + delay)
        job = self._named(uid)
        if before is not None and before.said == said:
            logger.warning(
                "reconcile of job %s failed again (%d in a row, the same error); retrying in "
                "%.3g s",
                job,
                failures,
                delay,
            )
            return
        level = logging.ERROR if traceback else logging.WARNING
        logger.log(
            level,
            "reconcile of job %s failed: %s; retrying in %.3g s",
            job,
            said,
            delay,
            exc_info=error if traceback else None,
        )

    def _succeeded(self, uid: str) -> None:
        """A reconcile of the job completed: its backoff starts over."""
        before = self.failing.pop(uid, None)
        if before is not None:
            logger.info(
                "reconcile of job %s succeeded after %d failure(s)",
                self._named(uid),
                before.failures,
            )

    def _named(self, uid: str) -> str:
        """namespace/name (uid) of a job, for the log."""
        meta = (self.jobs.get(uid) or {}).get("metadata") or {}
        return f"{meta.get('namespace')}/{meta.get('name')} ({uid})"

    def health(self, stall_seconds: float) -> dict[str, Any]:
        """What /healthz reports; raises Stalled when the loop ended or has completed no pass
        for ``stall_seconds``. Jobs that waited that long for a completed reconcile (their API
        calls time out or hang) are reported, not failed on: a restart would not help one bad
        job nor an API server in a brownout, and would list everything again from it."""
        self.liveness.deadline = stall_seconds
        self.liveness.check()
        now = time.monotonic()
        since_pass = now - self.last_pass
        waits = sorted(((now - t, uid) for uid, t in self.waiting_since.items()), reverse=True)
        stalled = [(wait, uid) for wait, uid in waits if wait > stall_seconds]
        return {
            "leader": self.leading(),
            "jobs": len(self.jobs),
            "inFlight": len(self.running),
            "secondsSincePass": round(since_pass, 1),
            "longestWaitSeconds": round(waits[0][0] if waits else 0.0, 1),
            "stalledJobs": len(stalled),
            "stalled": [
                f"{self._named(uid)}: {wait:.0f} s" for wait, uid in stalled[:STALLED_SHOWN]
            ],
        }


def job_is_gone(error: ApiError) -> bool:
    """Whether the API server said the job itself no longer exists (a status write or a read of
    a job deleted in the meantime), not some child of it."""
    if error.status != 404:
        return False
    details = error.status_object.get("details") or {}
    return bool(details.get("group") == GROUP and details.get("kind") == PLURAL)
