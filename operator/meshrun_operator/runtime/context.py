"""What every reconcile shares: the API door, the knobs, per-job locks and the operator's memory of
its own writes."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from meshrun_operator import metrics
from meshrun_operator.children.netpolicy import PolicyOptions
from meshrun_operator.client.kube import Kube
from meshrun_operator.lifecycle.evaluation import Evaluations
from meshrun_operator.lifecycle.specedits import Running
from meshrun_operator.runtime.ownstatus import StatusLedger
from meshrun_operator.seen.expectations import Expectations, Tombstones
from meshrun_operator.seen.progress import ProgressReader
from meshrun_operator.seen.views import Refusal
from meshrun_operator.timing import Timing

if TYPE_CHECKING:
    from meshrun_operator.children.placer import Placer
    from meshrun_operator.runtime.kueue_link import KueueLink


@dataclass
class OperatorContext:
    """What every reconcile shares: the API door, the knobs and per-job memory."""

    kube: Kube
    """Asynchronous API calls."""
    timing: Timing = field(default_factory=Timing)
    """Backoff and grace periods."""
    resync_seconds: float = 2.0
    """Interval of the periodic resync of every job (deadlines, backoff, gang timeout)."""
    progress: ProgressReader = field(default_factory=lambda: ProgressReader(enabled=False))
    """Reader of the trainer's /progress endpoint."""
    phases: metrics.PhaseBook = field(default_factory=metrics.PhaseBook)
    """Phase of every job for the jobs-by-phase gauge."""
    locks: dict[str, asyncio.Lock] = field(default_factory=dict)
    """One lock per job uid: two reconciles of one job never overlap."""
    tombstones: Tombstones = field(default_factory=Tombstones)
    """The last state of pods deleted since their job's last reconcile (from the watch)."""
    attempts: dict[str, Running] = field(default_factory=dict)
    """By uid, the evaluated spec the job's current attempt's pods were built from."""
    expectations: Expectations = field(init=False)
    """Creates and deletes sent but not yet seen by the watch (expectations.py)."""
    latest: dict[str, dict[str, Any]] = field(default_factory=dict)
    """The job as our last patch left it, by uid: the watch may deliver a body older than our
    own last write, and deciding on it would undo that write."""
    unwritten: dict[str, tuple[dict[str, Any], dict[str, Any]]] = field(default_factory=dict)
    """By uid, (the status a decision started from, the status it could not write): after a
    write conflict the next pass starts from the status the operator meant to write, as long
    as nobody else changed the status meanwhile, so no restart or clock is lost."""
    refusals: dict[str, Refusal] = field(default_factory=dict)
    """By uid, the creates the API server refused in the job's last pass: the next pass
    decides on them (``Observed.refused``)."""
    kueue: KueueLink | None = None
    """Kueue's Workloads and the operator's writes to them; None when run with --no-kueue."""
    node_labels: Any = None
    """kopf's index of node labels (the topology domains status.placement shows), or None."""
    placer: Placer | None = None
    """Chooses the topology domains of each job's stages (placer.py); None without the node
    watch."""
    network_policy: PolicyOptions | None = None
    """The NetworkPolicy each job gets (netpolicy.py); None: none (--no-network-policy)."""
    children: dict[str, Any] = field(default_factory=dict)
    """Kind -> kopf's index of the jobs' children of that kind (Service, NetworkPolicy) by
    (namespace, job name), holding their controllers' uids; empty when not watched."""
    evaluations: Evaluations = field(default_factory=Evaluations)
    """Each job's spec, read and planned once per generation."""
    status_interval_seconds: float = 10.0
    """A status change that only tells how a launch or a run goes is written at most this
    often (writes.py)."""
    deferred: dict[str, float] = field(default_factory=dict)
    """By uid, since when (monotonic) a decided status waits to be written."""
    statuses: StatusLedger = field(default_factory=StatusLedger)
    """The status the operator last wrote (or first found) of each job: one someone else
    wrote is not decided on, but restored (ownstatus.py)."""

    def __post_init__(self) -> None:
        self.expectations = Expectations(self.timing.expectations_timeout_seconds)

    def missing_children(self, namespace: str, name: str, uid: str) -> tuple[str, ...]:
        """Kinds of the job's watched children of which the watch shows none of the job's as
        the operator made it (deleted, or its labels or selector edited: children/drift.py)."""
        missing = []
        for kind, index in self.children.items():
            marks = index.get((namespace, name), ()) if index is not None else ()
            if not any(m.owner == uid and m.intact for m in marks):
                missing.append(kind)
        return tuple(missing)

    def forget(self, uid: str) -> None:
        """Drop everything kept about a deleted job."""
        self.phases.set(uid, None)
        self.locks.pop(uid, None)
        self.expectations.forget(uid)
        self.tombstones.forget(uid)
        self.attempts.pop(uid, None)
        self.latest.pop(uid, None)
        self.unwritten.pop(uid, None)
        self.refusals.pop(uid, None)
        self.evaluations.forget(uid)
        self.deferred.pop(uid, None)
        self.statuses.forget(uid)
        if self.kueue is not None:
            self.kueue.forget(uid)
        if self.placer is not None:
            self.placer.forget(uid)
