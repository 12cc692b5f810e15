"""True end to end on the real node: the chart's operator, running in the
cluster as a pod, trains examples/demo-3d-cpu.yaml (2 pods x 4 CPU processes, dp2 x pp2 x tp2)
with torchrun over gloo between pod IPs; one trainer pod is killed mid-run, the gang resumes
from its checkpoint, and the final loss equals `meshrun run --local` on the same file. (The
demo's uninterrupted run in pods is tests/realnode/test_examples.py's demo-3d-cpu case.)"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_support import apply_demo_job, build_images, helm_install, local_final_loss
from realnode_support import Kubectl
from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator
from waiting import wait_for

from meshrun.cli.main import main as meshrun_main

# Covers set-up too: cold, the images are built (the trainer's torch is ~5 GB) and imported.
pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(3600)]
STEPS = 20  # examples/demo-3d-cpu.yaml: 20 steps, a checkpoint every 5
CHECKPOINTS = Path("/var/lib/meshrun-checkpoints")
"""The host folder of each test's checkpoint volume (a hostPath PV on the real node)."""


@pytest.fixture(scope="module")
def local_loss(real_node: str, tmp_path_factory: pytest.TempPathFactory) -> float:
    """Images built and imported (once), and the reference loss of the local run."""
    build_images()
    loss: float = local_final_loss(tmp_path_factory.mktemp("local"))
    return loss


@pytest.fixture
def demo(kubectl: Kubectl, kubeconfig: str, namespace: str) -> Iterator[str]:
    """The chart installed in the test's namespace and the demo job applied; its name."""
    uninstall = helm_install(kubeconfig, namespace)
    checkpoint_dir = CHECKPOINTS / namespace
    name, pv = apply_demo_job(kubectl, namespace, checkpoint_dir)
    yield name
    subprocess.run(uninstall, capture_output=True, timeout=120)
    kubectl("delete", "pv", pv, "--wait=false", check=False)
    shutil.rmtree(checkpoint_dir, ignore_errors=True)


def job_status(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    out = kubectl("get", "paralleltrainingjob", name, "-n", namespace, "-o", "json").stdout
    status: dict[str, Any] = json.loads(out).get("status") or {}
    return status


def pods(kubectl: Kubectl, namespace: str, name: str) -> list[dict[str, Any]]:
    out = kubectl(
        "get", "pods", "-n", namespace, "-l", f"meshrun.dev/job-name={name}", "-o", "json"
    )
    items: list[dict[str, Any]] = json.loads(out.stdout)["items"]
    return items


def wait_phase(kubectl: Kubectl, namespace: str, name: str, phase: str) -> dict[str, Any]:
    def reached() -> dict[str, Any] | None:
        status = job_status(kubectl, namespace, name)
        assert status.get("phase") != "Failed", f"job failed: {status}"
        return status if status.get("phase") == phase else None

    return wait_for(
        reached,
        900,
        f"job {name} to reach {phase}",
        interval=2,
        describe=lambda: (
            job_status(kubectl, namespace, name),
            kubectl("get", "pods", "-n", namespace, "-o", "wide", check=False).stdout,
        ),
    )


def termination_summary(pod: dict[str, Any]) -> dict[str, Any]:
    state = pod["status"]["containerStatuses"][0]["state"]
    summary: dict[str, Any] = json.loads(state["terminated"]["message"])
    return summary


def test_demo_trains_on_the_real_node_and_a_killed_pod_resumes_to_the_local_final_loss(
    kubectl: Kubectl,
    kubeconfig: str,
    namespace: str,
    real_node: str,
    local_loss: float,
    demo: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One demo run checks both: the gang trains in containerd pods on the real node, and a
    trainer pod deleted after the step-5 checkpoint restarts the gang, which resumes from that
    checkpoint and still ends with the float32 loss of the uninterrupted local run (the same
    layout, seed and data on the same CPU kernels). On the way, `meshrun plot NAME` draws the
    running job from its pod 0's event files, and after the restart the event files on the
    checkpoint volume hold each step once (TensorBoard's own reader)."""

    def step() -> int:
        progress = job_status(kubectl, namespace, demo).get("progress") or {}
        return int(progress.get("step", 0))

    # After the checkpoint of step 5 and before the end.
    wait_for(lambda: step() >= 6, 600, f"job {demo} to pass step 6", interval=0.5)
    monkeypatch.setenv("KUBECONFIG", kubeconfig)
    picture = tmp_path / "demo.png"
    drawn = meshrun_main(["plot", demo, "-n", namespace, "-o", str(picture)])
    assert drawn == 0 and picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    kubectl("delete", "pod", f"{demo}-1", "-n", namespace, "--grace-period=0", "--wait=false")
    status = wait_phase(kubectl, namespace, demo, "Succeeded")

    assert status["restarts"] >= 1
    progress = status["progress"]
    assert progress["step"] == progress["totalSteps"] == STEPS
    assert progress["loss"] == pytest.approx(local_loss, rel=1e-6, abs=1e-6)
    trainer_pods = pods(kubectl, namespace, demo)
    assert len(trainer_pods) == 2
    for pod in trainer_pods:
        assert pod["spec"]["nodeName"] == real_node
        assert pod["status"]["phase"] == "Succeeded"
        assert pod["status"]["containerStatuses"][0]["containerID"].startswith("containerd://")
    assert {row["node"] for row in status["placement"]} == {real_node}
    first = [p for p in trainer_pods if p["metadata"]["name"] == f"{demo}-0"]
    summary = termination_summary(first[0])
    assert summary["resumedFromStep"] >= 5, summary

    folder = CHECKPOINTS / namespace / "tensorboard"
    assert len(list(folder.glob("events.out.tfevents.*"))) >= 2, "a file per attempt"
    reader = EventAccumulator(str(folder), size_guidance={SCALARS: 0})
    reader.Reload()
    losses = reader.Scalars("train/loss")
    assert [e.step for e in losses] == list(range(1, STEPS + 1)), "each step once"
    assert losses[-1].value == pytest.approx(progress["loss"], rel=1e-6)
