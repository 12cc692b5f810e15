"""On the real control plane: a job from apply to Succeeded, and whole-gang restarts."""

from __future__ import annotations

import json

import pytest
from meshrun_operator import names
from operator_harness import Cluster, OperatorProcess, job_manifest
from waiting import wait_for

from meshrun.api.crd import GROUP, KIND

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]


def env_of(pod: dict[str, object]) -> dict[str, str]:
    container = pod["spec"]["containers"][0]  # type: ignore[index]
    return {e["name"]: e.get("value", "") for e in container["env"]}


def test_job_runs_to_succeeded_with_status_progress_and_events(
    cluster: Cluster, operator_process: OperatorProcess
) -> None:
    cluster.apply(job_manifest("train", strategy={"type": "ddp"}))
    pods = cluster.wait_running_pods("train", 2)
    status = cluster.wait_phase("train", "Running")

    # Children: deterministic names, rendezvous DNS, GPUs, env contract, owner.
    assert [p["metadata"]["name"] for p in pods] == ["train-0", "train-1"]
    for index, pod in enumerate(pods):
        assert pod["spec"]["hostname"] == f"train-{index}"
        assert pod["spec"]["subdomain"] == "train"
        assert pod["spec"]["nodeName"].startswith("gpu-node-")
        limits = pod["spec"]["containers"][0]["resources"]["limits"]
        assert limits == {"nvidia.com/gpu": "4"}
        env = env_of(pod)
        assert env["WORLD_SIZE"] == "8" and env["PET_NNODES"] == "2"
        assert env["PET_NODE_RANK"] == str(index)
        assert env["MASTER_ADDR"] == f"train-0.train.{cluster.ns}.svc"
        owner = pod["metadata"]["ownerReferences"][0]
        assert owner["kind"] == KIND and owner["controller"] is True
    service = json.loads(
        cluster.kubectl("get", "service", "train", "-n", cluster.ns, "-o", "json").stdout
    )
    assert service["spec"]["clusterIP"] == "None"

    # Status: plan summary, placement with real nodes.
    assert status["plan"]["layout"] == "dp8 x pp1 x tp1" and status["plan"]["gpus"] == 8
    placement = {row["pod"]: row for row in status["placement"]}
    assert placement["train-1"]["firstRank"] == 4 and placement["train-1"]["lastRank"] == 7
    assert placement["train-0"]["node"] == pods[0]["spec"]["nodeName"]

    # Progress reported by the trainer through the pod annotation reaches status.
    report = {
        "step": 3,
        "totalSteps": 10,
        "loss": 4.25,
        "tokensPerSecond": 1234.5,
        "stepTimeSeconds": 0.5,
        "updatedAt": 1767225600.0,
    }
    cluster.annotate("pod", "train-0", f"{names.ANNOTATION_PROGRESS}={json.dumps(report)}")
    progress = wait_for(
        lambda: (
            (cluster.status("train").get("progress") or {}).get("step") == 3
            and cluster.status("train")["progress"]
        ),
        30,
        "progress step 3 in status",
    )
    assert progress["loss"] == 4.25 and progress["etaSeconds"] == 3.5

    # Succeeded only once every pod finished.
    summary = {"status": "Succeeded", "steps": 10, "finalLoss": 1.75, "tokensPerSecond": 99.5}
    cluster.finish("train-0", "Succeeded", message=json.dumps(summary))
    wait_for(
        lambda: cluster.pods("train")[0]["status"]["phase"] == "Succeeded",
        30,
        "pod train-0 Succeeded",
    )
    assert cluster.status("train")["phase"] == "Running"
    cluster.finish("train-1", "Succeeded")
    status = cluster.wait_phase("train", "Succeeded")
    assert status["completionTime"]
    # The trainer's final summary (termination message of pod 0) is the final progress.
    assert status["progress"]["loss"] == 1.75 and status["progress"]["step"] == 10
    assert cluster.condition("train", "Succeeded")["status"] == "True"
    # The end's Event is posted after the status that says it: awaited.
    cluster.wait_events("train", "Succeeded")
    reasons = [e["reason"] for e in cluster.events("train")]
    # The launch is told once (its first Running is routine: the status shows it), the end too.
    assert sorted(reasons) == ["PodsCreated", "Succeeded"], reasons
    # cleanPodPolicy Running (the default) keeps the finished pods for their logs.
    assert len(cluster.pods("train")) == 2


def test_a_failed_pod_restarts_the_whole_gang_up_to_the_backoff_limit(
    cluster: Cluster, operator_process: OperatorProcess
) -> None:
    cluster.apply(job_manifest("gang", runPolicy={"backoffLimit": 1}))
    first = cluster.wait_running_pods("gang", 2)
    first_uids = {p["metadata"]["uid"] for p in first}

    cluster.finish("gang-1", "Failed", exit_code=137)
    second = cluster.wait_running_pods("gang", 2, attempt=1, timeout=60)
    assert first_uids.isdisjoint({p["metadata"]["uid"] for p in second}), "pod 0 was kept"
    status = cluster.wait_phase("gang", "Running")
    assert status["restarts"] == 1 and status["attempt"] == 1
    assert cluster.condition("gang", "Restarting")["reason"] == "Recovered"
    killed = [e for e in cluster.events("gang") if e["reason"] == "Killed"]
    assert killed and killed[0]["type"] == "Warning" and "gang-1" in killed[0]["message"]
    # The bookkeeping lives in declared status fields (the API server prunes undeclared ones),
    # not on the spec side where users could edit it; the job carries no finalizer.
    failure = status["lastFailure"]
    assert failure["reason"] == "Killed" and failure["pod"] == "gang-1"
    assert failure["exitCode"] == 137 and failure["class"] == "Retryable"
    assert status["attemptStartTime"] and status["activeSince"] and status["message"]
    metadata = cluster.job("gang")["metadata"]
    ours = [key for key in metadata.get("annotations") or {} if key.startswith(GROUP)]
    assert ours == [] and not metadata.get("finalizers"), metadata

    cluster.finish("gang-0", "Failed", exit_code=143)
    cluster.wait_phase("gang", "Failed")
    failed = cluster.condition("gang", "Failed")
    assert failed["reason"] == "BackoffLimitExceeded" and "gang-0" in failed["message"]
    wait_for(
        lambda: not [p for p in cluster.live_pods("gang") if p["status"].get("phase") == "Running"],
        30,
        "no running pod left after the job failed",
    )
    # Posted after the pass's deletes: the pods can be gone before the Event is there.
    failed_events = cluster.wait_events("gang", "Failed")
    assert any(e["type"] == "Warning" for e in failed_events), failed_events


def test_a_permanent_exit_code_fails_at_once(
    cluster: Cluster, operator_process: OperatorProcess
) -> None:
    cluster.apply(job_manifest("config", runPolicy={"backoffLimit": 5}))
    cluster.wait_running_pods("config", 2)
    cluster.finish("config-0", "Failed", exit_code=2)
    status = cluster.wait_phase("config", "Failed")
    assert status["restarts"] == 0
    assert cluster.condition("config", "Failed")["reason"] == "ConfigError"
    wait_for(
        lambda: [p["metadata"]["name"] for p in cluster.live_pods("config")] == ["config-0"],
        30,
        "the still running pod config-1 deleted, the failed one kept",
    )
