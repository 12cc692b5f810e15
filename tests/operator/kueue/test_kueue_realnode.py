"""A preempted job really resumes: on the real node, a CPU training job queued through Kueue (a
ResourceFlavor of the real node, a ClusterQueue with one CPU of quota) is preempted after its
first checkpoint (every 5 steps) by a job of higher priority, goes back to the queue with no
restart counted, and once the urgent job has finished, Kueue admits it again and its trainer
resumes from the checkpoint on its volume and trains to the end.

The operator runs as a process here; the pods run the trainer image on the real node.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hostvolumes import host_path_claim
from kueue_support import Kubectl, KueueEnv, get_json
from meshrun_operator import names
from operator_harness import Cluster, OperatorProcess
from waiting import wait_for

from meshrun.api.crd import PLURAL

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests" / "realnode"))
from e2e_support import TRAINER_IMAGE  # noqa: E402

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(3600)]

API = "kueue.x-k8s.io/v1beta2"
REAL = "meshrun.dev/real-node"
FLAVOR = "real-node-cpu"
QUEUE = "real-node-cpu"
STEPS = 400
"""The victim: a checkpoint every 5 steps; a step of the tiny model on 2 pods x 1 process takes
about 35 ms, so the preemption after the first checkpoint lands well before the end (the 3D
demo's 8 processes would spend four times the CPU on the same assertions)."""
DEMO = ROOT / "examples" / "demo-3d-cpu.yaml"


def _kueue_objects(namespace: str) -> list[dict[str, Any]]:
    toleration = {"key": REAL, "operator": "Equal", "value": "true", "effect": "NoSchedule"}
    quota = {"name": "cpu", "nominalQuota": "1"}
    return [
        {
            "apiVersion": API,
            "kind": "ResourceFlavor",
            "metadata": {"name": FLAVOR},
            "spec": {"nodeLabels": {REAL: "true"}, "tolerations": [toleration]},
        },
        {
            "apiVersion": API,
            "kind": "ClusterQueue",
            "metadata": {"name": QUEUE},
            "spec": {
                "namespaceSelector": {},
                "preemption": {"withinClusterQueue": "LowerPriority"},
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu"],
                        "flavors": [{"name": FLAVOR, "resources": [quota]}],
                    }
                ],
            },
        },
        {
            "apiVersion": API,
            "kind": "LocalQueue",
            "metadata": {"name": QUEUE, "namespace": namespace},
            "spec": {"clusterQueue": QUEUE},
        },
    ]


def _job(name: str, priority: str, cpu: str, pods: int, procs: int) -> dict[str, Any]:
    """The demo job's model and training as DDP on ``pods`` x ``procs`` CPU processes, in the
    queue, each pod requesting ``cpu``."""
    job: dict[str, Any] = yaml.safe_load(DEMO.read_text())
    job["metadata"] = {"name": name, "labels": {"kueue.x-k8s.io/priority-class": priority}}
    resources = {"requests": {"cpu": cpu}}
    job["spec"]["podTemplate"] = {
        "spec": {"containers": [{"name": "trainer", "resources": resources}]}
    }
    job["spec"]["scheduling"] = {"queueName": QUEUE}
    job["spec"]["resources"] = {"numNodes": pods, "numProcPerNode": procs, "accelerator": "cpu"}
    job["spec"]["strategy"] = {"type": "ddp"}
    return job


def _checkpoint_claim(kubectl: Kubectl, namespace: str, directory: Path) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o777)  # the trainer runs as uid 1000
    claim, volume = "checkpoints", f"kueue-ckpt-{namespace[-12:]}"
    pv, pvc = host_path_claim(namespace, claim, volume, str(directory))
    pv["spec"]["hostPath"]["type"] = "Directory"
    kubectl(
        "apply",
        "-f",
        "-",
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": [pv, pvc]}),
    )
    return claim


@pytest.fixture
def real_queue(
    kubeconfig: str,
    kubectl: Kubectl,
    namespace: str,
    real_node: str,
    kueue_env: KueueEnv,
    crds_installed: list[str],
    tmp_path: Path,
) -> Iterator[tuple[Cluster, Path]]:
    """The trainer image on the node, the real node's queue, the operator; (cluster, the
    checkpoint folder on this host)."""
    build = subprocess.run(
        [str(ROOT / "hack" / "realnode" / "images.sh"), "build", "trainer", TRAINER_IMAGE],
        capture_output=True,
        text=True,
        timeout=2400,
    )
    assert build.returncode == 0, (
        f"building {TRAINER_IMAGE} failed:\n{build.stdout}\n{build.stderr}"
    )
    objects = _kueue_objects(namespace)
    kubectl(
        "apply",
        "--server-side",
        "-f",
        "-",
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}),
    )
    directory = Path("/var/lib/meshrun-checkpoints") / namespace
    process = OperatorProcess(kubeconfig, namespace, tmp_path).start()
    try:
        yield Cluster(kubectl, namespace), directory
    finally:
        kubectl(
            "delete",
            PLURAL,
            "--all",
            "-n",
            namespace,
            "--wait=true",
            "--timeout=60s",
            check=False,
        )
        process.stop()
        print(f"--- operator log ---\n{process.log_tail(60)}")
        kubectl("delete", "pv", f"kueue-ckpt-{namespace[-12:]}", "--wait=false", check=False)
        kubectl("delete", "clusterqueue", QUEUE, "--wait=false", check=False)
        kubectl("delete", "resourceflavor", FLAVOR, "--wait=false", check=False)
        shutil.rmtree(directory, ignore_errors=True)


def _summary(pod: dict[str, Any]) -> dict[str, Any]:
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    found: dict[str, Any] = json.loads(terminated["message"])
    return found


def test_a_preempted_job_resumes_from_its_checkpoint_on_the_real_node(
    real_queue: tuple[Cluster, Path], kubectl: Kubectl
) -> None:
    cluster, directory = real_queue
    claim = _checkpoint_claim(kubectl, cluster.ns, directory)
    victim = _job("victim", "meshrun-low", "500m", pods=2, procs=1)
    training = copy.deepcopy(victim["spec"]["training"])
    training["steps"] = STEPS
    training["checkpoint"] = {**training.get("checkpoint", {}), "volume": claim, "everySteps": 5}
    victim["spec"]["training"] = training
    cluster.apply(victim)

    # A checkpoint is on the volume (the first, at step 5 or a few steps later: the trainer keeps
    # the last two, so step 5's may be gone within a second): the urgent job (all the quota)
    # preempts. The folder is this host's, so a fast poll costs no API call.
    def first_checkpoint() -> str | None:
        done = sorted(path.parent.name for path in directory.glob("step-*/.metadata"))
        return done[0] if done else None

    wait_for(
        first_checkpoint,
        900,
        "the victim's first checkpoint",
        interval=0.2,
        describe=lambda: (cluster.status("victim").get("message"), sorted(os.listdir(directory))),
    )
    urgent = _job("urgent", "meshrun-high", "1", pods=1, procs=2)
    urgent["spec"]["training"] = {**urgent["spec"]["training"], "steps": 2, "checkpoint": {}}
    cluster.apply(urgent)
    wait_for(
        lambda: [e for e in cluster.events("victim") if e["reason"] == "Preempted"],
        120,
        "the victim preempted",
        describe=lambda: cluster.status("victim").get("message"),
    )
    status = cluster.status("victim")
    assert status["phase"] == "Suspended" and (status["restarts"], status["attempt"]) == (0, 1)

    # The urgent job runs and ends; the victim is admitted again and resumes.
    cluster.wait_phase("urgent", "Succeeded", timeout=900)
    status = cluster.wait_phase("victim", "Succeeded", timeout=1200)
    assert (status["restarts"], status["attempt"], status["disruptions"]) == (0, 1, 1), status
    assert status["progress"]["step"] == STEPS, status["progress"]
    pods = get_json(kubectl, "pods", "-n", cluster.ns, "-l", names.selector("victim"))["items"]
    first = [p for p in pods if p["metadata"]["name"] == "victim-0"]
    summary = _summary(first[0])
    assert 5 <= summary["resumedFromStep"] < STEPS, summary
    assert first[0]["metadata"]["labels"][names.LABEL_ATTEMPT] == "1"
