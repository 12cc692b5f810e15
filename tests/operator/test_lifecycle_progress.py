"""The life cycle's progress reporting: trainer reports, hang detection, final summary."""

from __future__ import annotations

from typing import Any

import pytest
from operator_factories import make_job, make_pod, observe
from operator_lifecycle_helpers import condition, run, started_job

pytestmark = pytest.mark.unit


def progress(step: int) -> dict[str, Any]:
    return {
        "step": step,
        "totalSteps": 100,
        "loss": 2.5,
        "tokensPerSecond": 1000.0,
        "stepTimeSeconds": 0.5,
        "updatedAt": 1767268800.0,
    }


def test_progress_is_reported_and_a_hang_restarts_the_gang() -> None:
    job = started_job(runPolicy={"progressDeadlineSeconds": 20})
    job, first = run(job, observe(make_pod(0, progress=progress(1)), make_pod(1)), 5)
    assert first.status["progress"]["step"] == 1
    assert first.status["progress"]["etaSeconds"] == 49.5
    # The step advances at t=20: no restart at t=30 although 25 s passed since running.
    job, _ = run(job, observe(make_pod(0, progress=progress(2)), make_pod(1)), 20)
    job, fine = run(job, observe(make_pod(0, progress=progress(2)), make_pod(1)), 30)
    assert fine.status["phase"] == "Running"
    _, hung = run(job, observe(make_pod(0, progress=progress(2)), make_pod(1)), 40)
    assert hung.status["phase"] == "Restarting"
    assert hung.state.last_failure is not None
    assert hung.state.last_failure.reason == "ProgressDeadlineExceeded"
    assert hung.delete_pods == ("job-0", "job-1")


def test_progress_from_the_endpoint_wins_over_the_annotation() -> None:
    job = started_job()
    observed = observe(make_pod(0, progress=progress(1)), make_pod(1), progress=progress(7))
    _, decision = run(job, observed, 5)
    assert decision.status["progress"]["step"] == 7


def test_progress_fields_of_the_wrong_type_are_dropped_not_sent() -> None:
    job = started_job()
    report = {**progress(4), "updatedAt": "yesterday", "loss": "nan?", "extra": 1}
    _, decision = run(job, observe(make_pod(0, progress=report), make_pod(1)), 5)
    shown = decision.status["progress"]
    assert shown["step"] == 4 and shown["tokensPerSecond"] == 1000.0
    assert "updatedAt" not in shown and "loss" not in shown and "extra" not in shown


def test_printer_columns_are_filled() -> None:
    _, decision = run(make_job(), observe(), 0)
    assert decision.status["strategy"] == "ddp"
    assert decision.status["layout"] == "dp8 x pp1 x tp1"
    assert decision.status["gpus"] == 8


def test_the_trainers_final_summary_becomes_the_final_progress() -> None:
    job = started_job()
    summary = {
        "status": "Succeeded",
        "steps": 20,
        "finalLoss": 2.125,
        "tokensPerSecond": 512.0,
        "losses": [3.0, 2.125],
    }
    done = (make_pod(0, phase="Succeeded", summary=summary), make_pod(1, phase="Succeeded"))
    _, decision = run(job, observe(*done), 9)
    assert decision.status["phase"] == "Succeeded"
    assert decision.status["progress"] == {
        "step": 20,
        "totalSteps": 20,
        "loss": 2.125,
        "tokensPerSecond": 512.0,
        "etaSeconds": 0.0,
    }


def test_the_trainers_error_message_reaches_the_failure() -> None:
    job = started_job()
    summary = {"status": "Failed", "rank": 3, "error": "ValueError: MESHRUN_TP: 3 must divide 4"}
    failed = make_pod(1, phase="Failed", exit_code=2, summary=summary)
    _, decision = run(job, observe(make_pod(0), failed), 5)
    failed_condition = condition(decision, "Failed")
    assert failed_condition["reason"] == "ConfigError"
    assert "MESHRUN_TP: 3 must divide 4" in failed_condition["message"]
