"""Kueue, the side that talks to the API server: the Workloads the operator sees, creating a
job's Workload, placing its pods by the admission, and patching the Workload's status.

The pure decisions are in lifecycle/queueing.py; this module carries them out through the API
door (kube.py). A Workload that cannot be created for now (Kueue not installed, a missing
WorkloadPriorityClass, a Workload Kueue's webhook refuses) raises KueueHold: the reconcile
records the hold and the next pass decides on it, so the job shows why it waits, and the create
is tried again after HOLD_SECONDS.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from meshrun_operator import kueue, names
from meshrun_operator.children.builders import build_pod
from meshrun_operator.children.owner import Claim, JobRef, claim, owner_reference
from meshrun_operator.client.answers import ChildRejected
from meshrun_operator.client.errors import ApiError
from meshrun_operator.client.kube import Kube
from meshrun_operator.jobstatus import Reason
from meshrun_operator.kueue import (
    AdmissionError,
    Hold,
    KueueActions,
    KueueView,
    QueueRef,
    add_tolerations,
    admit_pods,
    apply_admission,
)
from meshrun_operator.lifecycle.elastic import admission_floor
from meshrun_operator.lifecycle.evaluation import Evaluation
from meshrun_operator.names import PRIORITY_CLASS_LABEL
from meshrun_operator.plaindata import newest
from meshrun_operator.seen.views import Observed, job_controller

logger = logging.getLogger("meshrun.operator")

HOLD_SECONDS = 30.0
"""A job held for want of Kueue (or of its priority class) tries to create its Workload again
this often."""
FLAVOR_SECONDS = 60.0
"""ResourceFlavors change rarely: one read serves the pods of every job for this long."""
LATEST_SECONDS = 30.0
"""The operator's own last write of a Workload stands in for the watch this long at most (the
watch brings it within moments; a Workload deleted meanwhile must not live on here)."""
VERSION = kueue.API_VERSION.split("/")[1]


class KueueHold(Exception):
    """The job's Workload cannot be created for now; ``hold`` says why."""

    def __init__(self, hold: Hold) -> None:
        super().__init__(hold.message)
        self.hold = hold


@dataclass
class KueueLink:
    """What the operator keeps about Kueue: the Workloads it sees, and its own last writes."""

    index: Any = None
    """kopf's index of the operator's Workloads by (namespace, job name), set at startup."""
    latest: dict[str, tuple[dict[str, Any], float]] = field(default_factory=dict)
    """By job uid: the Workload as the operator's last create or patch left it (the watch may
    not have brought it yet), and when."""
    holds: dict[str, tuple[Hold, float]] = field(default_factory=dict)
    """By job uid: why its Workload could not be created, and until when that holds."""
    flavors: dict[str, tuple[dict[str, Any], float]] = field(default_factory=dict)
    """ResourceFlavors by name, with the time they were read."""

    def view(self, job: Mapping[str, Any]) -> KueueView:
        """The job's Workload (the newer of the watched one and the operator's own last
        write), or why it has none."""
        meta = job["metadata"]
        uid = str(meta.get("uid", ""))
        seen = None
        if self.index is not None:
            for workload in self.index.get((meta["namespace"], meta["name"]), []):
                found_meta = workload["metadata"]
                labelled = (found_meta.get("labels") or {}).get(kueue.JOB_UID_LABEL) == uid
                if labelled and job_controller(found_meta) == uid:  # labels are anyone's
                    seen = workload
        written = self.latest.get(uid)
        mine = None if written is None else written[0]
        late = written is not None and time.monotonic() - written[1] > LATEST_SECONDS
        if mine is not None and (late or (seen is not None and newest(seen, mine) is seen)):
            self.latest.pop(uid, None)  # the watch caught up (or the Workload is gone)
            mine = None
        found = mine if mine is not None else seen
        hold = self.holds.get(uid)
        if hold is not None and hold[1] <= time.monotonic():
            self.holds.pop(uid, None)
            hold = None
        return KueueView(
            workload=found, hold=None if found is not None or hold is None else hold[0]
        )

    def hold(self, uid: str, hold: Hold) -> None:
        self.holds[uid] = (hold, time.monotonic() + HOLD_SECONDS)

    def forget(self, uid: str) -> None:
        self.latest.pop(uid, None)
        self.holds.pop(uid, None)

    async def flavor(self, kube: Kube, name: str) -> dict[str, Any]:
        cached = self.flavors.get(name)
        if cached is not None and time.monotonic() - cached[1] < FLAVOR_SECONDS:
            return cached[0]
        found = await kube.get_custom(kueue.GROUP, VERSION, "resourceflavors", name)
        if found is None:
            # Kueue admitted with it a moment ago: retried at the next resync.
            raise LookupError(f"ResourceFlavor {name} not found")
        self.flavors[name] = (found, time.monotonic())
        return found


def observe(
    kueue: KueueLink | None, node_labels: Any, job: Mapping[str, Any], observed: Observed
) -> Observed:
    """``observed`` with the job's Workload (``kueue``: None without Kueue) and its nodes'
    topology domains (``node_labels``: kopf's index of node labels, or None)."""
    return replace(
        observed,
        kueue=None if kueue is None else kueue.view(job),
        domains=_domains(node_labels, job, observed),
    )


def _domains(node_labels: Any, job: Mapping[str, Any], observed: Observed) -> dict[str, str] | None:
    """Node -> its value of the job's topologyKey, for the nodes of the job's pods."""
    key = ((job.get("spec") or {}).get("scheduling") or {}).get("topologyKey")
    if not key or node_labels is None:
        return None
    result = {}
    for node in {p.node for p in observed.pods if p.node}:
        for labels in node_labels.get(node, []):
            if key in labels:
                result[node] = str(labels[key])
    return result


async def create_workload(
    kube: Kube, link: KueueLink, job: JobRef, ev: Evaluation, ref: QueueRef
) -> None:
    """Create the job's Workload: one pod set per pipeline stage, from the first pod of each
    of attempt 0 (no environment: nothing that changes between attempts), owned by the job."""
    assert ev.spec is not None and ev.plan is not None
    spec, plan = ev.spec, ev.plan
    priority = None
    if ref.priority_class:
        found = await kube.get_custom(
            kueue.GROUP, VERSION, "workloadpriorityclasses", ref.priority_class
        )
        if found is None:
            message = Reason.PRIORITY_CLASS_NOT_FOUND.message(
                label=PRIORITY_CLASS_LABEL, name=ref.priority_class
            )
            raise KueueHold(Hold(Reason.PRIORITY_CLASS_NOT_FOUND, message))
        priority = int(found.get("value") or 0)
    topology_key = spec.scheduling.topology_key
    request = kueue.WorkloadRequest(
        job_name=job.name,
        namespace=job.namespace,
        uid=job.uid,
        queue_name=ref.queue,
        priority_class=ref.priority_class,
        priority=priority,
        topology=kueue.TopologyRequest(topology_key) if topology_key else None,
        min_count=admission_floor(spec, plan),
    )
    # The first pod of each pod set stands for the set: a gang of thousands is not built
    # whole (on the event loop) to describe a few stages.
    firsts = [pod_set.pod_indices[0] for pod_set in kueue.pod_sets(plan)]
    pods = [build_pod(job, spec, plan, i, 0, {}) for i in firsts]
    tolerations = await _queue_tolerations(kube, link, job.namespace, ref.queue)
    for pod in pods:
        add_tolerations(pod["spec"].setdefault("tolerations", []), tolerations)
    workload = kueue.build_workload(request, plan, pods, owner_reference(job))
    name = workload["metadata"]["name"]
    try:
        created = await kube.create(workload)
    except ApiError as error:
        if error.status != 404:
            raise
        message = Reason.KUEUE_NOT_INSTALLED.message(queue=ref.queue, api=kueue.API_VERSION)
        raise KueueHold(Hold(Reason.KUEUE_NOT_INSTALLED, message)) from error
    except ChildRejected as rejected:
        message = Reason.WORKLOAD_REJECTED.message(workload=name, error=rejected.message)
        raise KueueHold(Hold(Reason.WORKLOAD_REJECTED, message)) from rejected
    if created:
        link.latest[job.uid] = (workload, time.monotonic())
        return
    # The name is taken. Only the job's own Workload (its controller reference) is waited
    # for: one planted with a smaller gang would have Kueue admit the pods outside quota.
    holder = await kube.holder(kueue.WORKLOAD_KIND, job.namespace, name, workload["apiVersion"])
    if holder is not None and claim(job, holder) is not Claim.OURS:
        owner = f"{holder.controller_kind} {holder.controller}" if holder.controller else "none"
        message = Reason.NAME_CONFLICT.message(kind=kueue.WORKLOAD_KIND, name=name, owner=owner)
        raise KueueHold(Hold(Reason.NAME_CONFLICT, message))


async def _queue_tolerations(
    kube: Kube, link: KueueLink, namespace: str, queue: str
) -> list[dict[str, Any]]:
    """The tolerations of every ResourceFlavor the queue's ClusterQueue may admit with.

    The pods get their flavor's tolerations at admission; the Workload's pod sets must carry
    them from the start, because Kueue judges a node's taints by the pod sets alone (a
    tainted node the pod sets do not tolerate counts as unhealthy the moment its pods end,
    so a whole-gang restart would cost the admission). Nothing when the queue is unknown:
    Kueue then says so in the Workload's condition.
    """
    local = await kube.get_custom(kueue.GROUP, VERSION, "localqueues", queue, namespace)
    cluster_queue = ((local or {}).get("spec") or {}).get("clusterQueue")
    if not cluster_queue:
        return []
    found = await kube.get_custom(kueue.GROUP, VERSION, "clusterqueues", str(cluster_queue))
    groups = ((found or {}).get("spec") or {}).get("resourceGroups") or []
    flavors = sorted({str(f["name"]) for g in groups for f in g.get("flavors") or []})
    tolerations: list[dict[str, Any]] = []
    for name in flavors:
        with contextlib.suppress(LookupError):  # a flavor not created yet admits nothing
            flavor = await link.flavor(kube, name)
            add_tolerations(tolerations, (flavor.get("spec") or {}).get("tolerations") or [])
    return tolerations


async def admit(
    kube: Kube, link: KueueLink, workload: Mapping[str, Any], ev: Evaluation, pods: list[Any]
) -> list[dict[str, Any]]:
    """The pods with the Workload's admission applied: the flavors' node labels and
    tolerations, each pod's topology domain, and the keys Kueue counts its pods by."""
    assert ev.plan is not None
    admission = (workload.get("status") or {}).get("admission") or {}
    wanted = {
        str(flavor)
        for assignment in admission.get("podSetAssignments") or []
        for flavor in (assignment.get("flavors") or {}).values()
    }
    flavors = {name: await link.flavor(kube, name) for name in sorted(wanted)}
    try:
        per_pod = admit_pods(workload, flavors, kueue.pod_sets(ev.plan))
        return [
            apply_admission(pod, per_pod[int(pod["metadata"]["labels"][names.LABEL_POD_INDEX])])
            for pod in pods
        ]
    except AdmissionError as error:
        # Like Kueue's FailedToStart: the pod template cannot follow the admission.
        name = str(workload["metadata"]["name"])
        rule = f"cannot follow Kueue's admission of Workload {name}: {error}"
        raise ChildRejected("Pod", str(pods[0]["metadata"]["name"]), rule) from error


async def patch_status(kube: Kube, link: KueueLink, job: JobRef, actions: KueueActions) -> None:
    """Send the decision's Workload status patch. A conflict (Kueue wrote meanwhile) or a
    Workload gone is left to the next pass, which decides on the newer Workload."""
    patch = actions.status_patch
    if patch is None:
        return
    name = kueue.workload_name(job.name, job.uid)
    try:
        patched = await kube.patch_custom_status(
            kueue.GROUP, VERSION, kueue.WORKLOAD_PLURAL, job.namespace, name, patch
        )
        link.latest[job.uid] = (patched, time.monotonic())
    except ApiError as error:
        if error.status not in (404, 409):
            raise
        link.latest.pop(job.uid, None)
        logger.debug("Workload %s/%s: %s (next pass)", job.namespace, name, error.reason)
