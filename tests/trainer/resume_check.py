"""Save under one layout, resume under another: one launch per phase.

Usage (under torchrun): resume_check.py PHASE WORKDIR
- ``save`` (2 ranks): train each layout of SAVED[2] for HALF steps, checkpointing at the end,
  into WORKDIR/<name>; rank 0 writes the single-process reference of STEPS steps.
- ``resume`` (4 ranks): save each layout of SAVED[4] likewise, then resume each pair of
  PAIRS from a copy of its checkpoint under another layout up to STEPS (more ranks: the
  2-rank checkpoints; the same ranks: another dp/tp/pp/ZeRO stage); rank 0 also resumes a
  4-rank checkpoint in a single process (fewer ranks). Results go to WORKDIR/resumed.json:
  {pair: {"resumedFrom", "losses"}}.
Launched by test_resume_layouts.py; not a test module itself.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from layout_check import MODEL, TRAINING
from meshrun_trainer.components import statedicts
from meshrun_trainer.components.data.synthetic import make_stream
from meshrun_trainer.components.optim import clip_grad_norm, make_optimizer
from meshrun_trainer.config.read import read_job
from meshrun_trainer.distributed.mesh import build_mesh, init_distributed, pick_device
from meshrun_trainer.local.env import layout_env
from meshrun_trainer.loop.train import train
from meshrun_trainer.models.llama import build_model
from meshrun_trainer.models.loss import cross_entropy
from meshrun_trainer.runner import Runner

from meshrun.api.presets import PRESETS, ModelShape
from meshrun.jobdoc import JobDocument

STEPS, HALF = 6, 3
PIPELINE = {"schedule": "1f1b", "micro_batches": 2}
SAVED: dict[int, dict[str, dict[str, Any]]] = {
    2: {"ddp2": {"dp": 2}, "tp2": {"tp": 2}, "pp2": {"pp": 2, **PIPELINE}},
    4: {
        "zero1-dp4": {"dp": 4, "zero_stage": 1},
        "zero3-dp4": {"dp": 4, "zero_stage": 3},
        "pp2-dp2-zero2": {"pp": 2, "dp": 2, "zero_stage": 2, **PIPELINE},
    },
}
TARGETS: dict[str, dict[str, Any]] = {
    "zero3-dp4": {"dp": 4, "zero_stage": 3},
    "zero1-dp4": {"dp": 4, "zero_stage": 1},
    "dp2-tp2": {"dp": 2, "tp": 2},
    "pp2-tp2": {"pp": 2, "tp": 2, **PIPELINE},
    "ddp4": {"dp": 4},
    "pp2-dp2-interleaved": {
        "pp": 2,
        "dp": 2,
        "schedule": "interleaved-1f1b",
        "micro_batches": 2,
        "virtual_stages": 2,
    },
}
PAIRS = [  # (saved, resumed under)
    ("ddp2", "zero3-dp4"),  # 2 ranks -> 4, ZeRO-0 -> ZeRO-3
    ("tp2", "pp2-dp2-interleaved"),  # TP -> PP (two chunks per rank) x DP
    ("pp2", "dp2-tp2"),  # PP -> DP x TP
    ("zero1-dp4", "pp2-tp2"),  # ZeroRedundancyOptimizer shards -> PP x TP
    ("zero3-dp4", "zero1-dp4"),  # FSDP2 shards -> ZeroRedundancyOptimizer
    ("pp2-dp2-zero2", "ddp4"),  # PP x FSDP2 -> DDP
]


def _job(layout: dict[str, Any], steps: int, directory: Path) -> JobDocument:
    env = layout_env(MODEL, {**TRAINING, "steps": steps}, checkpoint_dir=str(directory), **layout)
    env |= {"WORLD_SIZE": str(dist.get_world_size())}
    return read_job(env)


def _train(layout: dict[str, Any], steps: int, directory: Path) -> dict[str, Any]:
    job = _job(layout, steps, directory)
    result = train(job, build_mesh(job.plan.layout, pick_device()))
    dist.barrier()
    return {"resumedFrom": result.resumed_from, "losses": [r.loss for r in result.records]}


def _single_process(
    directory: Path | None, first: int, last: int, shape: ModelShape = PRESETS["tiny"]
) -> list[float]:
    """Steps first..last of the plain model on the whole batch, from ``directory``'s
    checkpoint of step first - 1 (loaded without a process group) or from scratch."""
    model = build_model(shape, int(TRAINING["seed"]))
    optimizer = make_optimizer(model.parameters(), float(TRAINING["learningRate"]))
    if directory is not None:
        runner = Runner([model], [optimizer], None, True, True)
        states = statedicts.part_states(runner)
        loaded = statedicts.merged(states)
        statedicts.load(loaded, str(directory / f"step-{first - 1:08d}"), no_dist=True)
        statedicts.apply(runner, states, loaded)
    stream = make_stream("synthetic", shape.vocab, shape.seq_len, 8, int(TRAINING["seed"]))
    losses = []
    for step in range(first, last + 1):
        inputs, targets = stream.global_batch(step)
        loss = cross_entropy(model(inputs), targets)
        loss.backward()
        clip_grad_norm(list(model.parameters()), float(TRAINING["maxGradNorm"]))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def main(phase: str, workdir: Path) -> None:
    init_distributed(pick_device())
    world, rank = dist.get_world_size(), dist.get_rank()
    for name, layout in SAVED[world].items():
        _train(layout, HALF, workdir / name)
    if phase == "save":
        if rank == 0:
            reference = _single_process(None, 1, STEPS)
            (workdir / "reference.json").write_text(json.dumps(reference))
        dist.destroy_process_group()
        return
    results: dict[str, Any] = {}
    for saved, target in PAIRS:
        copy = workdir / f"{saved}-to-{target}"
        if rank == 0:
            shutil.copytree(workdir / saved, copy)
        dist.barrier()
        results[f"{saved}->{target}"] = _train(TARGETS[target], STEPS, copy)
    if rank == 0:
        losses = _single_process(workdir / "zero3-dp4", HALF + 1, STEPS)
        results["zero3-dp4->single-process"] = {"resumedFrom": HALF, "losses": losses}
        (workdir / "resumed.json").write_text(json.dumps(results, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(sys.argv[1], Path(sys.argv[2]))
