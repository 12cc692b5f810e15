"""Whether the measured throughput is far below the planner's prediction (pure).

A job below its prediction is not failed: the model has an error of its own (tens of percent,
docs/planner.md), and a slow job still trains. Half the prediction is far outside that error:
a throttled or faulty GPU, a link running slower than the spec says (PCIe where ``nvlink`` was
given, a degraded NIC), or a product that is not the one named.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from meshrun_operator.jobstatus import Reason

BELOW_FRACTION = 0.5
"""Measured under this share of the predicted tokens/s counts as far below."""
WARMUP_STEPS = 10
"""Steps before the first judgement: the first ones compile, fill caches and allocate."""


def warmed_up(step: int, total_steps: int | None) -> bool:
    """Past the warm-up: WARMUP_STEPS steps, or half of a shorter job (at least 2)."""
    limit = WARMUP_STEPS if not total_steps else min(WARMUP_STEPS, max(2, total_steps // 2))
    return step >= limit


def judge_throughput(
    predicted: float | None, progress: Mapping[str, Any] | None
) -> tuple[bool, str] | None:
    """(far below the prediction, the message) once warmed up; None before, or without a
    prediction or a measurement."""
    if not predicted or not progress:
        return None
    measured, step = progress.get("tokensPerSecond"), progress.get("step")
    if not isinstance(measured, (int, float)) or not isinstance(step, int):
        return None
    total = progress.get("totalSteps")
    if not warmed_up(step, total if isinstance(total, int) else None):
        return None
    share = float(measured) / predicted
    values = {"measured": float(measured), "predicted": predicted, "share": share, "step": step}
    if share < BELOW_FRACTION:
        return True, Reason.BELOW_PREDICTION.message(threshold=BELOW_FRACTION, **values)
    return False, Reason.AS_PREDICTED.message(**values)
