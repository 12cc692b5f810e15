"""Numbers as a person reads them in a terminal: the texts of ``status.display`` (the CRD
describes them: the share of the steps done, tokens/s to three significant digits with k, M or G,
a time as kubectl writes an age), also what ``meshrun list`` and ``meshrun status`` print."""

from __future__ import annotations

RATE_SUFFIXES = ("", "k", "M", "G", "T")
"""Thousands, millions, ... of tokens/s."""


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
