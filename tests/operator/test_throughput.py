"""The job's GPU product and its throughput against the plan: the pods select the product, a
product no node has is reported, and a job far below its predicted tokens/s says so after a
warm-up without failing."""

from __future__ import annotations

from typing import Any

import pytest
from meshrun_operator.children.builders import build_pod
from meshrun_operator.children.owner import JobRef
from meshrun_operator.jobstatus import ConditionType
from meshrun_operator.lifecycle.evaluation import evaluate
from meshrun_operator.lifecycle.throughput import BELOW_FRACTION, judge_throughput, warmed_up
from meshrun_operator.seen.nodes import NodeWatch, node_info
from meshrun_operator.seen.views import Observed
from operator_factories import make_job, make_pod
from operator_lifecycle_helpers import condition, run, started_job
from test_state import status_schema, undeclared

from meshrun.api.hardware import PRODUCT_LABEL
from meshrun.planner.plan import plan_job

pytestmark = pytest.mark.unit

H100, H200 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-H200"


def report(step: int, tokens: float, total: int = 100) -> dict[str, Any]:
    return {"step": step, "totalSteps": total, "tokensPerSecond": tokens, "stepTimeSeconds": 1.0}


@pytest.mark.parametrize(
    ("predicted", "progress", "expected"),
    [
        (None, report(50, 10.0), None),  # no prediction (a CPU job)
        (1000.0, None, None),  # nothing measured yet
        (1000.0, report(3, 10.0), None),  # still warming up
        (1000.0, report(10, 10.0), True),
        (1000.0, report(10, 1000.0 * BELOW_FRACTION * 0.99), True),
        (1000.0, report(10, 1000.0 * BELOW_FRACTION), False),
        (1000.0, report(10, 1300.0), False),  # faster than predicted is no problem
        (1000.0, report(2, 10.0, total=4), True),  # a short job: half of it is the warm-up
        (1000.0, {"step": "x", "tokensPerSecond": 1.0}, None),
    ],
)
def test_judgement(
    predicted: float | None, progress: dict[str, Any] | None, expected: bool | None
) -> None:
    verdict = judge_throughput(predicted, progress)
    assert (verdict[0] if verdict else None) == expected
    if verdict is not None:
        assert f"of the predicted {predicted:,.0f}" in verdict[1]


def test_warm_up() -> None:
    assert not warmed_up(9, 1000) and warmed_up(10, 1000)
    assert warmed_up(2, 3) and not warmed_up(1, 3)


def observed(step: int, tokens: float, *, node: str | None = "node-0", **extra: Any) -> Observed:
    pods = (make_pod(0, node=node), make_pod(1, node=node))
    known = {node: True} if node else {}
    return Observed(pods=pods, nodes=known, progress=report(step, tokens), **extra)


def test_far_below_the_prediction_is_a_condition_not_a_failure() -> None:
    job = started_job()
    predicted = plan_job(job["spec"], "job").predicted_tokens_per_second()
    assert predicted is not None and predicted > 0
    job, early = run(job, observed(3, predicted / 10), 5)
    assert early.status["progress"]["predictedTokensPerSecond"] == predicted
    assert early.status["plan"]["predictedTokensPerSecond"] == predicted
    assert ConditionType.BELOW_PREDICTION.value not in {
        c["type"] for c in early.status["conditions"]
    }
    job, slow = run(job, observed(12, predicted / 10), 10)
    below = condition(slow, "BelowPrediction")
    assert below["status"] == "True" and below["reason"] == "BelowPrediction"
    assert "10% of the predicted" in below["message"]
    assert slow.status["phase"] == "Running"
    assert undeclared(slow.status, status_schema(), "status") == []
    _, recovered = run(job, observed(20, predicted * 0.9), 15)
    fine = condition(recovered, "BelowPrediction")
    assert fine["status"] == "False" and fine["reason"] == "AsPredicted"


def test_cpu_jobs_are_judged_against_the_cpu_profile() -> None:
    """A CPU job's prediction is the CPU profile's (a tiny model on gloo processes: hundreds to
    a few thousand tokens/s, not the GPU arithmetic's tens of thousands), and it is judged."""
    job = started_job(resources={"accelerator": "cpu"})
    predicted = plan_job(job["spec"], "job").predicted_tokens_per_second()
    assert predicted is not None and 100 < predicted < 5000
    job, decision = run(job, observed(3, predicted), 5)
    assert decision.status["progress"]["predictedTokensPerSecond"] == predicted
    _, slow = run(job, observed(12, predicted / 10), 10)
    assert condition(slow, "BelowPrediction")["status"] == "True"


def test_a_product_no_node_has_is_reported() -> None:
    job = started_job(resources={"acceleratorProduct": H200})
    _, waiting = run(job, observed(0, 0.0, node=None, products=frozenset({H100})), 5)
    scheduled = condition(waiting, "Scheduled")
    assert scheduled["status"] == "False" and scheduled["reason"] == "NoNodeWithProduct"
    assert f"{PRODUCT_LABEL}={H200}" in scheduled["message"] and H100 in scheduled["message"]
    _, present = run(job, observed(0, 0.0, node=None, products=frozenset({H100, H200})), 5)
    assert condition(present, "Scheduled")["reason"] == "WaitingForGang"
    _, unknown = run(job, observed(0, 0.0, node=None), 5)  # node labels not seen
    assert condition(unknown, "Scheduled")["reason"] == "WaitingForGang"


def pod(**spec: Any) -> dict[str, Any]:
    ev = evaluate(make_job(**spec)["spec"], "job")
    assert ev.spec is not None and ev.plan is not None, ev.error
    return build_pod(JobRef(name="job", namespace="ns", uid="uid-1"), ev.spec, ev.plan, 0, 0, {})


def test_pods_select_the_product() -> None:
    assert pod(resources={"acceleratorProduct": H200})["spec"]["nodeSelector"] == {
        PRODUCT_LABEL: H200
    }
    assert PRODUCT_LABEL not in (pod()["spec"].get("nodeSelector") or {})
    template = {"spec": {"nodeSelector": {PRODUCT_LABEL: H100, "zone": "a"}}}
    chosen = pod(resources={"acceleratorProduct": H200}, podTemplate=template)
    assert chosen["spec"]["nodeSelector"] == {PRODUCT_LABEL: H100, "zone": "a"}


def gpu_node(name: str, product: str | None) -> dict[str, Any]:
    labels = {PRODUCT_LABEL: product} if product else {}
    return {"metadata": {"name": name, "labels": labels}, "status": {"conditions": []}}


def test_the_node_watch_counts_nodes_per_product() -> None:
    watch = NodeWatch(None, lambda: None)  # type: ignore[arg-type]  # no API calls here
    assert watch.gpu_products() is None  # not listed yet: unknown, not "none"
    watch._apply({n: node_info(gpu_node(n, H100)) for n in ("a", "b")}, [])
    watch._apply({"c": node_info(gpu_node("c", None))}, [])
    watch.listed.set()
    assert watch.gpu_products() == {H100}
    watch._apply({"b": node_info(gpu_node("b", H200))}, [])  # relabelled
    assert watch.gpu_products() == {H100, H200}
    watch._apply({}, ["a"])
    assert watch.gpu_products() == {H200}
    watch._apply({}, ["b"])
    assert watch.gpu_products() == frozenset()
