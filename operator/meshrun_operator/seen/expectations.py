"""Creates and deletes the operator sent but the watch has not shown yet, per job (the Job
controller's expectations), and the last state of deleted pods (tombstones).

The watch cache lags the API server by milliseconds to seconds, and by more for a large gang. A
pod whose create was sent is in flight until the watch shows it, however long that takes, so it
is neither created twice nor taken for a pod that vanished; a pod whose delete was sent counts
as deleting until the watch shows it so, so it is not deleted twice. An expectation the watch
never meets (a lost event) expires after ``timeout`` seconds, and the pod is judged by what the
watch shows.

Tombstones: the watch's last word on a deleted pod (its DELETED event) is kept until its job's
next reconcile, so a pod of the running attempt that vanished between two passes is still judged
by its last state (a DisruptionTarget condition makes its deletion a disruption).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from meshrun_operator.seen.views import PodView, pod_view

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
    """The last state of deleted pods, by their controller's uid, until a reconcile takes it."""

    def __init__(self) -> None:
        self.by_job: dict[str, dict[str, tuple[PodView, float]]] = {}

    def record(self, body: Mapping[str, Any]) -> str | None:
        """Keep a deleted pod's last state; the uid of its job (its controller), if any."""
        view, now = pod_view(body), time.monotonic()
        if view.owner_uid is None:
            return None
        self.by_job.setdefault(view.owner_uid, {})[view.uid] = (view, now)
        for job in list(self.by_job):
            kept = {k: v for k, v in self.by_job[job].items() if now - v[1] < TOMBSTONE_SECONDS}
            if kept:
                self.by_job[job] = kept
            else:
                del self.by_job[job]
        return view.owner_uid

    def of(self, job: str) -> tuple[PodView, ...]:
        """The tombstones of ``job``'s pods."""
        return tuple(view for view, _ in (self.by_job.get(job) or {}).values())

    def drop(self, job: str, uids: Iterable[str]) -> None:
        """Forget the tombstones a reconcile has decided on."""
        kept = self.by_job.get(job) or {}
        for uid in uids:
            kept.pop(uid, None)
        if not kept:
            self.by_job.pop(job, None)

    def forget(self, job: str) -> None:
        self.by_job.pop(job, None)
