"""The operator's metrics: the jobs-by-phase gauge counts right and costs the same per job
whether the operator knows ten jobs or thousands."""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

import pytest
from meshrun_operator.jobstatus import Phase
from meshrun_operator.metrics import JOBS_BY_PHASE, PhaseBook

pytestmark = pytest.mark.unit


def gauge(phase: Phase) -> float:
    return float(JOBS_BY_PHASE.labels(phase=phase.value)._value.get())


def lines_run(call: Callable[[], Any]) -> int:
    """How many lines of Python ``call`` runs (every frame, the gauge's own included)."""
    count = 0

    def trace(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal count
        if event == "line":
            count += 1
        return trace

    sys.settrace(trace)
    try:
        call()
    finally:
        sys.settrace(None)
    return count


def test_the_gauge_counts_each_phase_and_forgets_a_deleted_job() -> None:
    book = PhaseBook()
    for uid, phase in (("a", Phase.RUNNING), ("b", Phase.RUNNING), ("c", Phase.PENDING)):
        book.set(uid, phase)
    assert (gauge(Phase.RUNNING), gauge(Phase.PENDING), gauge(Phase.FAILED)) == (2, 1, 0)
    book.set("a", Phase.SUCCEEDED)
    book.set("b", Phase.RUNNING)  # unchanged
    book.set("c", None)  # deleted
    book.set("gone", None)  # never known
    assert (gauge(Phase.RUNNING), gauge(Phase.PENDING), gauge(Phase.SUCCEEDED)) == (1, 0, 1)
    assert book.phases == {"a": "Succeeded", "b": "Running"}


def test_a_jobs_phase_costs_the_same_with_ten_or_five_thousand_jobs() -> None:
    few, many = PhaseBook(), PhaseBook()
    for index in range(10):
        few.set(f"job-{index}", Phase.RUNNING)
    for index in range(5000):
        many.set(f"job-{index}", Phase.RUNNING)
    # A pass sets every job's phase: a cost that grows with the jobs makes a pass O(N^2).
    with_few = lines_run(lambda: few.set("job-1", Phase.SUCCEEDED))
    with_many = lines_run(lambda: many.set("job-1", Phase.SUCCEEDED))
    assert with_many == with_few, (with_few, with_many)
    assert gauge(Phase.SUCCEEDED) == 1 and gauge(Phase.RUNNING) == 4999
