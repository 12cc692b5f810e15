"""A job spec checked once per reconcile: read into types (CRD defaults applied), planned."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from meshrun.errors import SpecError
from meshrun.inputs import plan_checked
from meshrun.planner import Plan
from meshrun.spec import JobSpec
from meshrun.specread import read_spec
from meshrun_operator.state import InvalidSpec


@dataclass(frozen=True)
class Evaluation:
    """A spec checked once: read, its rules checked and planned, or the error."""

    spec: Mapping[str, Any]
    """The spec as the job holds it."""
    settings: JobSpec | None = None
    """The typed, defaulted spec (meshrun.spec); None when it cannot be read (it is kept when
    only a later rule refuses the spec: a running attempt goes on under its policy)."""
    plan: Plan | None = None
    """The planner's layout; None when the spec is invalid."""
    error: SpecError | None = None
    """Why the spec cannot run (names the field), or None."""


def evaluate(spec: Mapping[str, Any], name: str) -> Evaluation:
    """Read and plan a spec; any problem becomes an Evaluation with ``error`` set."""
    settings = None
    try:
        settings = read_spec(spec)
        plan = plan_checked(settings, name)  # the job's files too, where visible here
    except SpecError as error:
        return Evaluation(spec=spec, settings=settings, error=error)
    except (ValueError, TypeError, KeyError) as error:
        # A planner bug must not crash the reconcile loop; it surfaces in the Invalid condition.
        failed = SpecError("spec", f"could not be planned: {error!r}")
        return Evaluation(spec=spec, settings=settings, error=failed)
    return Evaluation(spec=spec, settings=settings, plan=plan)


def refused(ev: Evaluation, error: SpecError) -> Evaluation:
    """The same spec, judged invalid by someone after the planner (the API server)."""
    return Evaluation(spec=ev.spec, settings=ev.settings, error=error)


def still_refused(ev: Evaluation, known: InvalidSpec | None, generation: object) -> Evaluation:
    """A pod template the API server refused stays refused until the spec changes.

    Only the API server can judge a pod template; without this, every resync would try to
    create the refused pod again.
    """
    if (
        ev.error is None
        and known is not None
        and known.field == POD_TEMPLATE
        and known.generation == generation
    ):
        return refused(ev, SpecError(POD_TEMPLATE, known.rule))
    return ev


POD_TEMPLATE = "spec.podTemplate"
"""The field the API server judges: a pod it refuses is this field's fault."""
