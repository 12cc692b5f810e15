"""Spec edits while an attempt runs: the plan is fixed when the attempt starts.

An attempt's pods are built from one spec generation (``status.attemptGeneration``). While they
live, the job keeps that attempt's plan (status.plan, the placement, any pod of the attempt still
to create); an accepted edit takes effect at the next attempt, and the SpecUpdate condition says
so (runPolicy, the operator's own policy, applies at once). A spec the operator now refuses (an
edit the planner refuses, or an operator upgrade with stricter rules) never fails a running
attempt: it keeps running its recorded plan, the condition names the error, and only a new
attempt (a restart) needs a spec that passes.

The operator keeps each attempt's evaluated spec in memory (``Running``); after an operator
restart the current spec stands in for it when it still passes, else the attempt runs on with
the status it has (no plan to rebuild a pod from).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from meshrun_operator.conditions import is_true
from meshrun_operator.jobstatus import ConditionType, Reason
from meshrun_operator.lifecycle.evaluation import Evaluation
from meshrun_operator.lifecycle.phases import Draft
from meshrun_operator.seen.views import Observed

IMMEDIATE = "runPolicy"
"""The spec section that applies at once: the operator's own policy, not the pods'."""


@dataclass(frozen=True)
class Running:
    """The evaluated spec an attempt's pods were built from (the operator's memory)."""

    attempt: int
    """The attempt."""
    generation: int | None
    """Its spec generation."""
    evaluation: Evaluation
    """The spec and plan its pods were built from."""


def choose(
    draft: Draft, current: Evaluation, running: Running | None, observed: Observed
) -> Evaluation:
    """The evaluation to decide on: the current spec's, or the running attempt's plan with the
    current runPolicy. Sets the SpecUpdate condition. An evaluation without a plan (and without
    error) means: run the live attempt on with the status it has."""
    state, generation = draft.state, draft.generation
    ended = state.phase is not None and state.phase.finished
    if ended and current.error is not None and not is_true(draft.conditions, ConditionType.INVALID):
        # The job ended (not for its spec): what its spec is now changes nothing.
        return Evaluation(raw_spec=current.raw_spec, spec=current.spec)
    live = (
        state.phase is not None
        and not state.phase.finished
        and any(p.attempt == state.attempt and not p.deleting for p in observed.pods)
    )
    recorded = state.attempt_generation
    if not live or (current.error is None and recorded in (None, generation)):
        if live or current.error is None:
            message = Reason.APPLIED.message(attempt=state.attempt, generation=generation)
            draft.clear(ConditionType.SPEC_UPDATE, Reason.APPLIED, message)
        return current
    known = (
        running if running is not None and _is_attempt(running, state.attempt, recorded) else None
    )
    base = known.evaluation if known is not None else None
    if current.error is not None:
        reason = Reason.REFUSED_WHILE_RUNNING
        message = reason.message(error=current.error, attempt=state.attempt)
    elif base is not None and _same_but_policy(base.raw_spec, current.raw_spec):
        message = Reason.APPLIED.message(attempt=state.attempt, generation=generation)
        draft.clear(ConditionType.SPEC_UPDATE, Reason.APPLIED, message)
        return _with_policy(base, current)
    else:
        reason = Reason.NEXT_ATTEMPT
        message = reason.message(generation=generation, attempt=state.attempt, running=recorded)
    draft.condition(ConditionType.SPEC_UPDATE, True, reason, message)
    if base is None:
        base = current if current.error is None else None
    if base is None:
        return Evaluation(raw_spec=current.raw_spec, spec=current.spec)
    return _with_policy(base, current)


def _is_attempt(running: Running, attempt: int, generation: int | None) -> bool:
    return running.attempt == attempt and generation in (None, running.generation)


def _same_but_policy(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    return _strip(old) == _strip(new)


def _strip(spec: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in spec.items() if k != IMMEDIATE}


def _with_policy(base: Evaluation, current: Evaluation) -> Evaluation:
    """The attempt's plan and spec, with the current spec's runPolicy when it reads."""
    if base.spec is None or current.spec is None:
        return base
    spec = replace(base.spec, run_policy=current.spec.run_policy)
    return replace(base, spec=spec)
