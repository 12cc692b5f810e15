"""Spec edits while an attempt runs, decision by decision: the plan an attempt keeps, the
SpecUpdate condition, run policy edits at once, a refused spec, an ended job (lifecycle.decide,
no cluster)."""

from __future__ import annotations

from typing import Any

import pytest
from meshrun_operator.lifecycle.decide import decide
from meshrun_operator.lifecycle.evaluation import evaluate
from meshrun_operator.lifecycle.specedits import Running
from operator_factories import at, make_job, make_pod, observe
from operator_lifecycle_helpers import TIMING, advance, condition, failed, reasons, run, running_job

pytestmark = pytest.mark.unit


def spec_with(**training: Any) -> dict[str, Any]:
    return make_job(training={"steps": 10, "globalBatchSize": 16, "microBatchSize": 2, **training})


def test_an_edit_takes_effect_at_the_next_attempt_and_says_so() -> None:
    job = running_job()
    assert job["status"]["attemptGeneration"] == 1
    running = Running(0, 1, evaluate(job["spec"], "job"))
    edited = {
        **job,
        "spec": spec_with(steps=20)["spec"],
        "metadata": {**job["metadata"], "generation": 2},
    }
    pods = observe(make_pod(0), make_pod(1))
    decision = decide(edited, pods, at(5), TIMING, None, running)
    assert decision.status["phase"] == "Running" and decision.delete_pods == ()
    assert decision.status["observedGeneration"] == 2 and decision.status["attemptGeneration"] == 1
    spec_update = condition(decision, "SpecUpdate")
    assert spec_update["status"] == "True" and spec_update["reason"] == "NextAttempt"
    # A pod of this attempt would be built as before: the attempt's spec and plan.
    assert decision.build is not None and decision.build.raw_spec == job["spec"]
    assert decision.build.plan is running.evaluation.plan
    # The next attempt runs generation 2, and the condition turns False.
    edited = advance(edited, decision)
    edited, restart = run(edited, observe(make_pod(0), failed(1, 137)), 6)
    assert restart.status["phase"] == "Restarting"
    _, recreated = run(edited, observe(), 20)
    assert recreated.create_pods == (0, 1) and recreated.status["attemptGeneration"] == 2
    assert condition(recreated, "SpecUpdate")["status"] == "False"


def test_a_runpolicy_edit_applies_at_once() -> None:
    job = running_job(runPolicy={"backoffLimit": 0})
    running = Running(0, 1, evaluate(job["spec"], "job"))
    spec = make_job(runPolicy={"backoffLimit": 2})["spec"]
    edited = {**job, "spec": spec, "metadata": {**job["metadata"], "generation": 2}}
    decision = decide(edited, observe(make_pod(0), failed(1, 137)), at(5), TIMING, None, running)
    assert decision.status["phase"] == "Restarting"  # backoffLimit 2 applied, not 0
    assert "SpecUpdate" not in {c["type"] for c in decision.status["conditions"]}


@pytest.mark.parametrize("recorded", [1, None], ids=["edited", "stricter-operator"])
def test_a_refused_spec_never_fails_a_running_attempt(recorded: int | None) -> None:
    job = running_job()
    job["status"]["attemptGeneration"] = recorded
    bad = {**job, "spec": spec_with(globalBatchSize=18)["spec"]}  # 18 is not 8 x 2 x k
    if recorded is not None:
        bad["metadata"] = {**job["metadata"], "generation": 2}
    pods = observe(make_pod(0), make_pod(1))
    bad, decision = run(bad, pods, 5)
    assert decision.status["phase"] == "Running" and decision.delete_pods == ()
    assert not decision.invalid and decision.status["restarts"] == 0
    spec_update = condition(decision, "SpecUpdate")
    assert spec_update["reason"] == "RefusedWhileRunning"
    assert "spec.training.globalBatchSize" in spec_update["message"]
    assert decision.status["placement"][1]["pod"] == "job-1"  # the attempt's placement kept
    # Only a new attempt needs a spec that passes: after a failure the job is Invalid.
    bad, restarting = run(bad, observe(make_pod(0), failed(1, 137)), 6)
    assert restarting.status["phase"] == "Restarting"
    _, invalid = run(bad, observe(), 30)
    assert invalid.invalid and invalid.status["phase"] == "Failed"
    assert reasons(invalid) == ["InvalidSpec", "Failed"]


def test_a_job_that_ended_stays_ended_whatever_its_spec_becomes() -> None:
    job = running_job()
    job, done = run(job, observe(make_pod(0, phase="Succeeded"), make_pod(1, phase="Succeeded")), 5)
    assert done.status["phase"] == "Succeeded"
    bad = {**job, "spec": spec_with(globalBatchSize=18)["spec"]}
    _, later = run(bad, observe(make_pod(0, phase="Succeeded"), make_pod(1, phase="Succeeded")), 9)
    assert later.status["phase"] == "Succeeded" and not later.invalid and later.events == ()
