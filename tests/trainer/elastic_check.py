"""An elastic job shrunk and grown from its checkpoints: one launch per phase.

Usage (under torchrun): elastic_check.py PHASE WORKDIR
- ``start`` (4 ranks): for each job of JOBS, the uninterrupted run at its planned degree (the
  reference), then the elastic run at that degree, preempted after step SHRINK_AT + 1 (its
  checkpoint of SHRINK_AT written, the step after it lost);
- ``shrink`` (2 ranks): each elastic run resumed at half the planned data-parallel degree
  (meshrun.planner.elastic.resized: the same TP/PP, the same global batch, twice the gradient
  accumulation), preempted after step GROW_AT + 1;
- ``grow`` (4 ranks): each resumed at the planned degree again, to the end.
Every run's environment is the operator's contract (``pod_env``) for the (resized) plan. Each
phase writes WORKDIR/<phase>.json: {job: {"reference"?, "resumedFrom", "steps", "losses",
"layout", "gradAccumulation"}}. Launched by test_elastic_resume.py; not a test module itself.
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from meshrun_trainer.config.read import read_job
from meshrun_trainer.distributed.mesh import build_mesh, init_distributed, pick_device
from meshrun_trainer.local.env import one_pod_env
from meshrun_trainer.loop.train import train
from meshrun_trainer.runner import StepRecord

from meshrun.api.read import read_spec
from meshrun.planner.elastic import resized
from meshrun.planner.plan import plan_job

STEPS, EVERY, SHRINK_AT, GROW_AT = 8, 3, 3, 6
TRAINING = {
    "steps": STEPS,
    "globalBatchSize": 8,
    "microBatchSize": 1,
    "learningRate": 0.01,
    "seed": 11,
    "precision": "fp32",
    "dataset": "synthetic",
    "checkpoint": {"everySteps": EVERY},
    # a schedule that changes every step: a resumed run on the wrong step shows at once
    "lrSchedule": {"warmupSteps": 2, "decay": "cosine", "minRatio": 0.1},
}
JOBS: dict[str, dict[str, Any]] = {
    "ddp": {"strategy": {"type": "ddp"}},
    "zero1": {"strategy": {"type": "zero", "zeroStage": 1}},  # optimizer shards change owners
    "zero3": {"strategy": {"type": "zero", "zeroStage": 3}},
    "dp2-tp2": {
        "strategy": {"type": "hybrid", "dataParallel": 2, "tensorParallel": 2},
        "resources": {"numNodes": 2, "numProcPerNode": 2, "accelerator": "cpu"},
    },
    "pp2-dp2": {
        "strategy": {
            "type": "hybrid",
            "dataParallel": 2,
            "pipelineParallel": 2,
            "tensorParallel": 1,
            "pipelineSchedule": "1f1b",
            "microBatches": 2,
        },
        "training": {"microBatchSize": 2},
    },
}


PODS = {"numNodes": 4, "numProcPerNode": 1, "accelerator": "cpu"}
"""Four one-process pods: half the data-parallel degree is half the pods."""


class Preempted(Exception):
    """Raised on every rank at the same step: the job loses its pods there."""


def _spec(name: str) -> dict[str, Any]:
    job = JOBS[name]
    return {
        "image": "local",
        "resources": job.get(
            "resources", {"numNodes": 4, "numProcPerNode": 1, "accelerator": "cpu"}
        ),
        "strategy": job["strategy"],
        "model": {"preset": "tiny"},
        "training": {**TRAINING, **job.get("training", {})},
        "elastic": {"minDataParallel": 1},
    }


def _run(name: str, shrink: bool, directory: Path, stop_after: int | None) -> dict[str, Any]:
    job = read_spec(_spec(name))
    plan = plan_job(job, name)
    if shrink:
        job, plan = resized(job, plan, plan.layout.dp // 2)
    assert plan.world_size == dist.get_world_size(), (name, plan.world_size)
    env = one_pod_env(plan, job, str(directory))
    trained = read_job(env)
    records: list[StepRecord] = []

    def on_step(record: StepRecord) -> None:
        records.append(record)
        if stop_after is not None and record.step == stop_after:
            raise Preempted

    mesh = build_mesh(trained.plan.layout, pick_device())
    with contextlib.suppress(Preempted):
        train(trained, mesh, on_step=on_step)
    dist.barrier()
    return {
        "resumedFrom": records[0].step - 1,
        "steps": [r.step for r in records],
        "losses": [r.loss for r in records],
        "layout": plan.layout.text(),
        "gradAccumulation": plan.layout.grad_accumulation,
    }


def main(phase: str, workdir: Path) -> None:
    init_distributed(pick_device())
    results: dict[str, Any] = {}
    for name in JOBS:
        directory = workdir / name
        if phase == "start":
            reference = _run(name, False, workdir / f"{name}-reference", None)
            results[name] = {"reference": reference, **_run(name, False, directory, SHRINK_AT + 1)}
        elif phase == "shrink":
            results[name] = _run(name, True, directory, GROW_AT + 1)
        else:
            results[name] = _run(name, False, directory, None)
    if dist.get_rank() == 0:
        (workdir / f"{phase}.json").write_text(json.dumps(results, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(sys.argv[1], Path(sys.argv[2]))
