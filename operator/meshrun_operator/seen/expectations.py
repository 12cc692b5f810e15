"""Creates and deletes the operator sent but the watch has not shown yet, per job (the Job
controller's expectations), and the last state of deleted pods (tombstones).

The watch cache lags the API server by milliseconds to seconds, and by more for a large gang. A
pod whose create was sent is in flight until the watch shows it, however long that takes, so it
is neither created twice nor taken for a pod that vanished; a pod whose delete was sent counts
as deleting until the watch shows it so, so it is not deleted twice. An expectation the watch
never meets (a lost event) expires after ``timeout`` seconds, and the pod is judged by what the
watch shows.

Tombstones: the watch's last word on a deleted pod (its DELETED event) is kept, under its
namespace and job name and only when that job is its controller, until the job's next
reconcile, so a pod of the running attempt that vanished between two passes is still judged by
its last state (a DisruptionTarget condition makes its deletion a disruption).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from meshrun_operator.seen.views import PodView, owning_job, pod_view

TOMBSTONE_SECONDS = 600.0
"""A tombstone no reconcile asked for (its job is gone) is dropped after this long."""


class Expectations:
    """In-flight creates (pod name -> attempt, deadline) and deletes (pod uid -> deadline)."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.creates: dict[str, dict[str, tuple[int, float]]] = {}
        self.deletes: dict[str, dict[str, float]] = {}

    def expect_creates(self, job: str, attempt: int, pods: Iterable[str]) -> None:
        """Creates of ``pods`` (names) of ``attempt`` are about to be sent."""
        deadline = time.monotonic() + self.timeout
        self.creates.setdefault(job, {}).update({name: (attempt, deadline) for name in pods})

    def not_created(self, job: str, pod: str) -> None:
        """A create failed or found the name taken: nothing is in flight."""
        self.creates.get(job, {}).pop(pod, None)

    def expect_deletes(self, job: str, uids: Iterable[str]) -> None:
        """Deletes of the pods with these uids are about to be sent."""
        deadline = time.monotonic() + self.timeout
        self.deletes.setdefault(job, {}).update({uid: deadline for uid in uids if uid})

    def settle(self, job: str, pods: Iterable[PodView]) -> tuple[frozenset[str], frozenset[str]]:
        """Drop what the watch has shown (or what expired); the names still being created and
        the uids still being deleted."""
        now, pods = time.monotonic(), list(pods)
        seen = {(p.name, p.attempt) for p in pods}
        live = {p.uid for p in pods if not p.deleting}
        creates = {
            name: (attempt, deadline)
            for name, (attempt, deadline) in self.creates.pop(job, {}).items()
            if deadline > now and (name, attempt) not in seen
        }
        deletes = {
            uid: deadline
            for uid, deadline in self.deletes.pop(job, {}).items()
            if deadline > now and uid in live
        }
        if creates:
            self.creates[job] = creates
        if deletes:
            self.deletes[job] = deletes
        return frozenset(creates), frozenset(deletes)

    def pending(self, job: str) -> bool:
        """Whether a create or delete of the job's is still unconfirmed (the watch has not shown
        it, and it has not expired: a pass must look again when it does)."""
        return bool(self.creates.get(job) or self.deletes.get(job))

    def forget(self, job: str) -> None:
        self.creates.pop(job, None)
        self.deletes.pop(job, None)


class Tombstones:
    """The last state of deleted pods, by the namespace and job-name label of each, until a
    reconcile of that job takes it.

    A tombstone counts for a job only when the pod's controller is that job
    (``PodView.owner_uid``: a ParallelTrainingJob of meshrun.dev, of the label's name, with the
    job's uid) in the job's namespace: a pod anywhere else that names the job's uid in an
    ownerReference of its own making is no pod of the job's, and its exit cannot fail it.
    """

    def __init__(self) -> None:
        self.by_job: dict[tuple[str, str], dict[str, tuple[PodView, float]]] = {}
        """(namespace, job name) -> pod uid -> (its last state, when it was recorded)."""

    def record(self, body: Mapping[str, Any]) -> tuple[str, str, str] | None:
        """Keep a deleted pod's last state; (namespace, name, uid) of the job that controls it,
        or None (and nothing kept) when no job does."""
        owner = owning_job(body.get("metadata") or {})
        if owner is None:
            return None
        view, now = pod_view(body), time.monotonic()
        self.by_job.setdefault(owner[:2], {})[view.uid] = (view, now)
        self._keep(lambda _, recorded: now - recorded < TOMBSTONE_SECONDS)
        return owner

    def of(self, namespace: str, name: str, uid: str) -> tuple[PodView, ...]:
        """The tombstones of the pods of job ``name`` in ``namespace`` whose controller is the
        job of ``uid`` (not a predecessor of the same name)."""
        found = (self.by_job.get((namespace, name)) or {}).values()
        return tuple(view for view, _ in found if view.owner_uid == uid)

    def drop(self, namespace: str, name: str, uids: Iterable[str]) -> None:
        """Forget the tombstones a reconcile has decided on."""
        kept = self.by_job.get((namespace, name)) or {}
        for uid in uids:
            kept.pop(uid, None)
        if not kept:
            self.by_job.pop((namespace, name), None)

    def forget(self, uid: str) -> None:
        """Forget the tombstones of the pods of the job of ``uid`` (deleted)."""
        self._keep(lambda view, _: view.owner_uid != uid)

    def _keep(self, wanted: Callable[[PodView, float], bool]) -> None:
        """Keep the tombstones ``wanted`` (given the view and when it was recorded) says to."""
        for key in list(self.by_job):
            kept = {k: v for k, v in self.by_job[key].items() if wanted(*v)}
            if kept:
                self.by_job[key] = kept
            else:
                del self.by_job[key]
