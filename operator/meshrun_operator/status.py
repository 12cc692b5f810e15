"""The job's status as one pure function of the job, its observed children and the time.

``compute_status`` is the contract other parts rely on (the reconciler writes its result in one
patch); the rules themselves live in lifecycle.decide, which also returns the side effects.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from meshrun_operator.lifecycle.decide import decide
from meshrun_operator.lifecycle.evaluation import Evaluation
from meshrun_operator.seen.views import Observed
from meshrun_operator.tuning import Tuning


def compute_status(
    job: Mapping[str, Any],
    observed_children: Observed,
    now: datetime,
    tuning: Tuning | None = None,
    evaluation: Evaluation | None = None,
) -> dict[str, Any]:
    """Phase, conditions (incl. Invalid), plan summary, placement, restarts and progress."""
    return decide(job, observed_children, now, tuning, evaluation).status
