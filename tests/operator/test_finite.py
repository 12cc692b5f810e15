"""Finite numbers only: NaN and infinite values from a trainer's report never reach a status
patch (they are left out and named), no request body carries one, and the trainer's
LossNotFinite verdict fails the job at once (no cluster)."""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

import pytest
from meshrun_operator.client.errors import NotJson, strict_json
from meshrun_operator.client.kube import Kube
from meshrun_operator.lifecycle.summary import final_progress, progress_status
from meshrun_operator.seen.views import parse_progress, parse_summary
from operator_factories import make_pod, observe
from operator_lifecycle_helpers import condition, run, running_job, started_job

pytestmark = pytest.mark.unit

NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize(
    ("reported", "kept", "dropped"),
    [
        ({"step": 3, "loss": 2.5}, {"step": 3, "loss": 2.5}, None),
        ({"step": 3, "loss": NAN}, {"step": 3}, ["loss"]),
        ({"step": 3, "loss": INF, "tokensPerSecond": -INF}, {"step": 3},
         ["loss", "tokensPerSecond"]),
        ({"step": 3, "totalSteps": 9, "stepTimeSeconds": NAN}, {"step": 3, "totalSteps": 9},
         ["stepTimeSeconds"]),
        ({"step": 3, "evalLoss": NAN, "evalStep": 2}, {"step": 3, "evalStep": 2}, ["evalLoss"]),
    ],
)  # fmt: skip
def test_non_finite_progress_is_left_out_and_named(
    reported: dict[str, Any], kept: dict[str, Any], dropped: list[str] | None
) -> None:
    progress = progress_status(reported)
    assert progress.get("nonFinite") == dropped
    assert {k: v for k, v in progress.items() if k != "nonFinite"} == kept
    json.dumps(progress, allow_nan=False)


def test_the_annotation_and_the_final_summary_are_read_without_their_nan() -> None:
    # Python's json reads NaN and Infinity; nothing of it may reach the status.
    reported = parse_progress('{"step": 4, "loss": NaN, "tokensPerSecond": Infinity}')
    assert reported is not None and math.isnan(reported["loss"])
    assert progress_status(reported) == {"step": 4, "nonFinite": ["loss", "tokensPerSecond"]}
    summary = parse_summary('{"status": "Succeeded", "steps": 5, "finalLoss": NaN}')
    final = final_progress(summary)
    assert final is not None and "loss" not in final and final["nonFinite"] == ["loss"]


def test_a_nan_loss_is_dropped_from_the_status_with_one_warning_event() -> None:
    job = running_job()
    pods = (make_pod(0), make_pod(1))
    job, first = run(job, observe(*pods, progress={"step": 5, "loss": NAN}), 5)
    json.dumps(first.status, allow_nan=False)  # the patch is valid JSON
    assert "loss" not in first.status["progress"] and first.status["progress"]["step"] == 5
    warnings = [e for e in first.events if e.reason == "NonFiniteValue"]
    assert len(warnings) == 1 and warnings[0].type == "Warning"
    assert "status.progress.loss" in warnings[0].message
    # The same report again: no second Event; a finite loss clears the mark.
    job, again = run(job, observe(*pods, progress={"step": 6, "loss": NAN}), 6)
    assert "NonFiniteValue" not in {e.reason for e in again.events}
    _, healthy = run(job, observe(*pods, progress={"step": 7, "loss": 1.5}), 7)
    assert (
        healthy.status["progress"]["loss"] == 1.5 and "nonFinite" not in healthy.status["progress"]
    )


def test_no_request_body_carries_nan() -> None:
    strict_json({"status": {"progress": {"loss": 1.0}}}, "patch")
    with pytest.raises(NotJson, match="patch paralleltrainingjobs/status not sent"):
        strict_json({"status": {"progress": {"loss": NAN}}}, "patch paralleltrainingjobs/status")

    class NoRest:
        timeout = None

        async def request(self, *args: Any, **kwargs: Any) -> Any:
            raise AssertionError("a body with NaN was sent")

    kube = Kube(NoRest())  # type: ignore[arg-type]
    with pytest.raises(NotJson):
        asyncio.run(kube.patch_status("ns", "job", "1", {"progress": {"loss": INF}}))


LOSS_NOT_FINITE = {
    "status": "Failed",
    "rank": 0,
    "error": "LossNotFinite: the training loss is nan at step 7",
    "reason": "LossNotFinite",
    "permanent": True,
    "step": 7,
    "loss": "nan",
}


def test_the_trainers_loss_not_finite_verdict_fails_the_job_with_step_and_value() -> None:
    failed = make_pod(0, phase="Failed", exit_code=1, summary=LOSS_NOT_FINITE)
    _, decision = run(started_job(), observe(failed, make_pod(1)), 5)
    assert decision.status["phase"] == "Failed" and decision.status["restarts"] == 0
    verdict = condition(decision, "Failed")
    assert verdict["reason"] == "LossNotFinite"
    assert "the training loss is nan at step 7" in verdict["message"]
    assert decision.status["lastFailure"]["class"] == "Permanent"
    # Exit code 4 alone (a trainer run without torchrun) says the same.
    direct = make_pod(0, phase="Failed", exit_code=4)
    _, alone = run(started_job(), observe(direct, make_pod(1)), 5)
    assert condition(alone, "Failed")["reason"] == "LossNotFinite"
