"""The life cycle of a job Kueue governs (lifecycle/queueing.py inside lifecycle.decide), pass by
pass: no pods while queued (the Suspended condition carries Kueue's words), the gang once
admitted with no gang timeout, PodsReady and Finished reported, a restart that keeps the
Workload, and an eviction that re-queues the job without counting a restart."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kueue_factories import condition, make_workload
from meshrun_operator import names
from meshrun_operator.jobstatus import Reason
from meshrun_operator.kueue import (
    ADMITTED,
    EVICTED,
    FINISHED,
    PODS_READY,
    PREEMPTED,
    QUOTA_RESERVED,
    Hold,
    KueueView,
    QueueRef,
)
from meshrun_operator.lifecycle.decide import Decision, decide
from meshrun_operator.lifecycle.evaluation import evaluate
from meshrun_operator.lifecycle.queueing import queue_of
from meshrun_operator.seen.views import Observed, PodView

from meshrun.api.crd import API_VERSION, KIND

pytestmark = pytest.mark.unit

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
NO_QUOTA = "couldn't assign flavors to pod set stage-0: insufficient unused quota for GPUs"
ADMISSION = {
    "clusterQueue": "meshrun-gpus",
    "podSetAssignments": [{"name": "stage-0", "count": 2, "flavors": {"nvidia.com/gpu": "h200"}}],
}
RESERVED = condition(QUOTA_RESERVED, True, "QuotaReserved", "Quota reserved")
IS_ADMITTED = condition(ADMITTED, True, "Admitted", "The workload is admitted")
PREEMPTED_MSG = "Preempted to accommodate a workload (UID: 9) due to prioritization"


def make_job(status: dict[str, Any] | None = None, **scheduling: Any) -> dict[str, Any]:
    """A 2-pod x 4-GPU job in LocalQueue team-a (``scheduling`` overrides; None removes)."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": "job", "namespace": "ns", "uid": "uid-1", "generation": 1},
        "spec": {
            "image": "meshrun/trainer:test",
            "resources": {"numNodes": 2, "numProcPerNode": 4},
            "strategy": {"type": "ddp"},
            "model": {"preset": "tiny"},
            "training": {"steps": 10, "globalBatchSize": 16, "microBatchSize": 2},
            "scheduling": {
                k: v for k, v in {"queueName": "team-a", **scheduling}.items() if v is not None
            },
        },
        "status": copy.deepcopy(status or {}),
    }


def pods(attempt: int = 0, phase: str = "Running", **fields: Any) -> tuple[PodView, ...]:
    return tuple(
        PodView(name=f"job-{i}", index=i, attempt=attempt, phase=phase, node=f"n{i}", **fields)
        for i in range(2)
    )


def admitted(*extra: dict[str, Any]) -> dict[str, Any]:
    return make_workload(RESERVED, IS_ADMITTED, *extra, admission=ADMISSION)


class Passes:
    """Decisions of one job over time: each pass starts from the status the last one wrote."""

    def __init__(self, **scheduling: Any) -> None:
        self.job = make_job(**scheduling)

    def run(
        self, seconds: float, workload: dict[str, Any] | None, *found: PodView, **view: Any
    ) -> Decision:
        observed = Observed(
            pods=found,
            nodes={p.node: True for p in found if p.node},
            kueue=KueueView(workload=workload, **view),
        )
        decision = decide(self.job, observed, T0 + timedelta(seconds=seconds))
        self.job["status"] = decision.status
        return decision

    def condition(self, kind: str) -> dict[str, Any]:
        found = [c for c in self.job["status"]["conditions"] if c["type"] == kind]
        return found[0] if found else {}


def test_no_pods_while_queued_and_the_condition_carries_kueues_words() -> None:
    job = Passes()
    first = job.run(0, None)
    assert first.kueue is not None and first.kueue.create == QueueRef("team-a", None)
    assert first.create_pods == () and first.status["phase"] == "Suspended"
    assert job.condition("Suspended")["reason"] == "Queued"

    pending = make_workload(condition(QUOTA_RESERVED, False, "Pending", NO_QUOTA))
    waiting = job.run(1, pending)
    assert waiting.kueue is not None and waiting.kueue.create is None
    assert waiting.create_pods == () and waiting.status["phase"] == "Suspended"
    suspended = job.condition("Suspended")
    assert (suspended["status"], suspended["reason"], suspended["message"]) == (
        "True",
        "Pending",
        NO_QUOTA,
    )
    assert waiting.status["message"] == f"queued in LocalQueue team-a: {NO_QUOTA}"
    # A new reason while queued is told once, as an Event.
    assert [e.reason for e in waiting.events] == ["Pending"]
    assert job.run(2, pending).events == ()


def test_admission_starts_the_gang_and_kueue_not_meshrun_times_it() -> None:
    job = Passes(gangTimeoutSeconds=30)
    job.run(0, make_workload())
    start = job.run(1, admitted())
    assert start.create_pods == (0, 1)
    assert start.kueue is not None and start.kueue.admitted is not None
    suspended = job.condition("Suspended")
    assert (suspended["status"], suspended["reason"]) == ("False", "Admitted")
    assert "ClusterQueue meshrun-gpus" in suspended["message"]
    # Unbound far past gangTimeoutSeconds: Kueue's waitForPodsReady decides, not meshrun.
    unbound = tuple(PodView(name=f"job-{i}", index=i, attempt=0, phase="Pending") for i in range(2))
    late = job.run(600, admitted(), *unbound)
    assert late.delete_pods == () and late.state.gang_retries == 0
    assert late.kueue is not None and late.kueue.status_patch is not None
    waiting = late.kueue.status_patch["status"]["conditions"][-1]
    assert (waiting["type"], waiting["status"], waiting["reason"]) == (
        PODS_READY,
        "False",
        "WaitForStart",
    )
    # The same job without a queue is torn down by the gang timeout.
    plain = make_job(status=late.status, queueName=None)
    plain["spec"]["scheduling"] = {"gangTimeoutSeconds": 30}
    torn = decide(plain, Observed(pods=unbound, nodes={}), T0 + timedelta(seconds=600))
    assert torn.delete_pods == ("job-0", "job-1")


def test_running_reports_pods_ready_and_the_end_reports_finished() -> None:
    job = Passes()
    job.run(0, admitted())
    running = job.run(1, admitted(), *pods())
    assert running.status["phase"] == "Running"
    assert running.kueue is not None and running.kueue.status_patch is not None
    ready = running.kueue.status_patch["status"]["conditions"][-1]
    assert (ready["type"], ready["status"], ready["reason"]) == (PODS_READY, "True", "Started")
    assert running.kueue.status_patch["metadata"]["resourceVersion"] == "42"
    reported = admitted(condition(PODS_READY, True, "Started"))
    again = job.run(2, reported, *pods())
    assert again.kueue is not None and again.kueue.status_patch is None

    done = job.run(3, reported, *pods(phase="Succeeded"))
    assert done.status["phase"] == "Succeeded"
    assert done.kueue is not None and done.kueue.status_patch is not None
    finished = done.kueue.status_patch["status"]["conditions"][-1]
    assert (finished["type"], finished["reason"]) == (FINISHED, "Succeeded")
    ended = admitted(condition(PODS_READY, True, "Started"), condition(FINISHED, True, "Succeeded"))
    after = job.run(4, ended, *pods(phase="Succeeded"))
    assert after.kueue is None or after.kueue.status_patch is None


def test_a_whole_gang_restart_keeps_the_workload_and_waits_for_recovery() -> None:
    job = Passes()
    job.run(0, admitted())
    ready = admitted(condition(PODS_READY, True, "Started"))
    job.run(1, ready, *pods())
    failed = (pods()[0], PodView(name="job-1", index=1, attempt=0, phase="Failed", exit_code=1))
    restart = job.run(2, ready, *failed)
    assert restart.state.restarts == 1 and restart.state.attempt == 1
    assert restart.kueue is not None and restart.kueue.create is None
    assert restart.kueue.status_patch is not None
    waiting = restart.kueue.status_patch["status"]["conditions"][-1]
    assert (waiting["status"], waiting["reason"]) == ("False", "WaitForRecovery")
    recovering = admitted(condition(PODS_READY, False, "WaitForRecovery"))
    # The new attempt starts under the same admission, after the backoff.
    new = job.run(60, recovering)
    assert new.create_pods == (0, 1) and new.kueue is not None and new.kueue.admitted is not None
    back = job.run(61, recovering, *pods(attempt=1))
    assert back.kueue is not None and back.kueue.status_patch is not None
    recovered = back.kueue.status_patch["status"]["conditions"][-1]
    assert (recovered["status"], recovered["reason"]) == ("True", "Recovered")


def test_an_eviction_requeues_the_job_without_counting_a_restart() -> None:
    job = Passes()
    job.run(0, admitted())
    job.run(1, admitted(), *pods())
    evicted = admitted(
        condition(EVICTED, True, "Preempted", PREEMPTED_MSG),
        condition(PREEMPTED, True, "InClusterQueue", PREEMPTED_MSG),
    )
    first = job.run(2, evicted, *pods())
    assert first.delete_pods == ("job-0", "job-1")
    assert first.state.restarts == 0 and first.state.attempt == 1
    assert first.state.disruptions == 1  # counted as a disruption, not against backoffLimit
    assert first.status["phase"] == "Suspended" and first.state.last_failure is None
    suspended = job.condition("Suspended")
    assert (suspended["reason"], suspended["message"]) == ("Preempted", PREEMPTED_MSG)
    assert "Preempted" in [e.reason for e in first.events]
    assert first.kueue is not None and first.kueue.status_patch is None  # pods still there

    # Pods dying of the eviction (SIGTERM) are not failures; the attempt is not bumped twice.
    dying = pods(phase="Failed", exit_code=143, deleting=True)
    second = job.run(3, evicted, *dying)
    assert second.state.restarts == 0 and second.state.attempt == 1
    assert second.state.disruptions == 1
    assert second.delete_pods == ()

    gone = job.run(4, evicted)
    assert gone.kueue is not None and gone.kueue.status_patch is not None
    patched = {c["type"]: c for c in gone.kueue.status_patch["status"]["conditions"]}
    assert patched[QUOTA_RESERVED]["status"] == "False"
    assert patched["Requeued"]["status"] == "True"
    assert gone.kueue.status_patch["status"]["admission"] is None

    # Re-admitted: attempt 1 starts (its trainer resumes from the last checkpoint).
    job.run(5, make_workload(condition(QUOTA_RESERVED, False, "Pending", NO_QUOTA)))
    again = job.run(6, admitted())
    assert again.create_pods == (0, 1) and again.state.attempt == 1
    assert again.state.restarts == 0 and again.state.disruptions == 1


@pytest.mark.parametrize(
    ("view", "reason", "saying"),
    [
        (None, Reason.KUEUE_DISABLED, "--no-kueue"),
        (
            KueueView(hold=Hold(Reason.KUEUE_NOT_INSTALLED, "no Kueue here")),
            Reason.KUEUE_NOT_INSTALLED,
            "no Kueue here",
        ),
        (
            KueueView(workload=make_workload(active=False)),
            Reason.WORKLOAD_INACTIVE,
            "spec.active is false",
        ),
    ],
)
def test_a_job_that_cannot_queue_says_why_and_waits(
    view: KueueView | None, reason: Reason, saying: str
) -> None:
    decision = decide(make_job(), Observed(pods=(), nodes={}, kueue=view), T0)
    assert decision.create_pods == () and decision.status["phase"] == "Suspended"
    assert decision.kueue is not None and decision.kueue.create is None
    (suspended,) = [c for c in decision.status["conditions"] if c["type"] == "Suspended"]
    assert suspended["reason"] == reason and saying in suspended["message"]
    assert any(e.type == "Warning" and e.reason == reason for e in decision.events)


def test_an_invalid_job_finishes_its_workload() -> None:
    job = make_job()
    job["spec"]["resources"]["numProcPerNode"] = 3  # tensor/ddp layout that cannot plan
    job["spec"]["strategy"] = {"type": "tensor", "tensorParallel": 2}
    observed = Observed(pods=(), nodes={}, kueue=KueueView(workload=admitted()))
    decision = decide(job, observed, T0)
    assert decision.invalid and decision.kueue is not None
    assert decision.kueue.status_patch is not None
    finished = decision.kueue.status_patch["status"]["conditions"][-1]
    assert (finished["type"], finished["reason"]) == (FINISHED, "Failed")


def test_which_queue_governs_a_job() -> None:
    def of(labels: dict[str, str], **scheduling: Any) -> QueueRef | None:
        job = make_job(**scheduling)
        job["metadata"]["labels"] = labels
        return queue_of(evaluate(job["spec"], "job").spec, job["metadata"])

    priority = {"kueue.x-k8s.io/priority-class": "meshrun-high"}
    assert of(priority) == QueueRef("team-a", "meshrun-high")
    assert of({names.KUEUE_QUEUE_LABEL: "team-b"}, queueName=None) == QueueRef("team-b")
    assert of({}, queueName=None) is None
    assert of({}, schedulerName="volcano") is None  # volcano's own queue


def test_placement_shows_each_pods_stage_and_domain() -> None:
    job = make_job(topologyKey="topology.meshrun.dev/rack")
    job["spec"]["strategy"] = {"type": "pipeline", "pipelineParallel": 2}
    job["spec"]["model"] = {"preset": "tiny"}
    job["spec"]["training"]["microBatchSize"] = 1
    observed = Observed(
        pods=pods(),
        nodes={"n0": True, "n1": True},
        kueue=KueueView(workload=admitted()),
        domains={"n0": "rack-0", "n1": "rack-1"},
    )
    rows = decide(job, observed, T0).status["placement"]
    assert [(r["pod"], r["stage"], r.get("domain")) for r in rows] == [
        ("job-0", 0, "rack-0"),
        ("job-1", 1, "rack-1"),
    ]


def test_an_elastic_job_admitted_with_fewer_pods_runs_at_that_size() -> None:
    job = Passes()
    job.job["spec"]["elastic"] = {"minDataParallel": 4}
    job.run(0, make_workload())
    partial = {
        **ADMISSION,
        "podSetAssignments": [{**ADMISSION["podSetAssignments"][0], "count": 1}],
    }
    start = job.run(1, make_workload(RESERVED, IS_ADMITTED, admission=partial))
    # One pod of 4 GPUs: dp4 instead of the planned dp8, twice the gradient accumulation.
    assert start.create_pods == (0,)
    assert start.build is not None and start.build.plan is not None
    layout = start.build.plan.layout
    assert (layout.dp, layout.grad_accumulation) == (4, 2)
    status = start.status
    assert (status["dataParallel"], status["plan"]["dp"], status["layout"]) == (
        4,
        8,
        "dp4 x pp1 x tp1",
    )
    running = job.run(5, make_workload(RESERVED, IS_ADMITTED, admission=partial), *pods()[:1])
    assert running.status["phase"] == "Running" and running.create_pods == ()
    assert running.delete_pods == ()


def test_a_rigid_job_runs_its_planned_size_whatever_the_admission_says() -> None:
    # Kueue admits a job without minCount whole or not at all; the operator never shrinks it.
    job = Passes()
    job.run(0, make_workload())
    start = job.run(1, admitted())
    assert start.create_pods == (0, 1) and "dataParallel" not in start.status
