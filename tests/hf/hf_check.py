"""Train tiny Hugging Face models on JSON Lines data under many layouts in one torchrun launch.

Usage (under torchrun): hf_check.py JOB.json OUT.json. JOB.json names the model folders
({kind: folder}), the data files, the export root, the steps and the layouts of this world size;
every (kind, layout) is trained with validation and export, and rank 0 writes {"kind/layout":
{"losses", "eval", "export"}} to OUT.json. Launched by test_hf_layouts.py; not a test module.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from meshrun_trainer.config import from_env
from meshrun_trainer.mesh import build_mesh, init_distributed, pick_device
from meshrun_trainer.optim import LRSchedule, OptimizerSettings
from meshrun_trainer.train import train
from meshrun_trainer.userrun import UserRun, with_model

from meshrun.hf import load_hf_model
from meshrun.userdata import DataSpec

SEQ_LEN = 32
BASE = {
    "MESHRUN_GLOBAL_BATCH_SIZE": "8",
    "MESHRUN_LEARNING_RATE": "0.003",
    "MESHRUN_SEED": "1",
    "MESHRUN_PRECISION": "fp32",
    "MESHRUN_MAX_GRAD_NORM": "1.0",
    "MESHRUN_DATASET": "synthetic",
    "MESHRUN_CHECKPOINT_EVERY": "0",
    "MESHRUN_CHECKPOINT_KEEP": "1",
    "MESHRUN_PIPELINE_SCHEDULE": "1f1b",
    "MESHRUN_VIRTUAL_STAGES": "1",
    "MESHRUN_ZERO_STAGE": "0",
    "MESHRUN_GRAD_ACCUMULATION": "1",
    "MESHRUN_MICRO_BATCHES": "1",
    "MESHRUN_ATTEMPT": "0",
    "MESHRUN_METRICS_PORT": "0",
    "MESHRUN_JOB_NAME": "hf-check",
    "MESHRUN_NAMESPACE": "local",
    "MESHRUN_TERMINATION_LOG": "/dev/null",
    "MESHRUN_CHECKPOINT_DIR": "",
}


def layout_env(dp: int = 1, pp: int = 1, tp: int = 1, **extra: str) -> dict[str, str]:
    env = {"MESHRUN_DP": str(dp), "MESHRUN_PP": str(pp), "MESHRUN_TP": str(tp)}
    env["MESHRUN_STAGE_LAYERS"] = "0-1,2-3" if pp == 2 else "0-3"  # the 4 layers of the models
    env |= {f"MESHRUN_{k.upper()}": v for k, v in extra.items()}
    split = (
        dp
        * int(env.get("MESHRUN_MICRO_BATCHES", "1"))
        * int(env.get("MESHRUN_GRAD_ACCUMULATION", "1"))
    )
    env["MESHRUN_MICRO_BATCH_SIZE"] = str(int(BASE["MESHRUN_GLOBAL_BATCH_SIZE"]) // split)
    return env


LAYOUTS: dict[str, dict[str, str]] = {
    "single": layout_env(),
    "ddp2": layout_env(dp=2),
    "zero3-dp2": layout_env(dp=2, zero_stage="3"),
    "tp2": layout_env(tp=2),
    "pp2": layout_env(pp=2, micro_batches="2", grad_accumulation="2"),
    "3d": layout_env(dp=2, pp=2, tp=2, micro_batches="2", zero_stage="3"),
}
"""Layouts by name; the pipelines use 2 micro-batches and accumulate 2 calls per step."""


def model_env(folder: str, steps: int) -> dict[str, str]:
    shape = load_hf_model(folder, SEQ_LEN).shape
    return {
        "MESHRUN_MODEL_PRESET": "custom",
        "MESHRUN_MODEL_LAYERS": str(shape.layers),
        "MESHRUN_MODEL_HIDDEN": str(shape.hidden),
        "MESHRUN_MODEL_HEADS": str(shape.heads),
        "MESHRUN_MODEL_KV_HEADS": str(shape.kv_heads),
        "MESHRUN_MODEL_VOCAB": str(shape.vocab),
        "MESHRUN_MODEL_SEQ_LEN": str(SEQ_LEN),
        "MESHRUN_MODEL_FFN_HIDDEN": str(shape.ffn_hidden),
        "MESHRUN_STEPS": str(steps),
    }


def user_run(job: dict[str, Any], folder: str, export: Path) -> UserRun:
    return UserRun(
        hf=load_hf_model(folder, SEQ_LEN),
        data=DataSpec(
            format="jsonl",
            path=job["train"],
            validation=job["validation"],
            eval_every=job["evalEvery"],
        ),
        export=export,
        optimizer=OptimizerSettings(learning_rate=float(BASE["MESHRUN_LEARNING_RATE"])),
        lr_schedule=LRSchedule(decay="cosine", warmup_steps=2, min_ratio=0.1),
    )


def main(job_file: str, out: str) -> None:
    job = json.loads(Path(job_file).read_text())
    device = pick_device()
    init_distributed(device)
    world = dist.get_world_size()
    results: dict[str, Any] = {}
    for kind, folder in job["models"].items():
        for name in job["layouts"]:
            env = {**BASE, **model_env(folder, job["steps"]), **LAYOUTS[name]}
            cfg = from_env({**env, "WORLD_SIZE": str(world)})
            export = Path(job["exportRoot"]) / f"{kind}-{name}"
            run = user_run(job, folder, export)
            result = train(with_model(cfg, run), build_mesh(cfg.layout, device), run=run)
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
