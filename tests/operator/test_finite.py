"""Finite numbers only: NaN and infinite values from a trainer's report never reach a status
patch (they are left out and named), no request body carries one, and the trainer's
LossNotFinite verdict fails the job at once (no cluster)."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from meshrun_operator.client.errors import ApiTimeout, NotJson, json_body, non_finite_field
from meshrun_operator.client.kube import Kube
from meshrun_operator.client.lease import LeaseApi
from meshrun_operator.client.login import Login
from meshrun_operator.client.rest import Rest
from meshrun_operator.lifecycle.summary import final_progress, progress_status
from meshrun_operator.seen.views import parse_progress, parse_summary
from operator_factories import make_pod, observe
from operator_lifecycle_helpers import condition, run, running_job, started_job
from prometheus_client import REGISTRY
from test_login import kubeconfig, serving

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


def test_no_request_body_carries_nan(tmp_path: Path) -> None:
    """Every body the operator sends (status patches, Events, the Lease, children) goes through
    rest.py: one with NaN or an infinite number is refused there, naming the write and the
    field, and nothing reaches the API server, nor is it counted as sent."""
    received: list[bytes] = []

    async def handler(request: web.Request) -> web.Response:
        received.append(await request.read())
        return web.json_response({"metadata": {"name": "job"}})

    def sent(verb: str, resource: str) -> float:
        value = REGISTRY.get_sample_value(
            "meshrun_operator_api_requests_total", {"verb": verb, "resource": resource}
        )
        return value or 0.0

    async def scenario() -> None:
        async with serving(handler) as port:
            config = kubeconfig(tmp_path, {"token": "t"}, f"http://127.0.0.1:{port}")
            rest = Rest(Login(str(config)), ApiTimeout.of(5))
            kube = Kube(rest)
            try:
                await kube.patch_status("ns", "job", "1", {"progress": {"loss": 1.5}})
                assert json.loads(received[-1])["status"]["progress"]["loss"] == 1.5
                before = sent("patch", "paralleltrainingjobs/status")
                with pytest.raises(NotJson) as refused:
                    await kube.patch_status("ns", "job", "1", {"progress": {"loss": INF}})
                assert str(refused.value) == (
                    "patch paralleltrainingjobs/status not sent: status.progress.loss is inf"
                    " (JSON has no NaN or infinite numbers)"
                )
                assert sent("patch", "paralleltrainingjobs/status") == before
                with pytest.raises(NotJson, match=r"update leases not sent: spec\.x\[1\] is nan"):
                    await LeaseApi(rest).replace("ns", "lease", "7", {"x": [1.0, NAN]})
                # The door itself, without Kube: what it names unless told is the method and path.
                with pytest.raises(NotJson, match=r"^POST /api/v1/x not sent: the body is -inf"):
                    await rest.request("POST", "/api/v1/x", body=-INF)
            finally:
                await rest.close()

    asyncio.run(scenario())
    assert len(received) == 1  # only the finite patch was sent


def test_a_bodys_first_non_finite_field_is_named() -> None:
    assert json_body({"a": [1, {"b": 2.0}]}, "x") == b'{"a":[1,{"b":2.0}]}'
    assert non_finite_field({"a": [1, {"b": 2.0}]}) is None
    found = non_finite_field({"a": [1, {"b": NAN}], "c": INF})
    assert found is not None and found[0] == "a[1].b" and math.isnan(found[1])
    assert non_finite_field([INF]) == ("[0]", INF)


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


INT64_MAX = 2**63 - 1


@pytest.mark.parametrize(
    ("reported", "kept"),
    [
        ({"step": 2**63, "loss": 1.5}, {"loss": 1.5}),
        ({"step": INT64_MAX, "totalSteps": -(2**63)}, {"step": INT64_MAX, "totalSteps": -(2**63)}),
        ({"step": 3, "totalSteps": -(2**63) - 1, "evalStep": 10**30}, {"step": 3}),
        # An integer too large for a float: no ETA from it, and no OverflowError either.
        ({"step": 3, "totalSteps": 10**400, "stepTimeSeconds": 0.5},
         {"step": 3, "stepTimeSeconds": 0.5}),
        ({"step": 3, "updatedAt": 10**30, "tokensPerSecond": 1e308},
         {"step": 3, "tokensPerSecond": 1e308}),
    ],
)  # fmt: skip
def test_integers_beyond_int64_are_left_out_of_the_status(
    reported: dict[str, Any], kept: dict[str, Any]
) -> None:
    progress = progress_status(reported)
    assert progress == kept
    json.dumps(progress, allow_nan=False)


def test_a_final_summary_beyond_int64_keeps_only_what_fits() -> None:
    summary = {"status": "Succeeded", "steps": 2**64, "finalLoss": 2.0,
               "eval": [{"step": 10**20, "loss": 2.5}]}  # fmt: skip
    assert final_progress(summary) == {"loss": 2.0, "etaSeconds": 0.0, "evalLoss": 2.5}


def test_a_report_beyond_int64_does_not_freeze_the_jobs_status() -> None:
    job = running_job()
    pods = (make_pod(0), make_pod(1))
    job, first = run(job, observe(*pods, progress={"step": 2**63, "loss": 1.5}), 5)
    assert "step" not in first.status["progress"] and first.status["progress"]["loss"] == 1.5
    _, later = run(job, observe(*pods, progress={"step": 7, "loss": 1.25}), 6)
    assert later.status["progress"]["step"] == 7
