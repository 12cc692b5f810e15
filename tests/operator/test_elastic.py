"""Elastic data parallelism in the pure life cycle: when the job shrinks, grows, or keeps its size.

The job: 4 pods x 2 GPUs, DDP (planned dp8), global batch 16 of micro-batches of 1, allowed
degrees 2..8 (those dividing 16 and filling whole pods: 2, 4, 8), shrinkAfterSeconds 60,
growAfterSeconds 120, a checkpoint every 5 steps.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from meshrun_operator.seen.views import Observed, PodView
from operator_factories import at, make_job, make_pod, observe
from operator_lifecycle_helpers import run

pytestmark = pytest.mark.unit

SPEC: dict[str, Any] = {
    "resources": {"numNodes": 4, "numProcPerNode": 2, "accelerator": "nvidia.com/gpu"},
    "training": {
        "steps": 100,
        "globalBatchSize": 16,
        "microBatchSize": 1,
        "checkpoint": {"everySteps": 5},
    },
    "elastic": {"minDataParallel": 2, "shrinkAfterSeconds": 60, "growAfterSeconds": 120},
}
STUCK = (("PodScheduled", "False"),)


def _pods(attempt: int, bound: int, total: int) -> list[PodView]:
    """``bound`` running pods on their nodes, the rest Pending and unschedulable."""
    return [
        make_pod(i, attempt, node=f"node-{i}")
        if i < bound
        else make_pod(i, attempt, phase="Pending", node=None, conditions=STUCK)
        for i in range(total)
    ]


def _seen(pods: list[PodView], capacity: int | None = None, step: int | None = None) -> Observed:
    progress = {"step": step, "totalSteps": 100} if step is not None else None
    return replace(observe(*pods, progress=progress), capacity=capacity)


def _half_placed(**spec: Any) -> dict[str, Any]:
    """Attempt 0 created at t=0; at t=5 two of its four pods are placed, two cannot be."""
    job, _ = run(make_job(**{**SPEC, **spec}), observe(), 0)
    job, _ = run(job, _seen(_pods(0, 2, 4)), 5)
    return job


def test_unschedulable_pods_shrink_the_job_after_shrink_after_seconds() -> None:
    job = _half_placed()
    job, decision = run(job, _seen(_pods(0, 2, 4)), 64)
    assert decision.delete_pods == () and job["status"]["dataParallel"] == 8
    job, decision = run(job, _seen(_pods(0, 2, 4)), 66)
    status = job["status"]
    # The two placed pods prove room for 2 pods: dp4, half the planned degree.
    assert sorted(decision.delete_pods) == ["job-0", "job-1", "job-2", "job-3"]
    assert status["dataParallel"] == 4 and status["layout"] == "dp4 x pp1 x tp1"
    assert status["gpus"] == status["worldSize"] == 4 and status["plan"]["dp"] == 8
    assert status["attempt"] == 1 and status["disruptions"] == 1 and status["restarts"] == 0
    (resize,) = status["resizes"]
    assert (resize["fromDataParallel"], resize["toDataParallel"]) == (8, 4)
    assert resize["reason"] == "Shrink" and resize["layout"] == "dp4 x pp1 x tp1"
    assert any(e.reason == "Shrink" and "dataParallel 8 -> 4" in e.message for e in decision.events)
    # The old pods gone and the backoff over, the next attempt has 2 pods at dp4 with twice
    # the gradient accumulation: the same global batch.
    job, decision = run(job, _seen([]), 120)
    assert decision.create_pods == (0, 1)
    assert decision.build is not None and decision.build.plan is not None
    layout = decision.build.plan.layout
    assert (layout.dp, layout.grad_accumulation) == (4, 4)
    assert decision.build.spec is not None
    assert decision.build.spec.training.global_batch_size == 16
    # Running at dp4, the status keeps saying so.
    job, decision = run(job, _seen(_pods(1, 2, 2)), 125)
    assert job["status"]["phase"] == "Running" and job["status"]["dataParallel"] == 4
    assert decision.delete_pods == ()


def test_the_shrink_takes_the_largest_allowed_degree_the_capacity_holds() -> None:
    job = _half_placed()
    # Room for 3 pods (6 GPUs): dp6 does not divide the batch of 16, so dp4.
    job, decision = run(job, _seen(_pods(0, 2, 4), capacity=3), 70)
    assert job["status"]["dataParallel"] == 4 and len(decision.delete_pods) == 4
    assert job["status"]["resizes"][-1]["step"] == 0


def test_the_shrink_trusts_the_placed_pods_over_a_node_count_that_looks_free() -> None:
    # The node watch sees room for all 4 pods (other workloads' pods are invisible to it), but
    # the scheduler placed only one: dp2 (1 pod), not dp4.
    job, _ = run(make_job(**SPEC), observe(), 0)
    job, _ = run(job, _seen(_pods(0, 1, 4), capacity=4), 5)
    job, decision = run(job, _seen(_pods(0, 1, 4), capacity=4), 70)
    assert job["status"]["dataParallel"] == 2 and len(decision.delete_pods) == 4


def test_no_shrink_below_min_data_parallel() -> None:
    job = _half_placed(elastic={**SPEC["elastic"], "minDataParallel": 8})
    job, decision = run(job, _seen(_pods(0, 2, 4), capacity=2), 200)
    assert decision.delete_pods == () and "resizes" not in job["status"]
    assert job["status"]["dataParallel"] == 8


def test_without_spec_elastic_nothing_changes() -> None:
    job, _ = run(make_job(**{k: v for k, v in SPEC.items() if k != "elastic"}), observe(), 0)
    job, _ = run(job, _seen(_pods(0, 2, 4), capacity=2), 5)
    job, decision = run(job, _seen(_pods(0, 2, 4), capacity=2), 200)
    assert "dataParallel" not in job["status"] and "resizes" not in job["status"]
    assert decision.delete_pods == () and job["status"]["disruptions"] == 0
    assert job["status"]["layout"] == "dp8 x pp1 x tp1"


def _shrunk() -> dict[str, Any]:
    """Shrunk to dp4 at t=66 and running again at t=125 (attempt 1, 2 pods)."""
    job = _half_placed()
    job, _ = run(job, _seen(_pods(0, 2, 4)), 66)
    job, _ = run(job, _seen([]), 120)
    job, _ = run(job, _seen(_pods(1, 2, 2), step=7), 125)
    return job


def test_room_grows_the_job_back_at_the_next_checkpoint_after_grow_after_seconds() -> None:
    job = _shrunk()
    # Room for 6 pods: more than planned, but the job grows to the planned dp8 only.
    job, decision = run(job, _seen(_pods(1, 2, 2), capacity=6, step=7), 130)
    assert job["status"]["elastic"]["roomStep"] == 5 and decision.delete_pods == ()
    # growAfterSeconds passed, but no checkpoint since the room appeared (still step 5's).
    job, decision = run(job, _seen(_pods(1, 2, 2), capacity=6, step=9), 260)
    assert decision.delete_pods == () and job["status"]["dataParallel"] == 4
    job, decision = run(job, _seen(_pods(1, 2, 2), capacity=6, step=11), 262)
    status = job["status"]
    assert sorted(decision.delete_pods) == ["job-0", "job-1"]
    assert status["dataParallel"] == 8 and status["layout"] == "dp8 x pp1 x tp1"
    assert status["disruptions"] == 2 and status["restarts"] == 0
    grow = status["resizes"][-1]
    assert (grow["fromDataParallel"], grow["toDataParallel"], grow["reason"]) == (8 // 2, 8, "Grow")
    assert grow["step"] == 10
    job, decision = run(job, _seen([]), 320)
    assert decision.create_pods == (0, 1, 2, 3)


def test_room_that_does_not_last_grows_nothing() -> None:
    job = _shrunk()
    job, _ = run(job, _seen(_pods(1, 2, 2), capacity=6, step=7), 130)
    job, _ = run(job, _seen(_pods(1, 2, 2), capacity=2, step=8), 140)  # taken again
    assert job["status"]["elastic"].get("roomSince") is None
    job, decision = run(job, _seen(_pods(1, 2, 2), capacity=6, step=11), 262)
    assert decision.delete_pods == () and job["status"]["dataParallel"] == 4


def test_max_data_parallel_caps_the_growth() -> None:
    job = _half_placed(elastic={**SPEC["elastic"], "maxDataParallel": 4})
    job, _ = run(job, _seen(_pods(0, 2, 4)), 66)
    assert job["status"]["dataParallel"] == 4
    job, _ = run(job, _seen([]), 120)
    job, _ = run(job, _seen(_pods(1, 2, 2), step=7), 125)
    job, _ = run(job, _seen(_pods(1, 2, 2), capacity=6, step=7), 130)
    job, decision = run(job, _seen(_pods(1, 2, 2), capacity=6, step=20), 400)
    assert decision.delete_pods == () and job["status"]["dataParallel"] == 4


def test_a_trainer_that_reports_no_step_grows_once_the_room_lasted() -> None:
    job = _half_placed()
    job, _ = run(job, _seen(_pods(0, 2, 4)), 66)
    job, _ = run(job, _seen([]), 120)
    job, _ = run(job, _seen(_pods(1, 2, 2)), 125)
    job, decision = run(job, _seen(_pods(1, 2, 2), capacity=4), 130)
    assert decision.delete_pods == ()
    job, decision = run(job, _seen(_pods(1, 2, 2), capacity=4), 250)
    assert job["status"]["dataParallel"] == 8 and len(decision.delete_pods) == 2


def test_a_lost_node_is_a_disruption_then_the_job_shrinks_with_no_restart_counted() -> None:
    job, _ = run(make_job(**SPEC), observe(), 0)
    job, _ = run(job, _seen(_pods(0, 4, 4)), 2)
    assert job["status"]["phase"] == "Running"
    # node-3 went NotReady at t=10 and stays so past the toleration (30 s): NodeLost.
    seen = observe(*_pods(0, 4, 4), nodes={"node-3": False})
    down = replace(seen, not_ready_since={"node-3": at(10)})
    job, decision = run(job, down, 39)
    assert job["status"]["restarts"] == 0
    job, decision = run(job, down, 41)
    # The node failed, not the job: a disruption, backoffLimit untouched.
    status = job["status"]
    assert (status["restarts"], status["disruptions"]) == (0, 1)
    assert status["lastFailure"]["reason"] == "NodeLost"
    assert status["lastFailure"]["class"] == "Ignored"
    # The next attempt: three pods placed, the fourth has no node left.
    job, decision = run(job, _seen([]), 60)
    assert decision.create_pods == (0, 1, 2, 3)
    job, _ = run(job, _seen(_pods(1, 3, 4)), 62)
    job, decision = run(job, _seen(_pods(1, 3, 4)), 121)
    assert decision.delete_pods == ()
    job, decision = run(job, _seen(_pods(1, 3, 4)), 122)
    status = job["status"]
    # Room for 3 pods proven; dp6 does not split the batch: dp4 on 2 pods.
    assert status["dataParallel"] == 4 and len(decision.delete_pods) == 4
    assert status["restarts"] == 0 and status["disruptions"] == 2


def test_the_shrink_clock_outlives_a_shorter_gang_timeout() -> None:
    job = _half_placed(scheduling={"gangTimeoutSeconds": 30})
    job, decision = run(job, _seen(_pods(0, 2, 4)), 36)
    assert job["status"]["gangRetries"] == 1 and len(decision.delete_pods) == 4
    assert job["status"]["dataParallel"] == 8
    job, decision = run(job, _seen([]), 50)
    assert decision.create_pods == (0, 1, 2, 3)
    job, _ = run(job, _seen(_pods(1, 2, 4)), 52)
    # 60 s after the pods were first seen unschedulable (t=5), not after the second attempt.
    job, decision = run(job, _seen(_pods(1, 2, 4)), 66)
    assert job["status"]["dataParallel"] == 4 and len(decision.delete_pods) == 4


def test_spec_elastic_removed_while_resized_keeps_the_attempt_then_runs_the_planned_size() -> None:
    job = _shrunk()
    del job["spec"]["elastic"]  # as after an edit the operator did not see the attempt start
    job, decision = run(job, _seen(_pods(1, 2, 2), capacity=6, step=7), 130)
    assert decision.create_pods == () and decision.delete_pods == ()
    assert job["status"]["dataParallel"] == 4 and job["status"]["layout"] == "dp4 x pp1 x tp1"
    # The attempt ends (a pod fails): the next one is the planned job of 4 pods.
    failed = make_pod(1, 1, phase="Failed", node="node-1", exit_code=1)
    job, decision = run(job, _seen([_pods(1, 2, 2)[0], failed]), 140)
    assert job["status"]["restarts"] == 1
    job, decision = run(job, _seen([]), 200)
    assert decision.create_pods == (0, 1, 2, 3) and "dataParallel" not in job["status"]
    assert job["status"]["layout"] == "dp8 x pp1 x tp1"


def test_a_context_parallel_job_shrinks_its_data_parallelism_and_keeps_cp() -> None:
    """dp4 x cp2 on 4 pods of 2 GPUs: the two placed pods hold dp2 x cp2, the same CP groups."""
    job = _half_placed(strategy={"type": "ddp", "contextParallel": 2})
    assert job["status"]["layout"] == "dp4 x cp2 x pp1 x tp1"
    job, decision = run(job, _seen(_pods(0, 2, 4)), 66)
    status = job["status"]
    assert status["dataParallel"] == 2 and status["layout"] == "dp2 x cp2 x pp1 x tp1"
    assert status["plan"]["cp"] == 2 and status["gpus"] == 4
    job, decision = run(job, _seen([]), 120)
    assert decision.create_pods == (0, 1)
    assert decision.build is not None and decision.build.plan is not None
    assert decision.build.plan.layout.degrees.cp == 2 and decision.build.plan.layout.dp == 2


def test_an_expert_parallel_job_shows_ep_and_reshards_it_when_it_shrinks() -> None:
    """dp8 with ep4 on 4 pods of 2 GPUs: the layout the columns read says (ep4); shrunk to the
    one pod placed (dp2), ep becomes the largest degree dividing both 4 and the new dp x cp x tp
    (2), and the status, the resize and the new attempt's plan say so."""
    moe = {"preset": "tiny", "moe": {"experts": 8}}
    job = _half_placed(strategy={"type": "ddp", "expertParallel": 4}, model=moe)
    assert job["status"]["layout"] == "dp8 x pp1 x tp1 (ep4)"
    job, decision = run(job, _seen(_pods(0, 1, 4), capacity=1), 66)
    status = job["status"]
    assert status["dataParallel"] == 2 and status["layout"] == "dp2 x pp1 x tp1 (ep2)"
    assert status["resizes"][-1]["layout"] == "dp2 x pp1 x tp1 (ep2)"
    assert status["plan"]["layout"] == "dp8 x pp1 x tp1 (ep4)"
    job, decision = run(job, _seen([]), 120)
    assert decision.create_pods == (0,)
    assert decision.build is not None and decision.build.plan is not None
    assert decision.build.plan.layout.ep == 2
