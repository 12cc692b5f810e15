"""One reconcile: observe, call lifecycle.decide once, execute the decision, write status once.

The resync loop (resync.py) runs ``reconcile`` for a job whenever the job or one of its pods
changes, and for every job every ``--resync-seconds``. Pods and nodes come from kopf indexes fed
by watches, so a resync costs no API request unless something must change. Children have
deterministic names, so a reconcile that runs twice or is killed halfway never creates a
duplicate: a second create gets 409 and is a no-op.

An effect can meet an answer the decision could not know: the API server refuses some creates
(a quota, PodSecurity, a name someone else holds), rejects a pod built from the user's template,
or the job's Kueue Workload cannot be made. The answer is recorded where the next pass observes
it (``OperatorContext.refusals``, the job's evaluation, Kueue's holds), this pass writes no
status and raises Requeue, and the resync loop reconciles the job again at once: the next pass
decides on the answer like on anything else it observes (controller-runtime's requeue, kopf's
TemporaryError).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from meshrun.api.errors import SpecError
from meshrun_operator import metrics
from meshrun_operator.children.owner import JobRef
from meshrun_operator.client.answers import ChildRejected
from meshrun_operator.client.kube import StaleJob
from meshrun_operator.jobstatus import EventType, Reason
from meshrun_operator.lifecycle.decide import Decision, decide
from meshrun_operator.lifecycle.evaluation import POD_TEMPLATE, Evaluation
from meshrun_operator.lifecycle.phases import Event
from meshrun_operator.lifecycle.state import JobState
from meshrun_operator.lifecycle.writes import at_once
from meshrun_operator.plaindata import newest, replacing, with_unwritten, without_none
from meshrun_operator.runtime.actions import CreationRefused, execute
from meshrun_operator.runtime.context import OperatorContext
from meshrun_operator.runtime.kueue_link import KueueHold
from meshrun_operator.runtime.kueue_link import observe as observe_kueue
from meshrun_operator.seen.children import observe


class Requeue(Exception):
    """The pass's effects met an answer the next pass decides on (recorded for it): this pass
    wrote no status, and the job is reconciled again at once."""


async def evaluation(
    ctx: OperatorContext,
    job: JobRef,
    raw_spec: Mapping[str, Any],
    generation: object,
    labels: Mapping[str, Any] | None,
) -> Evaluation:
    """The job's evaluated spec: a known generation at once; a new one read, checked and
    planned on the evaluations' thread (an ``auto`` search takes a tenth of a second or more,
    and a spec can be edited as often as its author likes), so the event loop serves the other
    jobs meanwhile."""
    known = ctx.evaluations.known(job.uid, raw_spec, job.name, generation, labels)
    if known is not None:
        return known
    evaluations = ctx.evaluations
    return await asyncio.get_running_loop().run_in_executor(
        evaluations.thread,
        functools.partial(evaluations.of, job.uid, raw_spec, job.name, generation, labels),
    )


async def reconcile(
    ctx: OperatorContext, body: Mapping[str, Any], pods_index: Any, nodes_index: Any
) -> Decision:
    """Observe, decide, act, then write the status (only when it changed) and post the Events.

    A write that loses a race (the job changed since the copy this pass decided on) raises
    StaleJob and is not retried here: the watch brings the newer job, and the next pass decides
    on it, starting from the status this pass meant to write (``OperatorContext.unwritten``).
    Every side effect is idempotent, so acting again is safe. Requeue: the acts met an answer
    the next pass decides on (see above); nothing was written.

    A status someone else wrote is not decided on: the decision starts from the operator's own
    record of it (ownstatus.py), the status is written back at once, whole, and a Warning Event
    says so.
    """
    job = JobRef.of(body)
    lock = ctx.locks.setdefault(job.uid, asyncio.Lock())
    async with lock:
        started = time.perf_counter()
        # ``body`` is the resync loop's own copy of the job: read, never edited.
        stored = newest(dict(body), ctx.latest.get(job.uid))
        foreign = ctx.statuses.check(job.uid, stored)
        own = stored if foreign is None else {**stored, "status": foreign.own}
        unwritten = ctx.unwritten.pop(job.uid, None)
        job_body = with_unwritten(own, unwritten)
        restoring = foreign is not None
        notes: list[Event] = []
        if foreign is not None and foreign.new:
            message = Reason.STATUS_RESTORED.message(changes=foreign.changes())
            notes.append(Event(EventType.WARNING, Reason.STATUS_RESTORED, message))
        try:
            decision, told, stored = await _act(
                ctx, job, stored, job_body, pods_index, nodes_index, restoring
            )
        except Requeue:
            if unwritten is not None:  # still to be written by the next pass
                ctx.unwritten.setdefault(job.uid, unwritten)
            await _post(ctx, job, notes)
            raise
        notes += told
        if decision.state.restarts > JobState.from_job(job_body).restarts:
            reason = decision.state.last_failure.reason if decision.state.last_failure else None
            metrics.RESTARTS.labels(reason=reason or "Unknown").inc()
        ctx.phases.set(job.uid, decision.state.phase)
        try:
            await _write(ctx, job, stored, decision, restoring)
        except StaleJob:
            ctx.latest.pop(job.uid, None)
            ctx.unwritten[job.uid] = (stored.get("status") or {}, decision.status)
            # The next pass starts from the status meant here, so it will not tell these again.
            await _post(ctx, job, [*notes, *decision.events])
            raise
        await _post(ctx, job, [*notes, *decision.events])
        metrics.RECONCILE_SECONDS.observe(time.perf_counter() - started)
    return decision


async def _act(
    ctx: OperatorContext,
    job: JobRef,
    stored: dict[str, Any],
    job_body: dict[str, Any],
    pods_index: Any,
    nodes_index: Any,
    restoring: bool = False,
) -> tuple[Decision, list[Event], dict[str, Any]]:
    """One observe-decide-act round on ``job_body``; the decision, Events about the acts, and
    the job as stored now (after the status write that goes before deletes; ``restoring``:
    the stored status is someone else's). Requeue when the acts met an answer the next pass
    decides on."""
    observed = observe(job_body, pods_index, nodes_index, ctx.expectations, ctx.tombstones)
    pod0 = next((p for p in observed.pods if p.index == 0), None)
    missing = ctx.missing_children(job.namespace, job.name, job.uid)
    progress = await ctx.progress.read(pod0)
    refusal = ctx.refusals.pop(job.uid, None)
    observed = replace(observed, progress=progress, missing_children=missing, refused=refusal)
    observed = observe_kueue(ctx.kueue, ctx.node_labels, job_body, observed)
    raw_spec, generation = job_body.get("spec") or {}, job_body["metadata"].get("generation")
    labels = job_body["metadata"].get("labels")
    ev = await evaluation(ctx, job, raw_spec, generation, labels)
    if ctx.placer is not None and ev.spec is not None and ev.spec.elastic is not None:
        observed = replace(observed, capacity=ctx.placer.capacity(job.uid, ev.spec))
    running = ctx.attempts.get(job.uid)
    decision = decide(job_body, observed, datetime.now(UTC), ctx.timing, ev, running)
    if (decision.delete_pods or decision.force_delete_pods) and not decision.create_pods:
        # The status that says why the pods go is written before they go: an operator killed
        # in between finds the attempt already ended, with its failure's own reason, instead
        # of pods that vanished (PodDeleted). A write that loses its race deletes nothing.
        try:
            await _write(ctx, job, stored, decision, restoring)
        except StaleJob:
            ctx.latest.pop(job.uid, None)
            raise
        stored = ctx.latest.get(job.uid, stored)
    try:
        notes = await execute(ctx, job, ev, decision, observed)
    except CreationRefused as refusal:
        # Quota, PodSecurity, a 5xx or a name held by someone else: the job says so, and the
        # rest is retried later.
        ctx.refusals[job.uid] = refusal.refusal
        raise Requeue(str(refusal)) from refusal
    except ChildRejected as rejected:
        # The API server refused a pod built from the user's podTemplate: a spec error.
        ctx.evaluations.reject(job.uid, SpecError(POD_TEMPLATE, rejected.message))
        raise Requeue(str(rejected)) from rejected
    except KueueHold as held:
        # The Workload cannot be created for now: the job says why, and waits.
        assert ctx.kueue is not None
        ctx.kueue.hold(job.uid, held.hold)
        raise Requeue(str(held)) from held
    # The pods deleted since the last pass are decided on: forgotten (a requeued pass keeps them).
    ctx.tombstones.drop(job.namespace, job.name, (p.uid for p in observed.gone))
    return decision, notes, stored


async def _write(
    ctx: OperatorContext,
    job: JobRef,
    stored: Mapping[str, Any],
    decision: Decision,
    restoring: bool = False,
) -> None:
    """Patch the status when it differs from the stored one: at once when the change says
    something new, else once it waited ``status_interval_seconds`` (writes.py); until then the
    next pass decides on it. ``restoring`` a status someone else wrote: at once, and whole
    (what they added is removed)."""
    new, old = without_none(decision.status), without_none(stored.get("status") or {})
    if new == old:
        ctx.deferred.pop(job.uid, None)
        if restoring:  # what was written is what the operator decides: its own now
            ctx.statuses.wrote(job.uid, stored)
        return
    now = time.monotonic()
    since = ctx.deferred.setdefault(job.uid, now)
    if not restoring and not at_once(old, new) and now - since < ctx.status_interval_seconds:
        ctx.unwritten[job.uid] = (old, new)
        return
    version = str(stored["metadata"].get("resourceVersion", ""))
    patch = replacing(old, new) if restoring else decision.status
    ctx.statuses.sending(job.uid, patch)
    latest = await ctx.kube.patch_status(job.namespace, job.name, version, patch)
    ctx.latest[job.uid] = latest
    ctx.statuses.wrote(job.uid, latest)
    ctx.deferred.pop(job.uid, None)


async def _post(ctx: OperatorContext, job: JobRef, events: Iterable[Event]) -> None:
    involved = job.object_reference()
    unique = dict.fromkeys(events)
    await asyncio.gather(
        *(ctx.kube.post_event(involved, e.type, e.reason, e.message) for e in unique)
    )
