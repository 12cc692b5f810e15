"""Context parallelism against one process: losses, every rank's gradient shard, and resumes.

Usage (under torchrun): cp_check.py WORKDIR. Each layout of ``LAYOUTS[world]`` (the tiny model
with grouped-query attention, 2 KV heads for 4 query heads) first runs one forward and backward
of step 1's batch, and every rank compares the gradient it holds of each parameter (its shard,
its pipeline stage's parameters) with the single-process gradient; then it trains STEPS steps
and checkpoints into WORKDIR/<name>. On 4 ranks the checkpoints of ``RESUMES`` (the 2-rank ones
from WORKDIR, the 4-rank ones just written) resume under another cp up to RESUMED steps, and rank
0 resumes the cp 2 checkpoint in a single process (cp 1). Rank 0 writes WORKDIR/cp-<world>.json:
{"runs": {name: {"losses", "gradError"}}, "resumed": {pair: {"resumedFrom", "losses"}},
"reference": {"losses"}} with the single-process losses of RESUMED steps.
Launched by test_cp_parity.py; not a test module itself.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from layout_check import TRAINING
from meshrun_trainer.components.data.synthetic import make_stream
from meshrun_trainer.config.read import read_job
from meshrun_trainer.distributed.mesh import build_mesh, init_distributed, pick_device
from meshrun_trainer.local.env import layout_env
from meshrun_trainer.loop.train import build_runner, forward_backward, rank_rows, train
from meshrun_trainer.models.llama import build_model
from meshrun_trainer.models.loss import cross_entropy
from meshrun_trainer.models.materialize import canonical_name
from resume_check import _single_process
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from meshrun.jobdoc import JobDocument

STEPS, RESUMED = 3, 5
MODEL = {"preset": "tiny", "kvHeads": 2}
PIPELINE = {"pp": 2, "schedule": "1f1b", "micro_batches": 2}
LAYOUTS: dict[int, dict[str, dict[str, Any]]] = {
    2: {
        "cp2": {"cp": 2, "grad_accumulation": 2},  # DDP over the cp group, no_sync
        "cp2+selective": {"cp": 2, "checkpointing": "selective"},  # the gather recomputed
        "cp2-zero1": {"cp": 2, "zero_stage": 1},  # ZeroRedundancyOptimizer over the cp group
        "ddp2": {"dp": 2},  # cp 1: saved for a resume at cp 2
    },
    4: {
        "cp4": {"cp": 4},
        "dp2-cp2-zero3": {"dp": 2, "cp": 2, "zero_stage": 3},
        "cp2-tp2": {"cp": 2, "tp": 2},
        "pp2-cp2": {"cp": 2, **PIPELINE},
    },
}
RESUMES = [  # (saved, resumed under)
    ("cp2-zero1", "cp4"),  # ZeRO-1's owners over the cp group write the optimizer state
    ("ddp2", "dp2-cp2-zero3"),  # cp 1 -> cp 2
    ("cp4", "cp2-tp2"),  # cp 4 -> cp 2
]


def _job(layout: dict[str, Any], steps: int, directory: Path) -> JobDocument:
    layout = dict(layout)
    training = {**TRAINING, "steps": steps}
    training["activationCheckpointing"] = layout.pop("checkpointing", "none")
    env = layout_env(MODEL, training, checkpoint_dir=str(directory), **layout)
    return read_job({**env, "WORLD_SIZE": str(dist.get_world_size())})


def _batch(job: JobDocument) -> tuple[torch.Tensor, torch.Tensor]:
    """Step 1's global batch."""
    training, shape = job.spec.training, job.plan.model
    stream = make_stream("synthetic", shape.vocab, shape.seq_len, 8, training.seed)
    return stream.global_batch(1)


def _reference_gradients(job: JobDocument) -> dict[str, torch.Tensor]:
    training, shape = job.spec.training, job.plan.model
    model = build_model(shape, training.seed)
    inputs, targets = _batch(job)
    cross_entropy(model(inputs), targets).backward()
    return {name: p.grad for name, p in model.named_parameters() if p.grad is not None}


def _gradient_error(job: JobDocument, reference: dict[str, torch.Tensor]) -> float:
    """The largest gap, relative to the parameter's largest reference gradient, between a
    gradient this rank holds after step 1's backward and the same piece of the reference."""
    mesh = build_mesh(job.plan.layout, pick_device())
    runner = build_runner(job, mesh)
    inputs, targets = (rank_rows(t, job.plan.layout, mesh) for t in _batch(job))
    forward_backward(job.plan.layout, runner, inputs, targets)
    worst, seen = 0.0, 0
    for part in runner.parts:
        for name, param in part.named_parameters():
            grad, want = param.grad, reference[canonical_name(name)]
            assert grad is not None, name
            if isinstance(grad, DTensor):
                size, offset = compute_local_shape_and_global_offset(
                    want.shape, grad.device_mesh, grad.placements
                )
                want = want[tuple(slice(o, o + n) for o, n in zip(offset, size, strict=True))]
                grad = grad.to_local()
            assert grad.shape == want.shape, (name, grad.shape, want.shape)
            scale = reference[canonical_name(name)].abs().max().item()
            worst = max(worst, (grad - want).abs().max().item() / scale)
            seen += 1
    assert seen, "this rank holds no parameters"
    dist.barrier()
    return worst


def _train(layout: dict[str, Any], steps: int, directory: Path) -> dict[str, Any]:
    job = _job(layout, steps, directory)
    result = train(job, build_mesh(job.plan.layout, pick_device()))
    dist.barrier()
    return {"resumedFrom": result.resumed_from, "losses": [r.loss for r in result.records]}


def _max(value: float) -> float:
    tensor = torch.tensor(value)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return float(tensor)


def main(workdir: Path) -> None:
    init_distributed(pick_device())
    world, rank = dist.get_world_size(), dist.get_rank()
    out: dict[str, Any] = {"runs": {}, "resumed": {}}
    reference: dict[str, torch.Tensor] = {}
    for name, layout in LAYOUTS[world].items():
        job = _job(layout, STEPS, workdir / name)
        shape = job.plan.model
        reference = reference or _reference_gradients(job)
        error = _max(_gradient_error(job, reference))
        out["runs"][name] = {"gradError": error, **_train(layout, STEPS, workdir / name)}
    if world == 4:
        every = {**LAYOUTS[2], **LAYOUTS[4]}
        for saved, target in RESUMES:
            copy = workdir / f"{saved}-to-{target}"
            if rank == 0:
                shutil.copytree(workdir / saved, copy)
            dist.barrier()
            out["resumed"][f"{saved}->{target}"] = _train(every[target], RESUMED, copy)
    if rank == 0:
        out["reference"] = {"losses": _single_process(None, 1, RESUMED, shape)}
        if world == 4:
            losses = _single_process(workdir / "cp2", STEPS + 1, RESUMED, shape)
            out["resumed"]["cp2->single-process"] = {"resumedFrom": STEPS, "losses": losses}
        (workdir / f"cp-{world}.json").write_text(json.dumps(out, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(Path(sys.argv[1]))
