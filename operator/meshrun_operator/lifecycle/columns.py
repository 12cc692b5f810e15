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

from meshrun.planner.plan import Plan

RATE_SUFFIXES = ("", "k", "M", "G", "T")
"""Thousands, millions, ... of tokens/s."""


def running_size(plan: Plan) -> dict[str, Any]:
    """The columns' copies of the layout running now: the plan's, or an elastic job's plan at
    the degree it runs at."""
    return {"layout": plan.layout.text(), "gpus": plan.gpus, "worldSize": plan.world_size}


def display(status: Mapping[str, Any]) -> dict[str, str | None] | None:
    """``status.display`` from ``status.progress``: None when there is nothing to show (an
    object of no fields would read as a change at every pass); a field left None is removed
    by the merge patch."""
    progress = status.get("progress") or {}
    step, total = _integer(progress.get("step")), _integer(progress.get("totalSteps"))
    shown = {
        "step": None if step is None else f"{step}/{total}" if total else str(step),
        "progress": None if step is None or not total else percent_text(step, total),
        "loss": _maybe(progress.get("loss"), lambda loss: f"{loss:.4g}"),
        "tokensPerSecond": _maybe(progress.get("tokensPerSecond"), rate_text),
        "predictedTokensPerSecond": _maybe(progress.get("predictedTokensPerSecond"), rate_text),
        "eta": _maybe(progress.get("etaSeconds"), duration_text),
    }
    return shown if any(value is not None for value in shown.values()) else None


def percent_text(step: int, total: int) -> str:
    """The share of the steps done, rounded down: 100% is the last step only."""
    return f"{min(step, total) * 100 // total}%"


def rate_text(value: float) -> str:
    """Three significant digits, with k, M, G or T: ``8.12``, ``812``, ``12.3k``, ``1.23M``
    (below 1, two decimals)."""
    if abs(value) < 1:
        return f"{value:.2f}"
    for suffix in RATE_SUFFIXES[:-1]:
        if abs(value) < 999.5:
            return f"{value:.3g}{suffix}"
        value /= 1000
    return f"{value:.3g}{RATE_SUFFIXES[-1]}"


def duration_text(seconds: float) -> str:
    """Seconds as kubectl writes an age (``HumanDuration`` of k8s.io/apimachinery's
    util/duration): ``95s``, ``5m30s``, ``42m``, ``2h5m``, ``20h``, ``3d4h``, ``45d``."""
    whole = max(int(seconds), 0)
    minutes, hours = whole // 60, whole // 3600
    days = hours // 24
    if whole < 120:
        return f"{whole}s"
    if minutes < 10:
        return _two(minutes, "m", whole % 60, "s")
    if minutes < 180:
        return f"{minutes}m"
    if hours < 8:
        return _two(hours, "h", minutes % 60, "m")
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return _two(days, "d", hours % 24, "h")
    if days < 365 * 2:
        return f"{days}d"
    if days < 365 * 8:
        return _two(days // 365, "y", days % 365, "d")
    return f"{days // 365}y"


def _two(big: int, big_unit: str, small: int, small_unit: str) -> str:
    return f"{big}{big_unit}{small}{small_unit}" if small else f"{big}{big_unit}"


def _integer(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _maybe(value: object, text: Callable[[float], str]) -> str | None:
    """``text(value)`` for a number (status.progress holds only finite ones), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return text(value)
