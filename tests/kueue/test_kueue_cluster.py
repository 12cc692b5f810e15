"""The real Kueue v0.17 next to the local control plane, fed with Workloads that
meshrun_operator.kueue builds for real ParallelTrainingJobs (suspended, so no operator starts
pods for them): Kueue's webhooks accept them, quota admits or queues them with a reason,
deleting a job gives its quota back, a higher priority preempts, and the operator's status
patches (PodsReady, release after eviction, Finished) are what Kueue acts on.

The module takes well under two minutes once Kueue is built; the timeout also covers a cold
build of the Kueue manager by the session fixture.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import kueue_objects as ko
import pytest
from kueue_factories import make_pods, pipeline_spec
from kueue_support import (
    Kubectl,
    KueueEnv,
    create,
    get_json,
    patch_status,
    priority_value,
    wait_state,
)
from meshrun_operator import kueue, names
from meshrun_operator.kueue_admission import admit_pods
from meshrun_operator.kueue_state import (
    PODS_READY,
    REQUEUED,
    WorkloadPhase,
    WorkloadState,
    condition,
    finished_patch,
    pods_ready_patch,
    release_patch,
)

from meshrun.planner import plan_job

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(1800)]
RACK = kueue.TopologyRequest(ko.RACK_LABEL, required=True)


@dataclass(frozen=True)
class QueuedJob:
    """A suspended ParallelTrainingJob and the Workload built for it."""

    name: str
    namespace: str
    workload: str
    sets: list[kueue.PodSetPlan]


Submit = Callable[..., QueuedJob]


@pytest.fixture
def submit(
    kueue_env: KueueEnv, kueue_pool: str, kubectl: Kubectl, crds_installed: list[str]
) -> Iterator[Submit]:
    """``submit(team, num_nodes, pp, priority_class=None, queue=None)``: a job of
    ``num_nodes`` pods x 8 GPUs in ``pp`` pipeline stages, queued through its Workload."""
    created: list[tuple[str, str]] = []

    def make(
        team: str,
        num_nodes: int,
        pp: int,
        priority_class: str | None = None,
        queue: str | None = None,
    ) -> QueuedJob:
        namespace = kueue_env.namespaces[team]
        name = f"train-{uuid.uuid4().hex[:5]}"
        spec: dict[str, Any] = {
            **pipeline_spec(num_nodes, 8, pp),
            "runPolicy": {"suspend": True},
            "scheduling": {"queueName": queue or team},
        }
        job = {
            "apiVersion": names.API_VERSION,
            "kind": names.KIND,
            "metadata": {"name": name, "namespace": namespace},
            "spec": spec,
        }
        create(kubectl, job)
        created.append((namespace, name))
        uid = get_json(kubectl, names.PLURAL, name, "-n", namespace)["metadata"]["uid"]
        plan = plan_job(spec, name=name)
        request = kueue.WorkloadRequest(
            job_name=name,
            namespace=namespace,
            uid=uid,
            queue_name=queue or team,
            priority_class=priority_class,
            priority=priority_value(kubectl, priority_class) if priority_class else None,
            topology=RACK,
        )
        owner = {
            "apiVersion": names.API_VERSION,
            "kind": names.KIND,
            "name": name,
            "uid": uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
        create(kubectl, kueue.build_workload(request, plan, make_pods(num_nodes), owner))
        return QueuedJob(name, namespace, kueue.workload_name(name, uid), kueue.pod_sets(plan))

    yield make
    for namespace, name in created:
        kubectl("delete", names.PLURAL, name, "-n", namespace, "--wait=false", check=False)


def _state_of(
    kubectl: Kubectl, job: QueuedJob, phase: WorkloadPhase, what: str = "", saying: str = ""
) -> WorkloadState:
    """Wait until the job's Workload is in ``phase`` with ``saying`` in Kueue's message."""
    return wait_state(
        kubectl,
        job.namespace,
        job.workload,
        lambda s: s.phase is phase and saying in s.message,
        what or str(phase),
    )


def _placement(kubectl: Kubectl, job: QueuedJob) -> dict[int, dict[str, str]]:
    """Per pod index, the labels of the node its admission places it on."""
    live = get_json(kubectl, kueue.WORKLOAD_PLURAL, job.workload, "-n", job.namespace)
    flavor = get_json(kubectl, "resourceflavors", ko.FLAVOR)
    pods = admit_pods(live, {ko.FLAVOR: flavor}, job.sets)
    nodes = {
        n["metadata"]["name"]: n["metadata"]["labels"]
        for n in get_json(kubectl, "nodes", "-l", f"{ko.POOL_LABEL}={ko.POOL}")["items"]
    }
    placement = {}
    for index, admission in pods.items():
        assert admission.node_selector[ko.POOL_LABEL] == ko.POOL
        assert admission.tolerations == ko.cluster_objects()[1]["spec"]["tolerations"]
        assert admission.annotations[kueue.REQUIRED_TOPOLOGY_ANNOTATION] == ko.RACK_LABEL
        placement[index] = nodes[admission.node_selector[ko.HOST_LABEL]]
    return placement


def _one_rack_per_stage(job: QueuedJob, placement: dict[int, dict[str, str]]) -> None:
    for pod_set in job.sets:
        racks = {placement[i][ko.RACK_LABEL] for i in pod_set.pod_indices}
        assert len(racks) == 1, f"{pod_set.name} spans racks {racks}"
    hosts = [labels[ko.HOST_LABEL] for labels in placement.values()]
    assert len(set(hosts)) == len(hosts), f"two 8-GPU pods on one node: {hosts}"


def test_quota_admits_queues_with_a_reason_and_a_deleted_job_gives_it_back(
    submit: Submit, kubectl: Kubectl
) -> None:
    # Equal priorities: the second job cannot preempt the first.
    first = submit("team-a", num_nodes=2, pp=2, priority_class="meshrun-low")  # 16 of 32 GPUs
    _state_of(kubectl, first, WorkloadPhase.ADMITTED)
    _one_rack_per_stage(first, _placement(kubectl, first))

    second = submit("team-b", num_nodes=4, pp=2, priority_class="meshrun-low")  # 32 more
    queued = _state_of(kubectl, second, WorkloadPhase.PENDING, "queued for lack of quota", "quota")
    expected = f"insufficient unused quota for nvidia.com/gpu in flavor {ko.FLAVOR}, 16 more needed"
    assert expected in queued.message, queued.message
    listing = kubectl("get", "workloads", "-n", second.namespace).stdout
    assert second.workload in listing and f"paralleltrainingjob-{second.name}-" in listing

    # Deleting the first job deletes its Workload (owner reference): the second one fits.
    kubectl("delete", names.PLURAL, first.name, "-n", first.namespace)
    _state_of(kubectl, second, WorkloadPhase.ADMITTED, "admitted once the first job is gone")
    gone = kubectl("get", "workloads", first.workload, "-n", first.namespace, check=False)
    assert gone.returncode != 0 and "NotFound" in gone.stderr
    _one_rack_per_stage(second, _placement(kubectl, second))


def test_a_higher_priority_preempts_and_the_victim_queues_again(
    submit: Submit, kubectl: Kubectl
) -> None:
    victim = submit("team-b", num_nodes=4, pp=2, priority_class="meshrun-low")
    _state_of(kubectl, victim, WorkloadPhase.ADMITTED)
    # The operator's PodsReady report is accepted by Kueue (its pods would be running now).
    assert patch_status(
        kubectl,
        victim.namespace,
        victim.workload,
        lambda wl, now: pods_ready_patch(wl, True, "all 4 pods running", now),
    )
    ready = condition(
        get_json(kubectl, "workloads", victim.workload, "-n", victim.namespace), PODS_READY
    )
    assert ready is not None and (ready["status"], ready["reason"]) == ("True", "Started")

    urgent = submit("team-a", num_nodes=2, pp=2, priority_class="meshrun-high")
    evicted = _state_of(kubectl, victim, WorkloadPhase.EVICTED, "evicted by the urgent job")
    assert evicted.preempted and evicted.preempted_by == "InClusterQueue", evicted
    assert evicted.reason == "Preempted"
    assert _pending_or_reserved(kubectl, urgent)

    # The operator deletes the victim's pods, then clears the admission: the quota moves.
    assert patch_status(kubectl, victim.namespace, victim.workload, release_patch)
    _state_of(kubectl, urgent, WorkloadPhase.ADMITTED, "admitted after the preemption")
    requeued = _state_of(kubectl, victim, WorkloadPhase.PENDING, "queued again")
    live = get_json(kubectl, "workloads", victim.workload, "-n", victim.namespace)
    assert (condition(live, REQUEUED) or {}).get("status") == "True"

    # The urgent job ends: Finished gives its quota back and the victim resumes its place.
    assert patch_status(
        kubectl,
        urgent.namespace,
        urgent.workload,
        lambda wl, now: finished_patch(wl, True, "every pod exited 0", now),
    )
    _state_of(kubectl, urgent, WorkloadPhase.FINISHED)
    _state_of(kubectl, victim, WorkloadPhase.ADMITTED, "admitted again after the urgent job")
    assert requeued.queued


def _pending_or_reserved(kubectl: Kubectl, job: QueuedJob) -> bool:
    """The preemptor is not admitted while the victim still holds the quota."""
    live = get_json(kubectl, "workloads", job.workload, "-n", job.namespace)
    admitted = condition(live, "Admitted")
    return admitted is None or admitted.get("status") != "True"


def test_a_queue_that_does_not_exist_is_named_in_the_reason(
    submit: Submit, kubectl: Kubectl
) -> None:
    lost = submit("team-a", num_nodes=2, pp=2, queue="team-z")
    state = _state_of(kubectl, lost, WorkloadPhase.PENDING, "pending, naming the queue", "team-z")
    assert (state.reason, state.message) == ("Inadmissible", "LocalQueue team-z doesn't exist")
