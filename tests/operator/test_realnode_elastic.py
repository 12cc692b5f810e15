"""On the real node: an elastic job of real trainer pods loses a place, shrinks, and finishes from
its checkpoint with the losses of the uninterrupted run.

The node advertises an extended resource of this test alone (two slots, one per pod: the way
Kubernetes documents advertising a resource by patching a node's status). The job (2 pods x 1
CPU process, DDP dp2, checkpoints every 5 steps on a hostPath volume) trains; once a checkpoint
is written, the node keeps one slot and pod 1 is deleted. The gang restarts, its second pod
cannot be scheduled, and after shrinkAfterSeconds the job runs on one pod at dp1 (twice the
gradient accumulation), resumes from the checkpoint, and its ten steps after the resize have the
losses of ``meshrun run --local`` on the same job at dp2 (fp32, within RTOL).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hostvolumes import host_path_claim
from meshrun_operator import names
from operator_harness import FAST_FLAGS, Cluster, OperatorProcess, job_manifest
from references import LocalReference
from waiting import wait_for

from meshrun.jobdoc import JOB_VARIABLE, read_document

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.slow,
    pytest.mark.timeout(1200),
]

REAL_NODE = "meshrun.dev/real-node"
STEPS, EVERY = 400, 5
"""The pod goes once a checkpoint of step 10 or later is complete; a tiny-model step takes about
35 ms, so 400 steps leave the deletion time to reach the gang before it finishes at dp2."""
RTOL = 1e-3
"""The ten losses after the resize: each step agrees within 1e-4 right after a resize
(tests/trainer/test_elastic_resume.py), and float32 summation-order differences compound over
the steps after it (measured: 1.4e-4 relative 20 steps after it)."""
ROOT = Path(__file__).resolve().parents[2]


def _patch_slots(cluster: Cluster, node: str, resource: str, count: int | None) -> None:
    """Advertise ``count`` of ``resource`` on the node (None: remove it)."""
    key = resource.replace("~", "~0").replace("/", "~1")
    ops = []
    for field in ("capacity", "allocatable"):
        path = f"/status/{field}/{key}"
        ops.append({"op": "remove", "path": path} if count is None else
                   {"op": "add", "path": path, "value": str(count)})  # fmt: skip
    cluster.kubectl(
        "patch", "node", node, "--subresource=status", "--type=json", "-p", json.dumps(ops),
        check=count is not None,
    )  # fmt: skip


def _free_slots(cluster: Cluster, node: str, resource: str) -> str:
    out = cluster.kubectl("get", "node", node, "-o", "json").stdout
    return str(json.loads(out)["status"].get("allocatable", {}).get(resource, ""))


@pytest.fixture
def slots(cluster: Cluster, real_node: str, namespace: str) -> Iterator[str]:
    """An extended resource of this test with 2 slots on the real node; removed afterwards."""
    resource = f"meshrun.dev/elastic-{namespace[-6:]}"
    _patch_slots(cluster, real_node, resource, 2)
    wait_for(lambda: _free_slots(cluster, real_node, resource) == "2", 30, f"{resource} = 2")
    yield resource
    _patch_slots(cluster, real_node, resource, None)


@pytest.fixture
def volume(cluster: Cluster, namespace: str) -> Iterator[tuple[str, Path]]:
    """A checkpoint claim on a hostPath directory of the real node; (claim, directory)."""
    checkpoints = Path("/var/lib/meshrun-checkpoints") / namespace
    checkpoints.mkdir(parents=True, exist_ok=True)
    os.chmod(checkpoints, 0o777)  # the trainer runs as uid 1000
    claim, pv = "elastic-checkpoints", f"elastic-ckpt-{namespace[-6:]}"
    for item in host_path_claim(namespace, claim, pv, str(checkpoints)):
        cluster.apply(item)
    yield claim, checkpoints
    cluster.kubectl("delete", "pv", pv, "--wait=false", check=False)
    shutil.rmtree(checkpoints, ignore_errors=True)


def _job(name: str, image: str, resource: str, claim: str) -> dict[str, Any]:
    slot = {resource: "1"}
    return job_manifest(
        name,
        image=image,
        resources={"numNodes": 2, "numProcPerNode": 1, "accelerator": "cpu"},
        strategy={"type": "ddp"},
        training={
            "steps": STEPS,
            "globalBatchSize": 8,
            "microBatchSize": 1,
            "precision": "fp32",
            "dataset": "synthetic",
            "learningRate": 0.01,
            "checkpoint": {"everySteps": EVERY, "volume": claim},
        },
        elastic={"minDataParallel": 1, "shrinkAfterSeconds": 5, "growAfterSeconds": 3600},
        podTemplate={
            "spec": {
                "nodeSelector": {REAL_NODE: "true"},
                "tolerations": [
                    {"key": REAL_NODE, "operator": "Equal", "value": "true", "effect": "NoSchedule"}
                ],
                "terminationGracePeriodSeconds": 1,
                "containers": [
                    {
                        "name": "trainer",
                        "imagePullPolicy": "Never",
                        "resources": {"requests": slot, "limits": slot},
                    }
                ],
            }
        },
    )


def _checkpointed_from(checkpoints: Path, step: int) -> bool:
    """Whether a complete checkpoint of ``step`` or later is on the volume."""
    return any(
        int(folder.name.removeprefix("step-")) >= step and (folder / ".metadata").is_file()
        for folder in checkpoints.glob("step-[0-9]*")
    )


def _local_losses(job: dict[str, Any], tmp: Path) -> list[float]:
    """``meshrun run --local`` of the same job without the cluster's parts: the reference."""
    spec = json.loads(json.dumps(job["spec"]))
    spec.pop("podTemplate")
    spec.pop("elastic")
    spec["image"] = "local"
    del spec["training"]["checkpoint"]["volume"]
    path = tmp / "reference.yaml"
    path.write_text(yaml.safe_dump({**job, "spec": spec}))
    losses: list[float] = LocalReference(path, timeout=600).summary()["losses"]
    return losses


def test_real_trainer_pods_shrink_and_finish_with_the_uninterrupted_loss(
    cluster: Cluster,
    real_node: str,
    trainer_image: str,
    slots: str,
    volume: tuple[str, Path],
    kubeconfig: str,
    namespace: str,
    tmp_path: Path,
) -> None:
    claim, checkpoints = volume
    job = _job("elastic", trainer_image, slots, claim)
    flags = [f for f in FAST_FLAGS if f != "--no-progress-http"]
    operator = OperatorProcess(kubeconfig, namespace, tmp_path, flags=flags).start()
    try:
        cluster.apply(job)
        # A complete checkpoint on the volume (written by both ranks, renamed by rank 0).
        # Any complete one from step 10 on: two are kept, so a given step's lasts only until
        # the save after next.
        wait_for(
            lambda: _checkpointed_from(checkpoints, 2 * EVERY),
            600,
            "a checkpoint of step 10 or later",
            interval=1,
            describe=lambda: (cluster.status("elastic"), sorted(os.listdir(checkpoints))),
        )
        assert cluster.status("elastic")["dataParallel"] == 2
        # The node keeps one place; pod 1 goes.
        _patch_slots(cluster, real_node, slots, 1)
        wait_for(lambda: _free_slots(cluster, real_node, slots) == "1", 30, f"{slots} = 1")
        cluster.kubectl(
            "delete", "pod", "elastic-1", "-n", namespace, "--grace-period=0", "--wait=false"
        )

        def finished() -> dict[str, Any] | None:
            status = cluster.status("elastic")
            assert status.get("phase") != "Failed", status
            return status if status.get("phase") == "Succeeded" else None

        status = wait_for(finished, 600, "the job to succeed", interval=2, describe=lambda: (
            {k: v for k, v in cluster.status("elastic").items() if k != "plan"},
            cluster.kubectl("get", "pods", "-n", namespace, "-o", "wide").stdout,
        ))  # fmt: skip
    finally:
        operator.stop()
    shrink = status["resizes"][-1]
    assert (shrink["fromDataParallel"], shrink["toDataParallel"], shrink["reason"]) == (
        2,
        1,
        "Shrink",
    )
    assert status["dataParallel"] == 1 and status["layout"] == "dp1 x pp1 x tp1"
    assert status["disruptions"] >= 1
    last = [
        p
        for p in cluster.pods("elastic")
        if p["metadata"]["labels"][names.LABEL_ATTEMPT] == str(status["attempt"])
    ]
    assert [p["metadata"]["name"] for p in last] == ["elastic-0"], "one pod at dp1"
    env = {e["name"]: e.get("value") for e in last[0]["spec"]["containers"][0]["env"]}
    accumulation = read_document(env[JOB_VARIABLE]).plan.layout.grad_accumulation
    assert (env["MESHRUN_DP"], accumulation) == ("1", 8)
    terminated = last[0]["status"]["containerStatuses"][0]["state"]["terminated"]
    summary = json.loads(terminated["message"])
    assert summary["resumedFromStep"] >= 2 * EVERY, summary
    # The steps right after the resize: float32 summation-order differences compound over
    # hundreds of steps (0.7% by step 400), not over the first ten.
    logged = cluster.kubectl("logs", "elastic-0", "-n", namespace).stdout
    events = [json.loads(line) for line in logged.splitlines() if line.startswith("{")]
    got = {e["step"]: e["loss"] for e in events if e.get("event") == "step"}
    resumed = summary["resumedFromStep"]
    after = range(resumed + 1, resumed + 11)
    assert all(step in got for step in after), sorted(got)[:20]
    want = _local_losses(job, tmp_path)
    wrong = {
        s: (got[s], want[s - 1]) for s in after if abs(got[s] - want[s - 1]) > RTOL * want[s - 1]
    }
    assert not wrong, wrong
