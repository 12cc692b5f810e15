"""Carrying out a decision's side effects through the API door: deletes, then creates."""

from __future__ import annotations

from kubernetes.client.exceptions import ApiException

from meshrun.envcontract import pod_env
from meshrun_operator import metrics, names
from meshrun_operator.builders import (
    CHECKPOINT_MOUNT,
    JobRef,
    build_pod,
    build_podgroup,
    build_service,
)
from meshrun_operator.context import OperatorContext
from meshrun_operator.evaluation import Evaluation
from meshrun_operator.kueue_link import admit, create_workload, patch_status
from meshrun_operator.lifecycle import Decision
from meshrun_operator.netpolicy import build_network_policy
from meshrun_operator.phases import Event
from meshrun_operator.vocabulary import EventType, Reason


class StillTerminating(Exception):
    """A pod of the previous attempt still holds a name the new attempt needs: try later."""


async def execute(
    ctx: OperatorContext, job: JobRef, ev: Evaluation, decision: Decision
) -> list[Event]:
    """Delete, create, delete the job; returns Events about what could not be done as asked."""
    notes: list[Event] = []
    link, kueue = ctx.kueue, decision.kueue  # link: None when run with --no-kueue
    if decision.delete_pods:
        await ctx.kube.delete_pods(job.namespace, decision.delete_pods, decision.force_delete)
        metrics.PODS_DELETED.labels(force=str(decision.force_delete)).inc(len(decision.delete_pods))
    if link is not None and kueue is not None and kueue.create is not None:
        await create_workload(ctx.kube, link, job, ev, kueue.create)
    if decision.create_pods:
        notes.extend(await _create_children(ctx, job, ev, decision))
    if link is not None and kueue is not None:
        await patch_status(ctx.kube, link, job, kueue)
    if decision.delete_job:
        await ctx.kube.delete_job(job.namespace, job.name)
    return notes


async def _create_children(
    ctx: OperatorContext, job: JobRef, ev: Evaluation, decision: Decision
) -> list[Event]:
    assert ev.settings is not None and ev.plan is not None
    notes: list[Event] = []
    attempt = decision.state.attempt
    await ctx.kube.create(build_service(job))
    if ctx.network_policy is not None:
        await ctx.kube.create(build_network_policy(job, ctx.network_policy.operator))
    podgroup = build_podgroup(job, ev.settings)
    if podgroup is not None:
        try:
            await ctx.kube.create(podgroup)
        except ApiException as error:
            if error.status != 404:
                raise
            # The gang scheduler's CRD is not installed: the pods are still created (they wait
            # for that scheduler), and the user is told why nothing will gang-schedule them.
            message = Reason.POD_GROUP_UNAVAILABLE.message(api_version=podgroup["apiVersion"])
            notes.append(Event(EventType.WARNING, Reason.POD_GROUP_UNAVAILABLE, message))
    pods = []
    for index in decision.create_pods:
        env = pod_env(
            ev.plan,
            ev.settings,
            job_name=job.name,
            namespace=job.namespace,
            pod_index=index,
            master_addr=names.master_addr(job.name, job.namespace),
            master_port=names.RENDEZVOUS_PORT,
            attempt=attempt,
            checkpoint_dir=CHECKPOINT_MOUNT,
        )
        pods.append(build_pod(job, ev.settings, ev.plan, index, attempt, env))
    admitted = decision.kueue.admitted if decision.kueue is not None else None
    if admitted is not None and ctx.kueue is not None:
        # Where Kueue admitted the gang: flavors, topology domains, Kueue's keys.
        pods = await admit(ctx.kube, ctx.kueue, admitted, ev, pods)
    created = await ctx.kube.create_all(pods)
    metrics.PODS_CREATED.inc(sum(created))
    for pod, was_created in zip(pods, created, strict=True):
        if was_created:
            continue
        existing = await ctx.kube.pod_attempt(job.namespace, pod["metadata"]["name"])
        if existing != attempt:
            # A pod of the previous attempt still holds the name: wait, and do not record
            # this attempt as started (the status write is skipped by the exception).
            raise StillTerminating(
                f"pod {pod['metadata']['name']} of attempt {existing} is still terminating"
            )
    return notes
