"""One reconcile: observe, call lifecycle.decide, execute the decision, write status once.

The idempotent ``reconcile`` runs on create, on resume (operator restart), whenever a job or one
of its pods changes, and on a periodic resync (handlers.py). Pods and nodes come from kopf
indexes fed by watches, so a resync costs no API request unless something must change.
Children have deterministic names, so a reconcile that runs twice or is killed halfway never
creates a duplicate: a second create gets 409 and is a no-op.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

import kopf
from kubernetes.client.exceptions import ApiException

from meshrun.envcontract import pod_env
from meshrun.errors import SpecError
from meshrun_operator import metrics, names
from meshrun_operator.builders import (
    CHECKPOINT_MOUNT,
    JobRef,
    build_pod,
    build_podgroup,
    build_service,
)
from meshrun_operator.kube import ChildRejected, Kube, StaleJob
from meshrun_operator.lifecycle import (
    Decision,
    Evaluation,
    Tuning,
    decide,
    evaluate,
    read_state,
)
from meshrun_operator.observe import Observed
from meshrun_operator.progress import ProgressReader


@dataclass
class OperatorContext:
    """What every handler shares: the API door, the knobs and per-job locks."""

    kube: Kube
    """Asynchronous API calls."""
    tuning: Tuning = field(default_factory=Tuning)
    """Backoff and grace periods."""
    resync_seconds: float = 2.0
    """Interval of the periodic resync of every job (deadlines, backoff, gang timeout)."""
    watch_nodes: bool = True
    """Watch nodes to detect NotReady or deleted ones (needs list/watch on nodes)."""
    progress: ProgressReader = field(default_factory=lambda: ProgressReader(enabled=False))
    """Reader of the trainer's /progress endpoint."""
    phases: metrics.PhaseBook = field(default_factory=metrics.PhaseBook)
    """Phase of every job for the jobs-by-phase gauge."""
    locks: dict[str, asyncio.Lock] = field(default_factory=dict)
    """One lock per job uid: the create handler and the timer never reconcile concurrently."""
    latest: dict[str, dict[str, Any]] = field(default_factory=dict)
    """The job as our last patch left it, by uid: kopf may hand a handler a body older than
    our own last write, and deciding on it would undo that write."""


def plain(value: Any) -> Any:
    """A deep copy of a kopf body (mapping views) as plain dicts and lists."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def newest(body: dict[str, Any], cached: dict[str, Any] | None) -> dict[str, Any]:
    """The more recent of two copies of a job, by resourceVersion.

    resourceVersion is formally opaque, but every API server backed by etcd uses the etcd
    revision, an increasing integer; when either is not an integer the watched body wins.
    """
    if cached is None:
        return body
    try:
        newer = int(cached["metadata"]["resourceVersion"]) > int(
            body["metadata"]["resourceVersion"]
        )
    except (KeyError, TypeError, ValueError):
        return body
    return cached if newer else body


def _without_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_none(v) for v in value]
    return value


async def _create_children(
    ctx: OperatorContext, job: JobRef, ev: Evaluation, decision: Decision
) -> None:
    assert ev.settings is not None and ev.plan is not None
    attempt = int(decision.status.get("attempt") or 0)
    await ctx.kube.create(build_service(job))
    podgroup = build_podgroup(job, ev.settings)
    if podgroup is not None:
        try:
            await ctx.kube.create(podgroup)
        except ApiException as error:
            if error.status != 404:
                raise
            # The gang scheduler's CRD is not installed: the pods are still created (they wait
            # for that scheduler), and the user is told why nothing will gang-schedule them.
            kopf.warn(
                cast(
                    kopf.Body,
                    {
                        "apiVersion": names.API_VERSION,
                        "kind": names.KIND,
                        "metadata": {"name": job.name, "namespace": job.namespace, "uid": job.uid},
                    },
                ),
                reason="PodGroupUnavailable",
                message=f"{podgroup['apiVersion']} PodGroup is not served by this cluster",
            )
    pods = []
    for index in decision.create_pods:
        env = pod_env(
            ev.plan,
            ev.spec,
            job_name=job.name,
            namespace=job.namespace,
            pod_index=index,
            master_addr=names.master_addr(job.name, job.namespace),
            master_port=names.RENDEZVOUS_PORT,
            attempt=attempt,
            checkpoint_dir=CHECKPOINT_MOUNT,
        )
        pods.append(build_pod(job, ev.spec, ev.settings, ev.plan, index, attempt, env))
    created = await ctx.kube.create_all(pods)
    metrics.PODS_CREATED.inc(sum(created))
    for pod, was_created in zip(pods, created, strict=True):
        if was_created:
            continue
        existing = await ctx.kube.pod_attempt(job.namespace, pod["metadata"]["name"])
        if existing != attempt:
            # A pod of the previous attempt still holds the name: wait, and do not record
            # this attempt as started (the status patch is skipped by the exception).
            raise kopf.TemporaryError(
                f"pod {pod['metadata']['name']} of attempt {existing} is still terminating",
                delay=1,
            )


async def _execute(ctx: OperatorContext, job: JobRef, ev: Evaluation, decision: Decision) -> None:
    if decision.delete_pods:
        await ctx.kube.delete_pods(job.namespace, decision.delete_pods, decision.force_delete)
        metrics.PODS_DELETED.labels(force=str(decision.force_delete)).inc(len(decision.delete_pods))
    if decision.create_pods:
        await _create_children(ctx, job, ev, decision)
    if decision.delete_job:
        await ctx.kube.delete_job(job.namespace, job.name)


def _observe(body: Mapping[str, Any], pods_index: Any, nodes_index: Any) -> Observed:
    meta = body["metadata"]
    key = (meta["namespace"], meta["name"])
    store = pods_index.get(key, []) if pods_index is not None else []
    pods = tuple(p for p in store if p.owner_uid in (meta.get("uid"), None))
    nodes = None
    if nodes_index is not None:
        # Only the job's own nodes: a node missing from the index has been deleted.
        used = {p.node for p in pods if p.node}
        nodes = {name: any(nodes_index[name]) for name in used if name in nodes_index}
    return Observed(pods=pods, nodes=nodes)


async def reconcile(
    ctx: OperatorContext, body: Mapping[str, Any], pods_index: Any, nodes_index: Any
) -> Decision:
    """Observe, decide, act, then write status and bookkeeping (only what changed).

    When the write loses a race (kopf's own finalizer and annotation patches, a user's edit),
    the job is read again and the whole round repeats: every side effect is idempotent, so
    repeating is safe, and the status is never left behind the actions.
    """
    meta = body["metadata"]
    queue_label = (meta.get("labels") or {}).get(names.KUEUE_QUEUE_LABEL)
    job = JobRef(meta["name"], meta["namespace"], meta["uid"], queue_label)
    lock = ctx.locks.setdefault(job.uid, asyncio.Lock())
    async with lock:
        started = time.perf_counter()
        job_body = newest(plain(body), ctx.latest.get(job.uid))
        posted: set[tuple[str, str]] = set()
        for round_left in reversed(range(MAX_ROUNDS)):
            decision = await _round(ctx, job, job_body, pods_index, nodes_index)
            try:
                await _write(ctx, job, job_body, decision)
            except StaleJob as stale:
                ctx.latest.pop(job.uid, None)
                if decision.create_pods or decision.delete_pods:
                    _post(body, decision, posted)  # what was done must be told once
                if not round_left:
                    raise kopf.TemporaryError(str(stale), delay=0.5) from stale
                job_body = await ctx.kube.get_job(job.namespace, job.name)
                continue
            break
        _post(body, decision, posted)
        old_restarts = (job_body.get("status") or {}).get("restarts", 0)
        if decision.status.get("restarts", 0) > old_restarts:
            reason = (decision.state.get("lastFailure") or {}).get("reason", "Unknown")
            metrics.RESTARTS.labels(reason=reason).inc()
        ctx.phases.set(job.uid, decision.status.get("phase"))
        metrics.RECONCILE_SECONDS.observe(time.perf_counter() - started)
    return decision


MAX_ROUNDS = 3


def _post(body: Mapping[str, Any], decision: Decision, posted: set[tuple[str, str]]) -> None:
    for event in decision.events:
        if (event.reason, event.message) in posted:
            continue
        posted.add((event.reason, event.message))
        kopf.event(
            cast(kopf.Body, body),
            type=event.type,
            reason=event.reason,
            message=event.message[:1000],
        )


async def _round(
    ctx: OperatorContext, job: JobRef, job_body: dict[str, Any], pods_index: Any, nodes_index: Any
) -> Decision:
    """One observe-decide-act round on ``job_body``."""
    observed = _observe(job_body, pods_index, nodes_index)
    pod0 = next((p for p in observed.pods if p.index == 0), None)
    progress = await ctx.progress.read(pod0)
    observed = Observed(pods=observed.pods, nodes=observed.nodes, progress=progress)
    ev = evaluate(job_body.get("spec") or {}, job.name)
    now = datetime.now(UTC)
    decision = decide(job_body, observed, now, ctx.tuning, ev)
    try:
        await _execute(ctx, job, ev, decision)
    except ChildRejected as rejected:
        # The API server refused a pod built from the user's podTemplate: a spec error.
        ev = Evaluation(spec=ev.spec, error=SpecError("spec.podTemplate", rejected.message))
        decision = decide(job_body, observed, now, ctx.tuning, ev)
        await _execute(ctx, job, ev, decision)
    return decision


async def _write(
    ctx: OperatorContext, job: JobRef, job_body: Mapping[str, Any], decision: Decision
) -> None:
    old_status = _without_none(job_body.get("status") or {})
    new_status = _without_none(decision.status)
    old_state = _without_none(read_state(job_body))
    new_state = _without_none(decision.state)
    status = decision.status if new_status != old_status else None
    state = new_state if new_state != old_state else None
    if status is not None or state is not None:
        version = str(job_body["metadata"].get("resourceVersion", ""))
        latest = await ctx.kube.patch_job(job.namespace, job.name, version, status, state)
        if latest is not None:
            ctx.latest[job.uid] = latest
