"""A rank's whole-run peak resident memory, checkpoint save included, held to the planner's
estimate: real ``meshrun run --local`` jobs on 2 CPU ranks, measured, not timed.

What the model adds is the peak of a run (every rank's ru_maxrss, in the run summary) less the
peak of the same layout with a model of width 64, against the planner's estimate for the job
less its estimate for the narrow one. A trainer that let malloc keep what training frees
(ZeRO-3 came to 1.47 times its working set on this model) or that kept a second copy of DDP's
gradients beside its buckets (1.25 times) would fail.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from trainer_launch import REPO, cpu_env

from meshrun.planner.plan import plan_job

pytestmark = [pytest.mark.trainer, pytest.mark.slow]

MODEL = {"layers": 4, "hidden": 1024, "heads": 8, "vocab": 4096, "seqLen": 64}
NARROW = {**MODEL, "hidden": 64, "vocab": 256, "ffnHidden": 256}
TOLERANCE = 0.15


def job(strategy: dict[str, Any], model: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "meshrun.dev/v1alpha1",
        "kind": "ParallelTrainingJob",
        "metadata": {"name": "memory"},
        "spec": {
            "image": "meshrun/trainer:test",
            "resources": {"numNodes": 1, "numProcPerNode": 2, "accelerator": "cpu"},
            "strategy": strategy,
            "model": model,
            "training": {
                "steps": 3,
                "globalBatchSize": 4,
                "precision": "fp32",
                "dataset": "synthetic",
            },
        },
    }


def run_peaks(spec: dict[str, Any], workdir: Path) -> list[int]:
    """Each rank's peak resident bytes over a 3-step run that ends with a checkpoint save."""
    workdir.mkdir()
    path, summary = workdir / "job.yaml", workdir / "summary.json"
    path.write_text(yaml.safe_dump(spec))
    cmd = [sys.executable, "-m", "meshrun", "run", str(path), "--local", "--quiet"]
    cmd += ["--summary-json", str(summary), "--checkpoint-dir", str(workdir / "checkpoints")]
    proc = subprocess.run(
        cmd, cwd=REPO, env=cpu_env(), capture_output=True, text=True, timeout=600, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (workdir / "checkpoints" / "step-00000003" / ".metadata").is_file()
    peaks: list[int] = json.loads(summary.read_text())["peakMemoryBytes"]
    return peaks


@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    "strategy", [{"type": "zero", "zeroStage": 3}, {"type": "ddp"}], ids=["zero3", "ddp"]
)
def test_peak_per_rank_is_the_estimate(strategy: dict[str, Any], tmp_path: Path) -> None:
    big, narrow = job(strategy, MODEL), job(strategy, NARROW)
    estimate = plan_job(big["spec"]).memory.total - plan_job(narrow["spec"]).memory.total
    measured = [
        b - s
        for b, s in zip(
            run_peaks(big, tmp_path / "model"), run_peaks(narrow, tmp_path / "narrow"), strict=True
        )
    ]
    for rank, value in enumerate(measured):
        ratio = value / estimate
        assert abs(ratio - 1) <= TOLERANCE, (
            f"rank {rank}: {value / 2**20:.0f} MiB above the narrow run, estimate "
            f"{estimate / 2**20:.0f} MiB (ratio {ratio:.2f})"
        )
