"""What every child object shares: the owning job's identity, its metadata, and the ranks a pod
holds according to the plan."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from meshrun.api.crd import API_VERSION, GROUP, KIND
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
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": self.name,
            "namespace": self.namespace,
            "uid": self.uid,
        }


def owner_reference(job: JobRef) -> dict[str, Any]:
    """The controller owner reference every child carries."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": job.name,
        "uid": job.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def child_metadata(job: JobRef, name: str, labels: Mapping[str, str]) -> dict[str, Any]:
    """Name, namespace, ``labels`` plus the job's own (which ``labels`` cannot replace: they say
    whose child it is), and the owner reference."""
    own = {**names.job_labels(job.name, job.uid), names.LABEL_MANAGED_BY: names.MANAGED_BY}
    return {
        "name": name,
        "namespace": job.namespace,
        "labels": {**labels, **own},
        "ownerReferences": [owner_reference(job)],
    }


def operators_key(key: str) -> bool:
    """A label or annotation key the operator writes and reads itself (``meshrun.dev/...``,
    ``app.kubernetes.io/managed-by``), or one by which Kueue or a gang scheduler joins a pod
    to a queue or a gang (names.SCHEDULING_KEY_DOMAINS): a pod template may not set it."""
    domain = key.split("/", 1)[0]  # the whole key without a prefix (pod-group.scheduling...)
    return (
        key == names.LABEL_MANAGED_BY or domain == GROUP or domain in names.SCHEDULING_KEY_DOMAINS
    )


def users_keys(values: object) -> dict[str, str]:
    """A template's labels or annotations without the operator's own keys."""
    if not isinstance(values, Mapping):
        return {}
    return {str(k): str(v) for k, v in values.items() if not operators_key(str(k))}


class Claim(StrEnum):
    """Whose an object that holds a child's name is (:func:`claim`)."""

    OURS = "ours"
    """Its controller reference is the job's."""
    ORPHAN = "orphan"
    """No controller, and both meshrun labels with the job's name: left by an earlier
    incarnation of the job (``--cascade=orphan``); replaced (deleted under a uid and
    resourceVersion precondition, then created anew)."""
    PREDECESSOR = "predecessor"
    """Both meshrun labels with the job's name, controlled by another ParallelTrainingJob (an
    earlier job of the same name, being garbage-collected): waited for."""
    FOREIGN = "foreign"
    """Anything else (made by kubectl, Helm, another controller): never touched; the job says
    NameConflict."""


class Held(Protocol):
    """What :func:`claim` reads of the object that holds a name (client.answers.Holder)."""

    @property
    def controller(self) -> str | None: ...
    @property
    def controller_kind(self) -> str | None: ...
    @property
    def controller_api_version(self) -> str | None: ...
    @property
    def labels(self) -> Mapping[str, str]: ...


def claim(job: JobRef, holder: Held) -> Claim:
    """Whose an object of a child's name is, from its controller reference and labels. A
    reference counts as a ParallelTrainingJob's only with meshrun's API group: an
    ``evil.io/v1 ParallelTrainingJob`` is someone else's kind."""
    controller_uid = holder.controller
    group = (holder.controller_api_version or "").partition("/")[0]
    a_job = holder.controller_kind == KIND and group == GROUP
    if controller_uid is not None and controller_uid == job.uid and a_job:
        return Claim.OURS
    marks = holder.labels if isinstance(holder.labels, Mapping) else {}
    meshrun = (
        marks.get(names.LABEL_JOB) == job.name
        and marks.get(names.LABEL_MANAGED_BY) == names.MANAGED_BY
    )
    if not meshrun:
        return Claim.FOREIGN
    if controller_uid is None:
        return Claim.ORPHAN
    return Claim.PREDECESSOR if a_job else Claim.FOREIGN


def pod_ranks(plan: Plan, index: int) -> range:
    """Global ranks of pod ``index``: consecutive ranks share a pod (the planner's rank order)."""
    per_pod = plan.num_proc_per_node
    return range(index * per_pod, (index + 1) * per_pod)


def pod_stage(plan: Plan, index: int) -> int:
    """Pipeline stage of pod ``index``: the stage of its first rank (a pod holds one stage
    whenever the sizes allow, see the planner's rank order)."""
    return plan.coords(pod_ranks(plan, index).start).pp
