"""Elastic data parallelism (``spec.elastic``): the job runs at the data-parallel degree the
capacity allows, between ``minDataParallel`` and ``maxDataParallel``.

Pure decisions on a Draft, used by lifecycle.decide. ``status.dataParallel`` is the degree
running now; the pods of an attempt are built from the plan at that degree
(meshrun.planner.elastic.resized: the same TP/PP and global batch, more or less gradient
accumulation), so the printer columns ``Layout`` and ``Procs`` (``status.layout``,
``status.gpus`` and ``status.worldSize``) follow it while ``status.plan`` keeps the planned
layout.

Shrink: pods of the attempt that the scheduler could not place (PodScheduled False: a lost
node, a cordon, a preemption) for ``shrinkAfterSeconds`` -> the largest allowed degree whose
pods fit the capacity (the node watch's count, else the pods that did get a node), if it is
smaller. Grow: room for a larger allowed degree (never above ``maxDataParallel``, by default the
planned degree) for ``growAfterSeconds``, and a checkpoint written since the room appeared ->
that degree. Either way the gang restarts from its latest checkpoint as a disruption (not
counted against backoffLimit), and ``status.resizes`` and an Event say why and at which step.
A job under Kueue keeps the size Kueue admitted.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from meshrun.api.errors import SpecError
from meshrun.api.spec import JobSpec
from meshrun.planner.elastic import elastic_degrees, largest_fitting, pods_at, resized
from meshrun.planner.plan import Plan
from meshrun_operator.clock import format_time, parse_time
from meshrun_operator.jobstatus import PodPhase, Reason
from meshrun_operator.lifecycle.columns import running_size
from meshrun_operator.lifecycle.evaluation import Evaluation
from meshrun_operator.lifecycle.failure.classes import Failure, FailureClass
from meshrun_operator.lifecycle.phases import Draft
from meshrun_operator.seen.views import Observed, PodView

RESIZES_KEPT = 20
"""Entries of status.resizes kept (the newest)."""
UNSCHEDULABLE = ("PodScheduled", "False")
"""The condition the scheduler sets on a pod it cannot place."""


def sized(
    draft: Draft, ev: Evaluation, observed: Observed, queued: bool
) -> tuple[Evaluation, bool]:
    """The evaluation to run the attempt at (the plan at status.dataParallel), and whether the
    job resizes now (then the attempt is already torn down). Without spec.elastic: ``ev``."""
    spec, plan = ev.spec, ev.plan
    if spec is None or plan is None:
        return ev, False
    if spec.elastic is None:
        return _no_longer_elastic(draft, ev, observed), False
    derived = draft.derived
    recorded = derived.get("dataParallel")
    current = recorded if isinstance(recorded, int) else plan.layout.dp
    spec_at, at = _at(spec, plan, current)
    current = at.layout.dp
    old = draft.old_phase
    idle = queued or spec.run_policy.suspend or (old is not None and old.finished)
    if queued:
        # Kueue decides the size: what it admitted (partial admission), else the planned one.
        admitted = _admitted_pods(observed)
        spec_at, at = spec, plan
        if admitted is not None:
            fitting = largest_fitting(spec, plan, admitted, below=plan.layout.dp)
            spec_at, at = _at(spec, plan, fitting or plan.layout.dp)
        current = at.layout.dp
    target, stuck = (None, 0) if idle else _target(draft, spec, plan, at, observed)
    resizing = target is not None and target != current
    if target is not None and resizing:
        spec_at, at = _at(spec, plan, target)
    derived["dataParallel"] = at.layout.dp
    derived.update(running_size(at))
    if resizing:
        _resize(draft, spec, current, at, observed, stuck)
    if at is plan:
        return ev, resizing
    return Evaluation(raw_spec=ev.raw_spec, spec=spec_at, plan=at), resizing


def _no_longer_elastic(draft: Draft, ev: Evaluation, observed: Observed) -> Evaluation:
    """A job whose spec.elastic was removed while it ran resized: its live attempt goes on at
    the degree its pods were built for (a pod added at the planned size would not fit that
    gang); the next attempt runs the planned size. Any other job: ``ev`` as it is."""
    assert ev.spec is not None and ev.plan is not None
    recorded = draft.derived.get("dataParallel")
    if not isinstance(recorded, int):
        return ev
    live = any(p.attempt == draft.attempt and not p.deleting for p in observed.pods)
    if not live or recorded == ev.plan.layout.dp:
        draft.derived["dataParallel"] = None
        return ev
    spec_at, at = _at(ev.spec, ev.plan, recorded)
    draft.derived.update(running_size(at))
    return Evaluation(raw_spec=ev.raw_spec, spec=spec_at, plan=at)


def admission_floor(spec: JobSpec, plan: Plan) -> int | None:
    """The ``minCount`` of an elastic job's Workload: the pods of its smallest allowed degree,
    so Kueue may admit fewer pods than planned (partial admission). Only when its pods form one
    pod set (no pipeline stages: Kueue reduces each pod set's count on its own); None else."""
    if spec.elastic is None or plan.layout.pp > 1:
        return None
    degrees = [d for d in elastic_degrees(spec, plan) if d <= plan.layout.dp]
    low = degrees[0] if degrees else None
    if low is None or low >= plan.layout.dp:
        return None
    return pods_at(spec, plan, low)


def _admitted_pods(observed: Observed) -> int | None:
    """The pods Kueue admitted the job's one pod set with, or None (not admitted, or several
    pod sets)."""
    view = observed.kueue
    workload = view.workload if view is not None else None
    admission = ((workload or {}).get("status") or {}).get("admission") or {}
    assignments = admission.get("podSetAssignments") or []
    count = assignments[0].get("count") if len(assignments) == 1 else None
    return count if isinstance(count, int) else None


def _at(spec: JobSpec, plan: Plan, dp: int) -> tuple[JobSpec, Plan]:
    """The job at ``dp``; the planned job when that degree no longer plans (a spec edit)."""
    try:
        return resized(spec, plan, dp)
    except SpecError:
        return spec, plan


def _target(
    draft: Draft, spec: JobSpec, plan: Plan, at: Plan, observed: Observed
) -> tuple[int | None, int]:
    """The degree to resize to now (or None) and the pods that could not be scheduled; keeps
    the clocks in status.elastic."""
    elastic, now = spec.elastic, draft.now
    assert elastic is not None
    clocks: dict[str, Any] = dict(draft.derived.get("elastic") or {})
    attempt = [p for p in observed.pods if p.attempt == draft.attempt and not p.deleting]
    stuck = [p for p in attempt if not p.node and UNSCHEDULABLE in p.conditions]
    current, target = at.layout.dp, None
    short = parse_time(clocks.get("shortSince"))
    if stuck:
        short = short or now
        if now - short >= timedelta(seconds=elastic.shrink_after_seconds):
            pods = _room_to_shrink_to(attempt, observed.capacity)
            smaller = largest_fitting(spec, plan, pods, below=current - 1)
            target = smaller
    elif attempt:
        short = None  # the gang is placed; between attempts the clock keeps running
    room = _room(draft, spec, plan, at, attempt, observed, clocks, stuck)
    if target is None and room is not None:
        target = room
    draft.derived["elastic"] = {
        "shortSince": format_time(short) if short and target is None else None,
        "roomSince": clocks.get("roomSince") if target is None else None,
        "roomStep": clocks.get("roomStep") if target is None else None,
    }
    return target, len(stuck)


def _room_to_shrink_to(attempt: list[PodView], capacity: int | None) -> int:
    """Pods the shrunk job may count on: those of the attempt the scheduler placed (proven
    room), fewer if the node watch counts fewer; the node watch's count alone when none was
    placed (a gang scheduler binds all pods or none)."""
    bound = sum(1 for p in attempt if p.node)
    if capacity is None:
        return bound
    return min(bound, capacity) if bound else capacity


def _room(
    draft: Draft,
    spec: JobSpec,
    plan: Plan,
    at: Plan,
    attempt: list[PodView],
    observed: Observed,
    clocks: dict[str, Any],
    stuck: list[PodView],
) -> int | None:
    """A larger degree the job may grow to now (room lasted growAfterSeconds and a checkpoint
    was written since it appeared); updates ``clocks``."""
    elastic = spec.elastic
    assert elastic is not None
    whole = len(attempt) == at.num_nodes
    running = whole and all(p.phase == PodPhase.RUNNING and p.node for p in attempt)
    larger = None
    if running and not stuck and observed.capacity is not None:
        larger = largest_fitting(spec, plan, observed.capacity)
    if larger is None or larger <= at.layout.dp:
        clocks.update(roomSince=None, roomStep=None)
        return None
    step = _checkpointed(spec, draft, observed)
    since = parse_time(clocks.get("roomSince")) or draft.now
    saved = clocks.get("roomStep")
    saved = saved if isinstance(saved, int) else step
    clocks.update(roomSince=format_time(since), roomStep=saved)
    waited = draft.now - since >= timedelta(seconds=elastic.grow_after_seconds)
    # A trainer that reports no step (an entrypoint of the user's own) gives no checkpoint
    # boundary to wait for: the job grows once the room has lasted.
    boundary = step is None or saved is None or step > saved
    return larger if waited and boundary else None


def _checkpointed(spec: JobSpec, draft: Draft, observed: Observed) -> int | None:
    """The step of the latest checkpoint the trainer has written, by the step it reports now
    (else the one the status has); None when it reports none."""
    every = spec.training.checkpoint.every_steps
    pod0 = next((p for p in observed.pods if p.index == 0 and p.attempt == draft.attempt), None)
    progress = observed.progress or (pod0.progress if pod0 else None)
    progress = progress or draft.derived.get("progress")
    step = progress.get("step") if isinstance(progress, Mapping) else None
    if not isinstance(step, int):
        return None
    return step // every * every if every else 0


def _resize(
    draft: Draft,
    spec: JobSpec,
    old: int,
    at: Plan,
    observed: Observed,
    stuck: int,
) -> None:
    """Record the resize and restart the gang at the new degree as a disruption."""
    elastic = spec.elastic
    assert elastic is not None
    new = at.layout.dp
    step = _checkpointed(spec, draft, observed) or 0
    layout = at.layout.text()
    if new < old:
        reason = Reason.SHRINK
        seconds = elastic.shrink_after_seconds
        message = reason.message(
            stuck=stuck, seconds=seconds, old=old, new=new, layout=layout, step=step
        )
    else:
        reason, seconds = Reason.GROW, elastic.grow_after_seconds
        message = reason.message(seconds=seconds, old=old, new=new, layout=layout, step=step)
    record = {
        "fromDataParallel": old,
        "toDataParallel": new,
        "reason": reason.value,
        "step": step,
        "layout": layout,
        "time": format_time(draft.now),
    }
    draft.derived["resizes"] = [*(draft.derived.get("resizes") or []), record][-RESIZES_KEPT:]
    attempt = [p for p in observed.pods if p.attempt == draft.attempt and not p.deleting]
    draft.failure(Failure(FailureClass.IGNORED, reason, message), None, spec, attempt)
