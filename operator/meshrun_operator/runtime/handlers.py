"""kopf wiring: the indexes of pods and nodes, the watch-event handlers, and the resync loop's
start and stop.

kopf's documented patterns: the startup handler receives the indexes and starts the resync loop
(resync.py) with them; shared objects travel in the operator's memo; kopf calls no handler before
the initial listing has filled every index, so the loop never sees a job before its pods. Jobs
carry no finalizer: no handler needs one (see resync.py for why the loop is not a kopf timer).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import kopf

from meshrun.api.crd import GROUP, PLURAL, VERSION
from meshrun_operator import kinds, metrics, names
from meshrun_operator.background import Liveness, Stalled
from meshrun_operator.children import drift
from meshrun_operator.children.placer import Placer
from meshrun_operator.kinds import KINDS, POD
from meshrun_operator.plaindata import kept
from meshrun_operator.runtime.context import OperatorContext
from meshrun_operator.runtime.leader import Elector
from meshrun_operator.runtime.resync import Resyncer
from meshrun_operator.runtime.watchers import Watchers
from meshrun_operator.seen.nodes import NodeWatch
from meshrun_operator.seen.relist import Auditor, LiveIndex
from meshrun_operator.seen.views import PodView, job_controller, owning_job, pod_view

LABELLED = tuple(
    (served.group or served.version, served.plural)
    for kind in KINDS.values()
    if kind.labelled
    for served in kind.served
)
"""kopf's selectors of what the operator watches by the job-name label (server-side): the jobs'
pods, Services, NetworkPolicies and Workloads (kinds.py), not every one of the cluster."""


def alive(liveness: Liveness, what: object) -> dict[str, Any]:
    """A background loop's probe answer; kopf.PermanentError (HTTP 500) when it stalled."""
    try:
        return {**liveness.check(), "state": what}
    except Stalled as stalled:
        raise kopf.PermanentError(str(stalled)) from stalled


def always() -> bool:
    """Without leader election, this operator always acts."""
    return True


class OperatorMemo(kopf.Memo):
    """The operator's memo: kopf hands every job a shallow copy, so these objects are shared."""

    ctx: OperatorContext
    """The API door, knobs and per-job memory (set before kopf starts)."""
    resync: Resyncer
    """The resync loop (set by the startup handler)."""
    task: asyncio.Task[None]
    """The task running the loop."""
    elector: Elector | None
    """The leader election (set before kopf starts), or None: this operator always acts."""
    lead_task: asyncio.Task[None]
    """The task renewing the lease (with leader election)."""
    nodes: NodeWatch
    """The node watch (unless run with --no-watch-nodes)."""
    auditor: Auditor
    """Drops what a watch gap left behind (set by the startup handler)."""
    watchers: Watchers
    """The ends of kopf's watch streams, for /healthz (set by the startup handler)."""


def register(
    registry: kopf.OperatorRegistry,
    watch_nodes: bool,
    stall_seconds: float = 300.0,
    namespaces: tuple[str, ...] = (),
    network_policies: bool = False,
) -> None:
    """Register the indexes and handlers on ``registry`` (an explicit one, not kopf's global).

    /healthz fails when the resync loop completed no pass for ``stall_seconds`` or one of
    kopf's watchers ended, and reports jobs whose reconciles did not complete for that long.
    After each listing of the served ``namespaces`` (all when empty), jobs and pods deleted while a
    watch was down are dropped (relist.py). The jobs' children indexed on their own (kinds.py:
    the Services and, with ``network_policies``, the NetworkPolicies) are watched too: one
    deleted while its job runs is created again.
    """
    watched = kinds.watched(optional=network_policies)
    for kind in watched:
        _child_handlers(registry, kind)
    _login_handler(registry)
    _pod_handlers(registry)
    _job_handlers(registry)
    _start_stop_handlers(registry, watch_nodes, stall_seconds, namespaces, watched)
    _probe_handlers(registry, stall_seconds)


def _child_handlers(registry: kopf.OperatorRegistry, kind: kinds.Kind) -> None:
    """The index of the jobs' children of ``kind`` (their controllers' uids) and the watch
    that pokes a job when one of them is deleted."""
    served = kind.at()
    resource: tuple[str, ...] = (served.version, served.plural)
    if served.group:
        resource = (served.group, *resource)

    @kopf.index(*resource, id=kind.index, labels={names.LABEL_JOB: kopf.PRESENT}, registry=registry)
    async def children(
        namespace: str | None, labels: kopf.Labels, meta: kopf.Meta, spec: kopf.Spec, **_: Any
    ) -> dict[tuple[str, str], drift.Mark]:
        # (namespace, job name) -> the uid of the job that controls it (whose child it is), and
        # whether its labels and selector are still the operator's (drift.py).
        job = str(labels[names.LABEL_JOB])
        owner = job_controller(meta) or ""
        return {(str(namespace), job): drift.mark(kind.kind, job, meta, owner, spec)}

    @kopf.on.event(
        *resource,
        id=f"{kind.index}-changed",
        labels={names.LABEL_JOB: kopf.PRESENT},
        registry=registry,
    )
    async def child_changed(
        memo: OperatorMemo,
        meta: kopf.Meta,
        labels: kopf.Labels,
        spec: kopf.Spec,
        type: str | None,
        **_: Any,
    ) -> None:
        if type == "DELETED":
            memo.resync.poke_owner(owning_job(meta))
            return
        owner = owning_job(meta)
        job = str(labels.get(names.LABEL_JOB, ""))
        if owner is not None and not drift.mark(kind.kind, job, meta, owner[2], spec).intact:
            memo.resync.poke_owner(owner)  # its labels or selector edited: set back now


def _login_handler(registry: kopf.OperatorRegistry) -> None:
    @kopf.on.login(id="login", registry=registry)
    async def credentials(memo: OperatorMemo, **_: Any) -> Any:
        # The process's one login (login.py): kopf's watches and the operator's requests agree,
        # and kopf asking again after a 401 joins any login already under way.
        return await memo.ctx.kube.rest.login.for_kopf()


def _pod_handlers(registry: kopf.OperatorRegistry) -> None:
    """The pods' two indexes (their views; their versions for the watch-gap audit) and the
    watch that pokes their job."""
    pods = ("v1", POD.plural)
    labelled = {names.LABEL_JOB: kopf.PRESENT}

    @kopf.index(*pods, id="meshrun_pods", labels=labelled, registry=registry)
    async def meshrun_pods(
        namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any
    ) -> dict[tuple[str, str], PodView]:
        # Coroutines run on the event loop (kopf runs a plain function on a thread each time);
        # the view reads the body without copying it.
        return {(str(namespace), str(labels[names.LABEL_JOB])): pod_view(body)}

    @kopf.index(*pods, id="meshrun_pod_versions", labels=labelled, registry=registry)
    async def meshrun_pod_versions(
        uid: str, namespace: str | None, meta: kopf.Meta, **_: Any
    ) -> dict[str, tuple[str, str]]:
        """What a watch-gap audit compares with a fresh list: uid -> (version, namespace)."""
        return {str(uid): (str(meta.get("resourceVersion", "")), str(namespace))}

    @kopf.on.event(*pods, id="pod-changed", labels=labelled, registry=registry)
    async def pod_changed(memo: OperatorMemo, body: kopf.Body, type: str | None, **_: Any) -> None:
        if type is None:  # listed (at start, or again after a watch gap)
            memo.auditor.soon()
        if type == "DELETED":
            # The pods index forgets a deleted pod; its last state decides what its deletion
            # meant (a DisruptionTarget makes it a disruption, not a failure).
            memo.resync.poke_owner(memo.ctx.tombstones.record(kept(body)), batch=True)
            return
        memo.resync.poke_owner(owning_job(body.get("metadata") or {}), batch=True)


def _job_handlers(registry: kopf.OperatorRegistry) -> None:
    @kopf.on.event(GROUP, VERSION, PLURAL, id="job-changed", registry=registry)
    async def job_changed(
        memo: OperatorMemo, uid: str, type: str | None, body: kopf.Body, **_: Any
    ) -> None:
        if type is None:
            memo.auditor.soon()
        memo.resync.job_changed(uid, body, deleted=type == "DELETED")


def _start_stop_handlers(
    registry: kopf.OperatorRegistry,
    watch_nodes: bool,
    stall_seconds: float,
    namespaces: tuple[str, ...],
    watched: tuple[kinds.Kind, ...],
) -> None:
    @kopf.on.startup(id="start-resync", registry=registry)
    async def start_resync(memo: OperatorMemo, **kwargs: Any) -> None:
        """Start the resync loop with kopf's live indexes (kopf hands them to startup handlers
        already created, and fills them before any other handler runs) and the node watch (the
        loop waits for its first listing)."""
        nodes = _start_nodes(memo, kwargs["meshrun_pods"], stall_seconds) if watch_nodes else None
        elector: Elector | None = memo.get("elector")
        leading = elector.leading if elector is not None else always
        memo.ctx.children = {kind.kind: kwargs[kind.index] for kind in watched}
        memo.resync = Resyncer(
            memo.ctx, kwargs["meshrun_pods"], nodes, leading=leading, stall_seconds=stall_seconds
        )
        # Before kopf starts its watchers (after the startup handlers): each one's end is seen.
        memo.watchers = Watchers()
        memo.watchers.install()
        memo.task = asyncio.create_task(memo.resync.run(), name="meshrun-resync")
        memo.resync.liveness.task = memo.task
        resync = memo.resync
        versions = kwargs["meshrun_pod_versions"]
        memo.auditor = Auditor(memo.ctx.kube, resync.jobs, resync.forget, versions, namespaces)
        resync.pods_index = LiveIndex(kwargs["meshrun_pods"], memo.auditor.ghosts)
        _start_lease(memo, elector)

    @kopf.on.cleanup(id="stop-resync", registry=registry)
    async def stop_resync(memo: OperatorMemo, **_: Any) -> None:
        await _stop(memo)


def _start_nodes(memo: OperatorMemo, pods: Any, stall_seconds: float) -> NodeWatch:
    """The node watch, and the placer that reads it: a node's change of readiness (or its
    deletion) concerns every job."""
    nodes = NodeWatch(memo.ctx.kube.rest, lambda: memo.resync.poke_all(), deadline=stall_seconds)
    memo.ctx.node_labels = nodes.labels
    memo.ctx.placer = Placer(nodes.nodes, pods)
    memo.nodes = nodes
    nodes.start()
    return nodes


def _start_lease(memo: OperatorMemo, elector: Elector | None) -> None:
    """The leader election's loop; without one, this operator leads."""
    if elector is None:
        metrics.LEADER.set(1)
        return
    # Every index stays warm on a standby; only its writes are refused.
    memo.ctx.kube.may_write = elector.leading
    memo.ctx.kube.write_seconds = elector.write_seconds
    run = elector.run(memo.resync.leadership_changed)
    memo.lead_task = asyncio.create_task(run, name="meshrun-lease")
    elector.liveness.task = memo.lead_task


async def _stop(memo: OperatorMemo) -> None:
    """Stop the node watch, the watchers' record, the resync loop, the progress reader, the
    auditor and the lease (released: a standby takes over at once), then the connections."""
    nodes: NodeWatch | None = memo.get("nodes")
    if nodes is not None:
        nodes.stop()
    watchers: Watchers | None = memo.get("watchers")
    if watchers is not None:
        watchers.uninstall()
    task: asyncio.Task[None] | None = memo.get("task")
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    await memo.ctx.progress.close()
    auditor: Auditor | None = memo.get("auditor")
    if auditor is not None:
        await auditor.stop()
    lead: asyncio.Task[None] | None = memo.get("lead_task")
    elector: Elector | None = memo.get("elector")
    if lead is not None and elector is not None:
        lead.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await lead
        await elector.release()  # a standby takes over at once
        await elector.api.rest.close()
    await memo.ctx.kube.rest.close()


def _probe_handlers(registry: kopf.OperatorRegistry, stall_seconds: float) -> None:
    @kopf.on.probe(id="resync", registry=registry)
    def resync_alive(memo: OperatorMemo, **_: Any) -> dict[str, Any]:
        """/healthz fails (HTTP 500) when the resync loop ended or completes no pass: the
        operator would silently stop acting. Jobs whose reconciles do not complete are only
        reported: a restart would not help them. A permanent error, because kopf retries any
        other error of a probe while the request waits."""
        try:
            return memo.resync.health(stall_seconds)
        except Stalled as stalled:
            raise kopf.PermanentError(str(stalled)) from stalled

    @kopf.on.probe(id="watchers", registry=registry)
    async def watchers_alive(memo: OperatorMemo, **_: Any) -> dict[str, Any]:
        """/healthz fails when one of kopf's watch streams ended (watchers.py): the jobs or
        pods of that stream would change unseen. On the event loop: it reads the loop's
        tasks."""
        try:
            return memo.watchers.check()
        except Stalled as stalled:
            raise kopf.PermanentError(str(stalled)) from stalled

    @kopf.on.probe(id="nodes", registry=registry)
    def nodes_alive(memo: OperatorMemo, **_: Any) -> dict[str, Any]:
        """/healthz fails when the node watch ended or heard nothing for its deadline: lost
        nodes would go unnoticed."""
        nodes: NodeWatch | None = memo.get("nodes")
        return {"watched": False} if nodes is None else alive(nodes.liveness, len(nodes.nodes))

    @kopf.on.probe(id="lease", registry=registry)
    def lease_alive(memo: OperatorMemo, **_: Any) -> dict[str, Any]:
        """/healthz fails when the lease loop ended or completed no attempt for its deadline:
        a leader would stop renewing, a standby would never take over."""
        elector: Elector | None = memo.get("elector")
        if elector is None:
            return {"election": False}
        return alive(elector.liveness, elector.leading())
