"""Carrying out a decision's side effects through the API door: deletes, then creates.

Every create and delete is recorded as expected before it is sent (expectations.py), so the
next pass does not repeat it while the watch has not shown it yet. A name held by someone else's
child (an earlier job of the same name, an orphan) is never taken for the job's own, and an
object of the name that meshrun did not make (children.claim) is never changed or deleted: the
job waits with a NameConflict and no pod is created.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from meshrun.api.spec import Egress
from meshrun.envcontract import RENDEZVOUS_PORT, pod_env
from meshrun_operator import metrics, names
from meshrun_operator.children.builders import build_pod, build_podgroup, build_service
from meshrun_operator.children.drift import (
    SELECTOR_FIELD,
    drifted,
    own_labels,
    repair_patch,
    spec_selector,
)
from meshrun_operator.children.netpolicy import PolicyOptions, build_network_policy
from meshrun_operator.children.owner import Claim, JobRef, claim
from meshrun_operator.children.podtemplate import CHECKPOINT_MOUNT
from meshrun_operator.client.answers import Holder, Refused
from meshrun_operator.client.errors import ApiError
from meshrun_operator.jobstatus import EventType, Reason
from meshrun_operator.kinds import NETWORK_POLICY, POD, POD_GROUP, SERVICE
from meshrun_operator.lifecycle.decide import Decision
from meshrun_operator.lifecycle.evaluation import Evaluation
from meshrun_operator.lifecycle.phases import Event
from meshrun_operator.lifecycle.specedits import Running
from meshrun_operator.runtime.context import OperatorContext
from meshrun_operator.runtime.kueue_link import admit, create_workload, patch_status
from meshrun_operator.seen.views import Observed, Refusal


class StillTerminating(Exception):
    """A pod of the previous attempt still holds a name the new attempt needs: try later."""


class CreationRefused(Exception):
    """The API server refused some of the children (quota, PodSecurity, 5xx), or a name is held
    by an object meshrun did not make: the next pass decides on the refusal
    (``Observed.refused``)."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(f"{refusal.reason}: {refusal.message}")
        self.refusal = refusal


async def execute(
    ctx: OperatorContext,
    job: JobRef,
    ev: Evaluation,
    decision: Decision,
    observed: Observed | None = None,
) -> list[Event]:
    """Delete, create, delete the job; returns Events about what could not be done as asked.

    Pods are built from ``decision.build`` (the running attempt's plan) when it is set, else
    from ``ev``; ``observed`` gives the uids of the pods to delete (their expectations).
    """
    notes: list[Event] = []
    link, kueue = ctx.kueue, decision.kueue  # link: None when run with --no-kueue
    uids = {p.name: p.uid for p in (*observed.pods, *observed.foreign)} if observed else {}
    if observed is not None:
        notes += await _label_pods_again(ctx, job, observed, decision)
    for pods, force in ((decision.delete_pods, False), (decision.force_delete_pods, True)):
        if pods:
            ctx.expectations.expect_deletes(job.uid, (uids.get(p, "") for p in pods))
            await ctx.kube.delete_pods(job.namespace, pods, force, uids)
            metrics.PODS_DELETED.labels(force=str(force)).inc(len(pods))
    ev = decision.build or ev
    if link is not None and kueue is not None and kueue.create is not None:
        await create_workload(ctx.kube, link, job, ev, kueue.create)
    if decision.create_pods:
        notes.extend(await _create_children(ctx, job, ev, decision))
    elif decision.restore:
        notes.extend(await restore(ctx, job, ev, decision.restore))
    if link is not None and kueue is not None:
        await patch_status(ctx.kube, link, job, kueue)
    if decision.delete_job:
        await ctx.kube.delete_job(job.namespace, job.name, job.uid)
    return notes


async def _label_pods_again(
    ctx: OperatorContext, job: JobRef, observed: Observed, decision: Decision
) -> list[Event]:
    """The job's pods whose job-uid or managed-by label someone removed or changed get them
    again (the Service selects the gang by them), unless they are on their way out."""
    going = {*decision.delete_pods, *decision.force_delete_pods}
    notes = []
    for pod in observed.pods:
        if pod.labelled or pod.deleting or pod.name in going:
            continue
        if await ctx.kube.label_pod(
            job.namespace, pod.name, pod.uid, own_labels(job.name, job.uid)
        ):
            message = Reason.CHILD_REPAIRED.message(kind=POD.kind, name=pod.name, what="labels")
            notes.append(Event(EventType.WARNING, Reason.CHILD_REPAIRED, message))
    return notes


async def _create_children(
    ctx: OperatorContext, job: JobRef, ev: Evaluation, decision: Decision
) -> list[Event]:
    assert ev.spec is not None and ev.plan is not None
    notes: list[Event] = []
    attempt = decision.state.attempt
    notes += _repairs_said(SERVICE.kind, await _create_service(ctx, job))
    if ctx.network_policy is not None:
        egress = ev.spec.networking.egress
        made = await _create_network_policy(ctx, job, ctx.network_policy, egress)
        notes += _repairs_said(NETWORK_POLICY.kind, made)
    podgroup = build_podgroup(job, ev.spec)
    if podgroup is not None:
        try:
            created = await ctx.kube.create(podgroup)
        except ApiError as error:
            if error.status != 404:
                raise
            # The gang scheduler's CRD is not installed: the pods are still created (they wait
            # for that scheduler), and the user is told why nothing will gang-schedule them.
            message = Reason.POD_GROUP_UNAVAILABLE.message(api_version=podgroup["apiVersion"])
            notes.append(Event(EventType.WARNING, Reason.POD_GROUP_UNAVAILABLE, message))
        else:
            if not created:
                # A PodGroup of the name that is not the job's (planted with a small
                # minMember) would let the scheduler bind a partial gang: never taken for it.
                name, version = podgroup["metadata"]["name"], podgroup["apiVersion"]
                await _child_taken(ctx, job, POD_GROUP.kind, name, version)
    admitted = decision.kueue.admitted if decision.kueue is not None else None
    domains = None
    if admitted is None and ctx.placer is not None:
        # Admitted by Kueue, the pods go where its admission says (its topology, its flavors).
        domains = ctx.placer.choose(job, ev.spec, ev.plan, attempt)
    pods = []
    for index in decision.create_pods:
        env = pod_env(
            ev.plan,
            ev.spec,
            job_name=job.name,
            namespace=job.namespace,
            pod_index=index,
            master_addr=names.master_addr(job.name, job.namespace),
            master_port=RENDEZVOUS_PORT,
            attempt=attempt,
            checkpoint_dir=CHECKPOINT_MOUNT,
        )
        pods.append(build_pod(job, ev.spec, ev.plan, index, attempt, env, domains))
    if admitted is not None and ctx.kueue is not None:
        # Where Kueue admitted the gang: flavors, topology domains, Kueue's keys.
        pods = await admit(ctx.kube, ctx.kueue, admitted, ev, pods)
    names_sent = [pod["metadata"]["name"] for pod in pods]
    ctx.expectations.expect_creates(job.uid, attempt, names_sent)
    # A create that never reached the API server (it was down) is not in flight: the next pass
    # sends it again instead of waiting out the expectation.
    results = await ctx.kube.create_all(
        pods, unsent=lambda pod: ctx.expectations.not_created(job.uid, pod["metadata"]["name"])
    )
    metrics.PODS_CREATED.inc(sum(1 for r in results if r is True))
    ctx.attempts[job.uid] = Running(attempt, decision.state.attempt_generation, ev)
    refused: list[tuple[int, Refused | Conflict]] = []
    for index, name, result in zip(decision.create_pods, names_sent, results, strict=True):
        if isinstance(result, Refused):
            ctx.expectations.not_created(job.uid, name)
            refused.append((index, result))
    for index, name, result in zip(decision.create_pods, names_sent, results, strict=True):
        if result is False:
            conflict = await _name_taken(ctx, job, POD.kind, name, attempt)
            if conflict is not None:
                refused.append((index, conflict))
    if refused:
        raise CreationRefused(_refusal(refused, decision.create_pods))
    return notes


def _refusal(refused: Sequence[tuple[int, Refused | Conflict]], sent: tuple[int, ...]) -> Refusal:
    first = refused[0][1]
    indices = tuple(index for index, _ in refused)
    if isinstance(first, Conflict):
        return Refusal(indices, Reason.NAME_CONFLICT, first.message, sent=sent)
    waits = [r.retry_after for _, r in refused if isinstance(r, Refused) and r.retry_after]
    wait = max(waits, default=None)
    return Refusal(indices, first.reason, first.message, retry_after=wait, sent=sent)


async def restore(
    ctx: OperatorContext, job: JobRef, ev: Evaluation, kinds: Sequence[str]
) -> list[Event]:
    """Create again the children of a running gang that someone deleted (its Service: the
    pods' DNS names; its NetworkPolicy: who may reach them), or set back the labels and
    selector of one someone edited; the pods are left alone."""
    notes = []
    for kind in kinds:
        created = await RESTORERS[kind](ctx, job, ev)
        if created is None:  # not made by this operator
            continue
        if created.made:
            message = Reason.CHILD_RESTORED.message(kind=kind, name=created.name)
            notes.append(Event(EventType.WARNING, Reason.CHILD_RESTORED, message))
        notes += _repairs_said(kind, created)
    return notes


def _repairs_said(kind: str, made: Made) -> list[Event]:
    """The Warning that the job's own ``kind`` child was edited and set back, if it was."""
    if not made.repaired:
        return []
    what = " and ".join(made.repaired)
    message = Reason.CHILD_REPAIRED.message(kind=kind, name=made.name, what=what)
    return [Event(EventType.WARNING, Reason.CHILD_REPAIRED, message)]


@dataclass(frozen=True)
class Made:
    """What a child's create did: ``made`` (False: the job's own held the name already) and
    what of the job's own was set back (``repaired``: labels, selector)."""

    name: str
    made: bool
    repaired: tuple[str, ...] = ()


async def _restore_service(ctx: OperatorContext, job: JobRef, ev: Evaluation) -> Made:
    return await _create_service(ctx, job)


async def _restore_network_policy(ctx: OperatorContext, job: JobRef, ev: Evaluation) -> Made | None:
    if ctx.network_policy is None or ev.spec is None:
        return None
    egress = ev.spec.networking.egress
    return await _create_network_policy(ctx, job, ctx.network_policy, egress)


RESTORERS: dict[str, Callable[[OperatorContext, JobRef, Evaluation], Awaitable[Made | None]]] = {
    SERVICE.kind: _restore_service,
    NETWORK_POLICY.kind: _restore_network_policy,
}
"""How each child whose drift is judged (kinds.py: restored) is created again."""


async def _create_service(ctx: OperatorContext, job: JobRef) -> Made:
    """The headless Service, or the wait until a Service of another owner gives its name up;
    whether it was created now or the job's own was there (and what of it was set back)."""
    name = names.service_name(job.name)
    try:
        created = await ctx.kube.create(build_service(job))
    except Refused as refused:
        refusal = Refusal((), refused.reason, refused.message, retry_after=refused.retry_after)
        raise CreationRefused(refusal) from refused
    if created:
        return Made(name, True)
    return Made(name, False, await _child_taken(ctx, job, SERVICE.kind, name))


async def _create_network_policy(
    ctx: OperatorContext, job: JobRef, options: PolicyOptions, egress: Egress
) -> Made:
    """The job's NetworkPolicy (netpolicy.py). Refused (no RBAC for it, a webhook), the job
    waits with the reason rather than run open to every pod. A name still held by an earlier
    job's policy is waited for like its Service (its egress rules may differ), and a policy of
    that name that is not meshrun's is never taken for the job's."""
    name = names.network_policy_name(job.name)
    what = f"{NETWORK_POLICY.kind} {name}"
    try:
        policy = build_network_policy(job, options.operator, egress, options.egress)
        created = await ctx.kube.create(policy)
    except Refused as refused:
        refusal = Refusal((), refused.reason, refused.message, what, refused.retry_after)
        raise CreationRefused(refusal) from refused
    if created:
        return Made(name, True)
    return Made(name, False, await _child_taken(ctx, job, NETWORK_POLICY.kind, name))


@dataclass(frozen=True)
class Conflict:
    """An object of a child's name that is not meshrun's: it is left alone."""

    message: str


async def _child_taken(
    ctx: OperatorContext, job: JobRef, kind: str, name: str, api_version: str | None = None
) -> tuple[str, ...]:
    """The Service, NetworkPolicy or PodGroup (of ``api_version``) create found the name taken:
    raise unless it is the job's. The job's own Service or NetworkPolicy whose labels or
    selector someone edited is set back (children/drift.py); what was, is returned."""
    holder = await ctx.kube.holder(kind, job.namespace, name, api_version)
    conflict = await _judge_holder(ctx, job, kind, name, None, holder, api_version)
    if conflict is not None:
        refusal = Refusal((), Reason.NAME_CONFLICT, conflict.message, f"{kind} {name}")
        raise CreationRefused(refusal)
    assert holder is not None
    changed = drifted(kind, job.name, job.uid, holder.labels, spec_selector(kind, holder.spec))
    if kind not in SELECTOR_FIELD or not changed:
        return ()
    ops = repair_patch(kind, job.name, job.uid, holder.labels, holder.resource_version)
    repaired = await ctx.kube.repair_child(kind, job.namespace, name, ops, api_version)
    return changed if repaired else ()


async def _name_taken(
    ctx: OperatorContext,
    job: JobRef,
    kind: str,
    name: str,
    attempt: int | None,
    api_version: str | None = None,
) -> Conflict | None:
    """A create found the name taken (children.claim says whose it is): None when the job's
    own child of this attempt holds it; a Conflict when something not meshrun's does (left
    alone); an orphan of the job's is replaced (deleted under preconditions) and an earlier
    job's child waited for, both with StillTerminating. The status write is skipped by the
    exception, so the attempt is not recorded as started."""
    holder = await ctx.kube.holder(kind, job.namespace, name, api_version)
    return await _judge_holder(ctx, job, kind, name, attempt, holder, api_version)


async def _judge_holder(
    ctx: OperatorContext,
    job: JobRef,
    kind: str,
    name: str,
    attempt: int | None,
    holder: Holder | None,
    api_version: str | None = None,
) -> Conflict | None:
    """:func:`_name_taken`'s judgement of ``holder`` (None: the name was given up)."""
    if holder is None:
        if kind == POD.kind:
            ctx.expectations.not_created(job.uid, name)
        raise StillTerminating(f"{kind} {name} went away while it was being created")
    whose = claim(job, holder)
    if whose is Claim.OURS and not holder.deleting and attempt in (None, holder.attempt):
        return None
    if kind == POD.kind:
        ctx.expectations.not_created(job.uid, name)
    if whose is Claim.FOREIGN:
        owner = f"{holder.controller_kind} {holder.controller}" if holder.controller else "none"
        message = Reason.NAME_CONFLICT.message(kind=kind, name=name, owner=owner)
        return Conflict(message)
    if whose is Claim.ORPHAN and kind != POD.kind and not holder.deleting:
        await ctx.kube.delete_child(kind, job.namespace, holder, name, api_version)
    who = "an orphan" if holder.controller is None else f"owner {holder.controller}"
    raise StillTerminating(f"{kind} {name} ({who}, attempt {holder.attempt}) holds the name")
