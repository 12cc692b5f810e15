"""Tiny Mixtral and Qwen2-MoE folders under expert parallelism 1, 2 and 4 in one launch.

Usage (under torchrun, 4 processes): hf_moe_check.py JOB.json OUT.json. For each folder of
JOB.json's {kind: folder} and each ep, a 4-process data-parallel job with spec.model.hf reads
the folder's weights, computes the logits of JOB.json's token ids before any step (every rank
the same rows; rank 0 saves them), trains a few steps and exports a folder. Rank 0 writes
{"kind/epN": {"logits": file, "losses", "export"}}. Launched by test_hf_moe.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from meshrun_trainer.components.weights import weight_source
from meshrun_trainer.config.files import open_files, with_model
from meshrun_trainer.config.read import read_job
from meshrun_trainer.distributed.mesh import build_mesh, init_distributed, pick_device
from meshrun_trainer.local.env import layout_env
from meshrun_trainer.loop.train import build_runner, train

SEQ_LEN = 32
EPS = (1, 2, 4)


def main(job_file: str, out: str) -> None:
    job = json.loads(Path(job_file).read_text())
    device = pick_device()
    init_distributed(device)
    world = dist.get_world_size()
    ids = torch.tensor(job["ids"])
    results: dict[str, Any] = {}
    for kind, folder in job["models"].items():
        for ep in EPS:
            name = f"{kind}/ep{ep}"
            export = Path(job["exportRoot"]) / f"{kind}-ep{ep}"
            model = {"hf": {"path": folder}, "seqLen": SEQ_LEN}
            training = {
                "steps": job["steps"],
                "globalBatchSize": 8,
                "learningRate": 0.003,
                "seed": 1,
                "precision": "fp32",
                "dataset": "synthetic",
                "export": {"path": str(export)},
            }
            env = layout_env(model, training, dp=world, ep=ep, name="hf-moe")
            trained = read_job({**env, "WORLD_SIZE": str(world)})
            hf = open_files(trained)
            trained = with_model(trained, hf)
            mesh = build_mesh(trained.plan.layout, device)
            runner = build_runner(trained, mesh, source=weight_source(hf, trained.plan.model))
            with torch.no_grad():
                logits = runner.parts[0](ids)
            logits_file = Path(job["exportRoot"]) / f"{kind}-ep{ep}.pt"
            if dist.get_rank() == 0:
                torch.save(logits, logits_file)
            del runner
            result = train(trained, mesh, hf=hf)
            results[name] = {
                "logits": str(logits_file),
                "losses": [r.loss for r in result.records],
                "export": str(export),
            }
            dist.barrier()
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps(results, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(sys.argv[1], sys.argv[2])
