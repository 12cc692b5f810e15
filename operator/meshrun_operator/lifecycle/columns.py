"""What ``kubectl get ptj`` shows: the status fields its printer columns read.

A printer column reads one field by JSONPath, and prints a number as Go does, in full
(``2.302585092994046``, ``1.5e+06``); the step of the total, the share done and the time left
are no field at all. So the operator writes copies for the columns: the top-level ``strategy``,
``layout``, ``gpus`` and ``worldSize`` of the layout running now, and ``status.display``, the
progress as text, computed once from the status it writes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from meshrun.api.display import duration_text, percent_text, rate_text
from meshrun.planner.plan import Plan
from meshrun_operator.jobstatus import Phase


def running_size(plan: Plan) -> dict[str, Any]:
    """The columns' copies of the layout running now: the plan's, or an elastic job's plan at
    the degree it runs at."""
    return {"layout": plan.layout.text(), "gpus": plan.gpus, "worldSize": plan.world_size}


def display(status: Mapping[str, Any]) -> dict[str, str | None] | None:
    """``status.display`` from ``status.progress``: None when there is nothing to show (an
    object of no fields would read as a change at every pass); a field left None is removed
    by the merge patch. A job that has ended has no time left to show: its last report's ETA
    is left out (a failed job's would say how long a run that stopped had still to go)."""
    progress = status.get("progress") or {}
    ended = status.get("phase") in (Phase.SUCCEEDED, Phase.FAILED)
    step, total = _integer(progress.get("step")), _integer(progress.get("totalSteps"))
    shown = {
        "step": None if step is None else f"{step}/{total}" if total else str(step),
        "progress": None if step is None or not total else percent_text(step, total),
        "loss": _maybe(progress.get("loss"), lambda loss: f"{loss:.4g}"),
        "tokensPerSecond": _maybe(progress.get("tokensPerSecond"), rate_text),
        "predictedTokensPerSecond": _maybe(progress.get("predictedTokensPerSecond"), rate_text),
        "eta": None if ended else _maybe(progress.get("etaSeconds"), duration_text),
    }
    return shown if any(value is not None for value in shown.values()) else None


def _integer(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _maybe(value: object, text: Callable[[float], str]) -> str | None:
    """``text(value)`` for a number (status.progress holds only finite ones), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return text(value)
