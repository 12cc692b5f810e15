"""Helpers of the real-node end-to-end tests: images, the chart, a checkpoint volume, the job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from realnode_support import ROOT, Kubectl
from references import LocalReference
from scheduling import shared_setup

OPERATOR_IMAGE = "meshrun/operator:0.1.0"
TRAINER_IMAGE = "meshrun/trainer:0.1.0"
DEMO_JOB = ROOT / "examples" / "demo-3d-cpu.yaml"


def build_images() -> None:
    """The Dockerfile's operator and trainer targets, imported into the node (cached by Docker)."""
    for target, tag in (("operator", OPERATOR_IMAGE), ("trainer", TRAINER_IMAGE)):
        with shared_setup("images"):
            proc = subprocess.run(
                [str(ROOT / "hack" / "realnode" / "images.sh"), "build", target, tag],
                capture_output=True,
                text=True,
                timeout=2400,
            )
        assert proc.returncode == 0, f"building {tag} failed:\n{proc.stdout}\n{proc.stderr}"


def helm_install(kubeconfig: str, namespace: str) -> list[str]:
    """The chart, serving only ``namespace``, with the operator pod on the real node; returns
    the `helm uninstall` command. The release is named after the namespace: the chart's
    cluster-scoped objects (a ClusterRole for nodes) carry the release name."""
    release = f"mr-{namespace[-6:]}"
    helm = [str(ROOT / ".cluster" / "bin" / "helm"), "--kubeconfig", kubeconfig, "-n", namespace]
    cmd = [*helm, "upgrade", "--install", release, str(ROOT / "helm" / "meshrun")]
    cmd += ["--wait", "--timeout", "180s"]
    cmd += ["-f", str(ROOT / "hack" / "realnode" / "operator-values.yaml")]
    cmd += ["--set", f"watchNamespaces={{{namespace}}}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, f"helm install failed:\n{proc.stdout}\n{proc.stderr}"
    return [*helm, "uninstall", release, "--wait=false"]


def apply_demo_job(kubectl: Kubectl, namespace: str, checkpoint_dir: Path) -> tuple[str, str]:
    """The demo job on the real node with its checkpoint PV and PVC (hack/realnode/demo_job.py,
    the same objects `make demo` applies); returns the job's and the PV's names."""
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(checkpoint_dir, 0o777)  # the trainer runs as uid 1000
    helper = ROOT / "hack" / "realnode" / "demo_job.py"
    proc = subprocess.run(
        [sys.executable, str(helper), namespace, str(checkpoint_dir)],
        capture_output=True,
        text=True,
        check=True,
    )
    kubectl("apply", "-f", "-", input=proc.stdout)
    pv, _, job = json.loads(proc.stdout)["items"]
    return job["metadata"]["name"], pv["metadata"]["name"]


def local_final_loss(tmp: Path) -> float:
    """``meshrun run examples/demo-3d-cpu.yaml --local``: the reference final loss (trained, or
    from the cache of references)."""
    job_file = tmp / "demo.yaml"
    job_file.write_bytes(DEMO_JOB.read_bytes())
    loss: float = LocalReference(job_file, timeout=600).summary()["finalLoss"]
    return loss
