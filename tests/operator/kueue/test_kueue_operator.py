"""The operator under the real Kueue v0.17 (KWOK GPU nodes of the flavor's pool, 2 racks of 4
nodes x 8 GPUs, a ClusterQueue of 32 GPUs): a job over the quota waits with no pods and Kueue's
reason until the first one finishes; deleting a queued or a running job gives its place and
quota back; each pipeline stage lands in one rack and status.placement shows it; a higher
priority preempts a running job, which goes back to the queue without a restart counted and
resumes later on its checkpoint volume; a whole-gang restart keeps the admission; a queue that
cannot work says why.

The operator runs as users run it (``meshrun operator``), serving both team namespaces.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kueue_objects as ko
import pytest
from hostvolumes import host_path_claim
from kueue_factories import pipeline_spec
from kueue_support import Kubectl, KueueEnv, get_json, workload
from meshrun_operator import kueue, names
from meshrun_operator.kueue import ADMITTED, FINISHED, PODS_READY, condition
from operator_harness import Cluster, OperatorProcess
from waiting import wait_for

from meshrun.api.crd import API_VERSION, KIND, PLURAL
from meshrun.jobdoc import JOB_VARIABLE, read_document

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(1800)]

NO_QUOTA = f"insufficient unused quota for nvidia.com/gpu in flavor {ko.FLAVOR}"


@pytest.fixture(scope="module")
def teams(
    kubeconfig: str,
    kubectl: Kubectl,
    kueue_env: KueueEnv,
    kueue_pool: str,
    crds_installed: list[str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, Cluster]]:
    """One operator serving both team namespaces; a Cluster helper per team."""
    first, *others = kueue_env.namespaces.values()
    extra = [f"--namespace={namespace}" for namespace in others]
    process = OperatorProcess(kubeconfig, first, tmp_path_factory.mktemp("kueue-op"), extra)
    process.start()
    yield {team: Cluster(kubectl, ns) for team, ns in kueue_env.namespaces.items()}
    for namespace in kueue_env.namespaces.values():
        kubectl("delete", PLURAL, "--all", "-n", namespace, "--wait=true", check=False)
    process.stop()
    print(f"--- operator log ({process.log_path}) ---\n{process.log_tail(120)}")


@pytest.fixture(autouse=True)
def empty_queue(teams: dict[str, Cluster], kubectl: Kubectl) -> Iterator[None]:
    """Each test starts with the shared ClusterQueue holding nothing and ends by deleting its
    jobs: a Workload left by a test before (a failed one, or one whose garbage collection lags
    on a busy machine) would otherwise take quota that this test's figures count on."""
    queue_empty(kubectl)
    yield
    for team in teams.values():
        kubectl("delete", PLURAL, "--all", "-n", team.ns, "--wait=false", check=False)


def queue_empty(kubectl: Kubectl) -> None:
    """Wait until no Workload of any namespace reserves quota in, or waits for, the queue."""

    def held() -> dict[str, int]:
        status = get_json(kubectl, "clusterqueues", ko.CLUSTER_QUEUE).get("status", {})
        keys = ("reservingWorkloads", "admittedWorkloads", "pendingWorkloads")
        return {key: status.get(key, 0) for key in keys if status.get(key, 0)}

    wait_for(
        lambda: not held(),
        120,
        f"the ClusterQueue {ko.CLUSTER_QUEUE} empty",
        describe=lambda: (held(), kubectl("get", "workloads", "-A").stdout),
    )


def submit(
    team: Cluster,
    num_nodes: int,
    pp: int,
    priority: str | None = None,
    queue: str | None = None,
    **spec: Any,
) -> str:
    """A job of ``num_nodes`` pods x 8 GPUs in ``pp`` stages, queued with each stage in a rack."""
    name = f"train-{uuid.uuid4().hex[:5]}"
    labels = {"kueue.x-k8s.io/priority-class": priority} if priority else {}
    manifest = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name, "labels": labels},
        "spec": {
            **pipeline_spec(num_nodes, 8, pp),
            "scheduling": {"queueName": queue or team_queue(team)},
            **spec,
        },
    }
    manifest["spec"]["scheduling"]["topologyKey"] = ko.RACK_LABEL
    team.apply(manifest)
    return name


def team_queue(team: Cluster) -> str:
    """The LocalQueue of a team's namespace (``kueue-<team>-<session>``) is named after the team."""
    return "-".join(team.ns.split("-")[1:3])


def suspended(team: Cluster, job: str, reason: str, saying: str = "") -> dict[str, Any]:
    """Wait until the job is Suspended by Kueue with ``reason``; the Suspended condition."""

    def reached() -> dict[str, Any] | None:
        status = team.status(job)
        found = team.condition(job, "Suspended")
        held = status.get("phase") == "Suspended" and found.get("status") == "True"
        return (
            found if held and found.get("reason") == reason and saying in found["message"] else None
        )

    found: dict[str, Any] = wait_for(
        reached,
        60,
        f"job {job} Suspended with reason {reason}",
        describe=lambda: (team.status(job).get("message"), team.condition(job, "Suspended")),
    )
    return found


def job_workload(team: Cluster, job: str) -> dict[str, Any]:
    uid = team.job(job)["metadata"]["uid"]
    return workload(team.kubectl, team.ns, kueue.workload_name(job, uid))


def stages_in_one_rack(kubectl: Kubectl, status: dict[str, Any]) -> dict[int, str]:
    """Each stage's rack from status.placement, checked against the nodes' own labels."""
    racks: dict[int, set[str]] = {}
    for row in status["placement"]:
        node = get_json(kubectl, "node", row["node"])
        assert node["metadata"]["labels"][ko.RACK_LABEL] == row["domain"], row
        assert node["metadata"]["labels"][ko.POOL_LABEL] == ko.POOL, row
        racks.setdefault(row["stage"], set()).add(row["domain"])
    assert all(len(r) == 1 for r in racks.values()), f"a stage spans racks: {racks}"
    return {stage: r.pop() for stage, r in racks.items()}


def running(team: Cluster, job: str, pods: int, attempt: int = 0) -> dict[str, Any]:
    team.wait_running_pods(job, pods, attempt=attempt)
    return team.wait_phase(job, "Running")


def finish_all(team: Cluster, job: str, outcome: str = "Succeeded") -> None:
    for pod in team.live_pods(job):
        team.finish(pod["metadata"]["name"], outcome)


def test_quota_queues_a_job_with_kueues_reason_and_deleting_jobs_gives_the_quota_back(
    teams: dict[str, Cluster], kubectl: Kubectl
) -> None:
    a, b = teams["team-a"], teams["team-b"]
    first = submit(a, num_nodes=2, pp=2, priority="meshrun-low")  # 16 of 32 GPUs
    status = running(a, first, 2)
    stages_in_one_rack(kubectl, status)
    assert a.condition(first, "Suspended")["reason"] == "Admitted"

    # 32 more GPUs do not fit: queued, with no pods and Kueue's own words.
    second = submit(b, num_nodes=4, pp=2, priority="meshrun-low")
    held = suspended(b, second, "Pending", NO_QUOTA)
    assert "16 more needed" in held["message"]
    assert b.pods(second) == []
    assert b.status(second)["message"].startswith("queued in LocalQueue team-b: ")
    listing = kubectl("get", "workloads", "-n", b.ns).stdout
    assert f"paralleltrainingjob-{second}-" in listing and "team-b" in listing, listing

    # Deleting a queued job deletes its Workload: the queue no longer holds it.
    kubectl("delete", PLURAL, second, "-n", b.ns)
    gone = kubectl("get", "workloads", "-n", b.ns, "-o", "name").stdout
    wait_for(
        lambda: second not in kubectl("get", "workloads", "-n", b.ns, "-o", "name").stdout,
        30,
        f"the Workload of the deleted job {second} gone",
        describe=lambda: gone,
    )

    # Queued again; the first job finishing (Finished on its Workload) lets it start.
    third = submit(b, num_nodes=4, pp=2, priority="meshrun-low")
    suspended(b, third, "Pending", NO_QUOTA)
    finish_all(a, first)
    a.wait_phase(first, "Succeeded")
    ended = condition(job_workload(a, first), FINISHED)
    assert ended is not None and (ended["status"], ended["reason"]) == ("True", "Succeeded")
    status = running(b, third, 4)
    racks = stages_in_one_rack(kubectl, status)
    assert len(racks) == 2, racks
    admitted = b.condition(third, "Suspended")
    assert (admitted["status"], admitted["reason"]) == ("False", "Admitted")
    assert ko.CLUSTER_QUEUE in admitted["message"]
    ready = condition(job_workload(b, third), PODS_READY)
    assert ready is not None and (ready["status"], ready["reason"]) == ("True", "Started")

    # Deleting a running job gives its quota back at once: the next one runs.
    fourth = submit(a, num_nodes=4, pp=2, priority="meshrun-low")
    suspended(a, fourth, "Pending", NO_QUOTA)
    kubectl("delete", PLURAL, third, "-n", b.ns, "--wait=false")
    running(a, fourth, 4)


def test_partial_admission_runs_an_elastic_job_at_the_admitted_size_and_a_rigid_one_waits(
    teams: dict[str, Cluster], kubectl: Kubectl
) -> None:
    """16 of the queue's 32 GPUs are taken. A job of 4 pods x 8 GPUs (DDP, dp32) without
    spec.elastic waits for all of them; the same job with ``minDataParallel: 8`` is admitted
    with the 2 pods the quota holds (its Workload's minCount is 1 pod) and trains at dp16, the
    same global batch through twice the accumulation."""
    a, b = teams["team-a"], teams["team-b"]
    holder = submit(a, num_nodes=2, pp=2, priority="meshrun-low")  # 16 of 32 GPUs
    running(a, holder, 2)
    ddp = {"strategy": {"type": "ddp"}}

    rigid = submit(b, num_nodes=4, pp=1, priority="meshrun-low", **ddp)
    suspended(b, rigid, "Pending", NO_QUOTA)
    assert "minCount" not in job_workload(b, rigid)["spec"]["podSets"][0]
    assert b.pods(rigid) == []
    kubectl("delete", PLURAL, rigid, "-n", b.ns)

    elastic = {"minDataParallel": 8}
    job = submit(b, num_nodes=4, pp=1, priority="meshrun-low", elastic=elastic, **ddp)
    status = running(b, job, 2)
    pod_set = job_workload(b, job)["spec"]["podSets"][0]
    assert (pod_set["count"], pod_set["minCount"]) == (4, 1)
    admission = job_workload(b, job)["status"]["admission"]["podSetAssignments"]
    assert [assignment["count"] for assignment in admission] == [2]
    running_at = (status["dataParallel"], status["layout"], status["gpus"])
    assert running_at == (16, "dp16 x pp1 x tp1", 16)
    assert status["plan"]["dp"] == 32, "status.plan keeps the planned layout"
    pods = b.live_pods(job)
    assert sorted(p["metadata"]["name"] for p in pods) == [f"{job}-0", f"{job}-1"]
    document = read_document(_env(pods[0])[JOB_VARIABLE])
    assert (document.plan.layout.dp, document.plan.layout.grad_accumulation) == (16, 4)
    assert status.get("restarts", 0) == 0

    finish_all(b, job)
    b.wait_phase(job, "Succeeded")


def _checkpoint_claim(kubectl: Kubectl, namespace: str) -> str:
    """A PersistentVolumeClaim bound to a hostPath volume (the pods are fake; the claim is what
    a resumed attempt must find again)."""
    claim = "checkpoints"
    volume = f"ckpt-{namespace}"
    labels = {"meshrun.dev/kueue-test": "true"}
    pv, pvc = host_path_claim(
        namespace, claim, volume, f"/tmp/{volume}", reclaim="Delete", labels=labels
    )
    kubectl(
        "apply",
        "-f",
        "-",
        input=json.dumps({"kind": "List", "apiVersion": "v1", "items": [pv, pvc]}),
    )
    wait_for(
        lambda: get_json(kubectl, "pvc", claim, "-n", namespace)["status"].get("phase") == "Bound",
        60,
        f"claim {claim} Bound",
    )
    return claim


def _env(pod: dict[str, Any]) -> dict[str, str]:
    (trainer,) = [c for c in pod["spec"]["containers"] if c["name"] == names.TRAINER_CONTAINER]
    return {e["name"]: e.get("value", "") for e in trainer["env"]}


def test_a_higher_priority_preempts_and_the_victim_resumes_later_without_a_restart(
    teams: dict[str, Cluster], kubectl: Kubectl
) -> None:
    a, b = teams["team-a"], teams["team-b"]
    claim = _checkpoint_claim(kubectl, b.ns)
    training = {**pipeline_spec()["training"], "checkpoint": {"volume": claim, "everySteps": 2}}
    victim = submit(b, num_nodes=4, pp=2, priority="meshrun-low", training=training)
    running(b, victim, 4)
    b.annotate("pod", f"{victim}-0", 'meshrun.dev/progress={"step": 4, "totalSteps": 10}')
    wait_for(lambda: b.status(victim).get("progress", {}).get("step") == 4, 30, "step 4 seen")

    urgent = submit(a, num_nodes=2, pp=2, priority="meshrun-high")
    # Evicted: a Warning with Kueue's words, the pods deleted, then back in the queue (the
    # operator released the admission) until the quota is free again.
    warned = wait_for(
        lambda: [e for e in b.events(victim) if e["reason"] == "Preempted"],
        60,
        f"a Preempted Event on {victim}",
        describe=lambda: (b.status(victim).get("message"), [e["reason"] for e in b.events(victim)]),
    )
    assert warned[0]["type"] == "Warning" and "evicted by Kueue" in warned[0]["message"]
    wait_for(lambda: b.pods(victim) == [], 60, f"the pods of {victim} deleted")
    suspended(b, victim, "Pending", NO_QUOTA)
    status = b.status(victim)
    assert (status["restarts"], status["attempt"], status["disruptions"]) == (0, 1, 1), status
    assert "lastFailure" not in status, status["lastFailure"]
    requeued = condition(job_workload(b, victim), "Requeued")
    assert requeued is not None and (requeued["status"], requeued["reason"]) == (
        "True",
        "Preempted",
    )
    running(a, urgent, 2)

    # The urgent job ends: the victim is admitted again and attempt 1 starts, on the same
    # checkpoint claim, so its trainer resumes from the last checkpoint there.
    finish_all(a, urgent)
    a.wait_phase(urgent, "Succeeded")
    status = running(b, victim, 4, attempt=1)
    assert (status["restarts"], status["attempt"]) == (0, 1), status
    for pod in b.live_pods(victim):
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        assert volumes["meshrun-checkpoints"]["persistentVolumeClaim"]["claimName"] == claim
        env = _env(pod)
        assert env["MESHRUN_ATTEMPT"] == "1" and env["MESHRUN_CHECKPOINT_DIR"] == "/checkpoints"


def test_a_whole_gang_restart_keeps_the_admission(
    teams: dict[str, Cluster], kubectl: Kubectl
) -> None:
    a = teams["team-a"]
    job = submit(a, num_nodes=2, pp=2)
    running(a, job, 2)
    before = job_workload(a, job)
    was_admitted = condition(before, ADMITTED)
    nodes = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in a.live_pods(job)}

    a.finish(f"{job}-1", "Failed", exit_code=1)
    status = running(a, job, 2, attempt=1)
    assert (status["restarts"], status["attempt"]) == (1, 1), status
    after = job_workload(a, job)
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    still = condition(after, ADMITTED)
    assert still is not None and was_admitted is not None
    assert (still["status"], still["lastTransitionTime"]) == (
        "True",
        was_admitted["lastTransitionTime"],
    )
    wait_for(
        lambda: (condition(job_workload(a, job), PODS_READY) or {}).get("reason") == "Recovered",
        30,
        "PodsReady Recovered",
    )
    # Kueue saw no unhealthy node (the pod sets tolerate the flavor's taint), and the same
    # admission places each pod on its node again.
    assert "unhealthyNodes" not in after.get("status", {}), after["status"]["unhealthyNodes"]
    assert {p["metadata"]["name"]: p["spec"]["nodeName"] for p in a.live_pods(job)} == nodes


def test_a_queue_that_cannot_work_says_why(teams: dict[str, Cluster], kubectl: Kubectl) -> None:
    a = teams["team-a"]
    lost = submit(a, num_nodes=2, pp=2, queue="team-z")
    suspended(a, lost, "Inadmissible", "LocalQueue team-z doesn't exist")
    unknown = submit(a, num_nodes=2, pp=2, priority="meshrun-urgent")
    found = suspended(a, unknown, "WorkloadPriorityClassNotFound", "meshrun-urgent")
    assert a.pods(unknown) == [] and a.pods(lost) == []
    # The Event is posted after the status that carries the condition: awaited.
    warned = [e["type"] for e in a.wait_events(unknown, found["reason"])]
    assert warned == ["Warning"], a.events(unknown)


def test_without_kueue_a_queue_name_says_so_and_other_jobs_run_as_before(
    kubeconfig: str, kubectl: Kubectl, namespace: str, crds_installed: list[str], tmp_path: Path
) -> None:
    process = OperatorProcess(kubeconfig, namespace, tmp_path, ["--no-kueue"]).start()
    try:
        team = Cluster(kubectl, namespace)
        queued = submit(team, num_nodes=2, pp=2, queue="team-a")
        found = suspended(team, queued, "KueueDisabled", "--no-kueue")
        assert "spec.scheduling.queueName is team-a" in found["message"]
        plain = f"plain-{uuid.uuid4().hex[:5]}"
        manifest = {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {"name": plain},
            "spec": pipeline_spec(2, 8, 2),
        }
        team.apply(manifest)
        team.wait_running_pods(plain, 2)
        assert team.pods(queued) == []
    finally:
        kubectl("delete", PLURAL, "--all", "-n", namespace, "--wait=false", check=False)
        process.stop()
