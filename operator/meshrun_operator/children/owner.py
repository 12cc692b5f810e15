"""What every child object shares: the owning job's identity, its metadata, and the ranks a pod
holds according to the plan."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from meshrun.planner.plan import Plan
from meshrun_operator import names


@dataclass(frozen=True)
class JobRef:
    """Identity of the ParallelTrainingJob that owns the children."""

    name: str
    """metadata.name of the job."""
    namespace: str
    """metadata.namespace of the job (children live there too)."""
    uid: str
    """metadata.uid, for owner references (garbage collection deletes children with the job)."""

    @classmethod
    def of(cls, job: Mapping[str, Any]) -> JobRef:
        """The reference of a job object."""
        meta = job["metadata"]
        return cls(meta["name"], meta["namespace"], meta["uid"])

    def object_reference(self) -> dict[str, str]:
        """The job as an Event's ``involvedObject``."""
        return {
            "apiVersion": names.API_VERSION,
            "kind": names.KIND,
            "name": self.name,
            "namespace": self.namespace,
            "uid": self.uid,
        }


def owner_reference(job: JobRef) -> dict[str, Any]:
    """The controller owner reference every child carries."""
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.KIND,
        "name": job.name,
        "uid": job.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def child_metadata(job: JobRef, name: str, labels: Mapping[str, str]) -> dict[str, Any]:
    """Name, namespace, the job's labels plus ``labels``, and the owner reference."""
    return {
        "name": name,
        "namespace": job.namespace,
        "labels": {names.LABEL_JOB: job.name, names.LABEL_MANAGED_BY: names.MANAGED_BY, **labels},
        "ownerReferences": [owner_reference(job)],
    }


def pod_ranks(plan: Plan, index: int) -> range:
    """Global ranks of pod ``index``: consecutive ranks share a pod (the planner's rank order)."""
    per_pod = plan.num_proc_per_node
    return range(index * per_pod, (index + 1) * per_pod)


def pod_stage(plan: Plan, index: int) -> int:
    """Pipeline stage of pod ``index``: the stage of its first rank (a pod holds one stage
    whenever the sizes allow, see the planner's rank order)."""
    return plan.coords(pod_ranks(plan, index).start).pp
