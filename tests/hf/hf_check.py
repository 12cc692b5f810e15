"""Train tiny Hugging Face models on JSON Lines data under many layouts in one launch.

Usage (under torchrun): hf_check.py JOB.json OUT.json. JOB.json names the model folders
({kind: folder}), the data files, the export root, the steps and the layouts of this world size;
every (kind, layout) is a job with spec.model.hf, spec.training.data, lrSchedule and export,
planned and turned into the trainer's environment like any other (localenv.layout_env), trained
with validation and export, and rank 0 writes {"kind/layout": {"losses", "eval", "export"}} to
OUT.json. Launched by test_hf_layouts.py; not a test module.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from meshrun_trainer.config.files import open_files, with_model
from meshrun_trainer.config.read import read_job
from meshrun_trainer.distributed.mesh import build_mesh, init_distributed, pick_device
from meshrun_trainer.local.env import layout_env
from meshrun_trainer.loop.train import train

SEQ_LEN = 32
LAYOUTS: dict[str, dict[str, Any]] = {
    "single": {},
    "ddp2": {"dp": 2},
    "zero2-dp2": {"dp": 2, "zero_stage": 2},
    "zero3-dp2": {"dp": 2, "zero_stage": 3},
    "tp2": {"tp": 2},
    "cp2": {"cp": 2},  # each sequence split over 2 ranks (context parallelism)
    "pp2-cp2": {"pp": 2, "cp": 2, "micro_batches": 2, "grad_accumulation": 2},
    "pp2": {"pp": 2, "micro_batches": 2, "grad_accumulation": 2},
    "3d": {"dp": 2, "pp": 2, "tp": 2, "micro_batches": 2, "zero_stage": 3},
}
"""Layouts by name; the pipelines use 2 micro-batches (pp2 accumulates 2 calls per step)."""


def spec_parts(
    folder: str, job: dict[str, Any], export: Path | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """spec.model and spec.training of the fine-tuning job, as a user writes them."""
    model = {"hf": {"path": folder}, "seqLen": SEQ_LEN}
    training = {
        "steps": job["steps"],
        "globalBatchSize": 8,
        "learningRate": 0.003,
        "seed": 1,
        "precision": "fp32",
        "data": {
            "format": "jsonl",
            "path": job["train"],
            "validation": {"path": job["validation"]},
            "evalEverySteps": job["evalEvery"],
        },
        "lrSchedule": {"warmupSteps": 2, "decay": "cosine", "minRatio": 0.1},
    }
    if export is not None:
        training["export"] = {"path": str(export)}
    return model, training


def main(job_file: str, out: str) -> None:
    job = json.loads(Path(job_file).read_text())
    device = pick_device()
    init_distributed(device)
    world = dist.get_world_size()
    results: dict[str, Any] = {}
    for kind, folder in job["models"].items():
        for name in job["layouts"]:
            export = Path(job["exportRoot"]) / f"{kind}-{name}"
            env = layout_env(*spec_parts(folder, job, export), **LAYOUTS[name], name="hf-check")
            trained = read_job({**env, "WORLD_SIZE": str(world)})
            hf = open_files(trained)
            mesh = build_mesh(trained.plan.layout, device)
            result = train(with_model(trained, hf), mesh, hf=hf)
            results[f"{kind}/{name}"] = {
                "losses": [r.loss for r in result.records],
                "eval": result.evals,
                "export": str(export),
            }
            dist.barrier()
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps(results, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(sys.argv[1], sys.argv[2])
