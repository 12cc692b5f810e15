"""Run many layouts in one launch and compare each with a single-process reference.

Usage (under torchrun): layout_check.py OUT.json  -- every layout of ``LAYOUTS[world_size]`` is
trained for a few steps on the tiny preset twice: in fp32 without activation checkpointing, and
in bf16 with activation checkpointing (selective and full in turn). Rank 0 also trains the plain
model on the whole global batch in each precision and writes {name: {"losses", "gradNorms",
"precision", "reference": {...}}} to OUT.json, one entry per run (see :func:`runs`).
Launched by test_layouts.py; not a test module itself.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from meshrun_trainer.components.data.synthetic import make_stream
from meshrun_trainer.components.optim import clip_grad_norm, make_optimizer
from meshrun_trainer.config.read import read_job
from meshrun_trainer.distributed.mesh import build_mesh, init_distributed, pick_device
from meshrun_trainer.local.env import layout_env
from meshrun_trainer.loop.train import train
from meshrun_trainer.models.llama import build_model
from meshrun_trainer.models.loss import cross_entropy

from meshrun.api import fsdpunits
from meshrun.jobdoc import JobDocument

STEPS = 3
MODEL = {"preset": "tiny"}
TRAINING = {
    "steps": STEPS,
    "globalBatchSize": 8,
    "learningRate": 0.01,
    "seed": 7,
    "precision": "fp32",
    "maxGradNorm": 1.0,
    "dataset": "synthetic",
}


def _pipeline(schedule: str, micro_batches: int = 4, **kw: Any) -> dict[str, Any]:
    virtual = 2 if schedule == "interleaved-1f1b" else 1
    return {"schedule": schedule, "micro_batches": micro_batches, "virtual_stages": virtual, **kw}


def _accumulating(schedule: str, **kw: Any) -> dict[str, Any]:
    """A pipeline that calls the schedule twice per optimizer step (2 micro-batches each)."""
    return _pipeline(schedule, micro_batches=2, grad_accumulation=2, **kw)


SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b")
BY_MATRIX = "by_matrix"


@contextmanager
def blocks_split(split: bool = True) -> Iterator[None]:
    """ZeRO-3 splits every block matrix by matrix while inside (the tiny preset's blocks are
    far below the size that splits them, so the bar is lowered to 0)."""
    saved = fsdpunits.MATRIX_UNIT_PARAMETERS
    fsdpunits.MATRIX_UNIT_PARAMETERS = 0 if split else saved
    try:
        yield
    finally:
        fsdpunits.MATRIX_UNIT_PARAMETERS = saved


LAYOUTS: dict[int, dict[str, dict[str, Any]]] = {
    2: {
        "tp2": {"tp": 2},
        "tp2-gelu": {"tp": 2, "model": {"mlp": "gelu"}},  # the two-matrix MLP, split the same
        **{f"pp2-{s}": _pipeline(s, pp=2) for s in SCHEDULES},
        **{f"pp2-{s}-acc2": _accumulating(s, pp=2) for s in SCHEDULES},
    },
    4: {
        "ddp4": {"dp": 4, "grad_accumulation": 2},
        "zero1-dp4": {"dp": 4, "zero_stage": 1},
        "zero2-dp4": {"dp": 4, "zero_stage": 2, "grad_accumulation": 2},
        "zero3-dp4": {"dp": 4, "zero_stage": 3, "grad_accumulation": 2},
        **{f"pp2-{s}-dp2-acc2": _accumulating(s, pp=2, dp=2) for s in SCHEDULES},
        "pp2-1f1b-zero3-dp2-acc2": _accumulating("1f1b", pp=2, dp=2, zero_stage=3),
        "pp4-1f1b": _pipeline("1f1b", pp=4),
        "tp4": {"tp": 4},
        "dp2-tp2": {"dp": 2, "tp": 2},  # ZeRO-0 in a hybrid: HSDP, shard size 1
        "dp2-tp2-zero2": {"dp": 2, "tp": 2, "zero_stage": 2},
        "pp2-tp2-acc2": _accumulating("1f1b", pp=2, tp=2),
        "cp4": {"cp": 4},  # autocast over DDP's fp32 parameters
        "cp2-tp2": {"cp": 2, "tp": 2},  # FSDP2's bf16 policy (sharded over cp), sharded logits
        # ZeRO-3 gathering matrix by matrix, as it does for blocks past a billion parameters
        "zero3-dp4-by-matrix": {"dp": 4, "zero_stage": 3, "grad_accumulation": 2, BY_MATRIX: 1},
    },
    8: {
        "3d-pp2-dp2-tp2": _pipeline("1f1b", pp=2, dp=2, tp=2),
        "3d-pp2-zero3-tp2-interleaved-acc2": _accumulating(
            "interleaved-1f1b", pp=2, dp=2, tp=2, zero_stage=3
        ),
        "3d-pp2-zero2-tp2-gpipe-acc2": _accumulating("gpipe", pp=2, dp=2, tp=2, zero_stage=2),
    },
}
"""Layout keyword arguments of ``layout_env`` per world size (``model``: spec.model keys over
the tiny preset, against a reference of the same model; :data:`BY_MATRIX`: ZeRO-3 splits each
block into one FSDP2 unit per matrix)."""


def runs(world: int) -> dict[str, tuple[dict[str, Any], str, str]]:
    """{run name: (layout, precision, activation checkpointing)}: each layout in fp32 without
    checkpointing, and in bf16 with selective or full checkpointing (alternating)."""
    found: dict[str, tuple[dict[str, Any], str, str]] = {}
    for index, (name, layout) in enumerate(LAYOUTS[world].items()):
        mode = ("selective", "full")[index % 2]
        found[name] = (layout, "fp32", "none")
        found[f"{name}+bf16-{mode}"] = (layout, "bf16", mode)
    return found


def reference_run(job: JobDocument) -> dict[str, list[float]]:
    """The plain single-process run: whole global batch, no parallelism."""
    t, shape = job.spec.training, job.plan.model
    model = build_model(shape, t.seed, bf16=t.precision == "bf16")
    optimizer = make_optimizer(model.parameters(), t.learning_rate)
    stream = make_stream(job.spec.dataset, shape.vocab, shape.seq_len, t.global_batch_size, t.seed)
    losses, norms = [], []
    params = list(model.parameters())
    for step in range(1, t.steps + 1):
        inputs, targets = stream.global_batch(step)
        loss = cross_entropy(model(inputs), targets)
        loss.backward()
        norms.append(clip_grad_norm(params, t.max_grad_norm).item())
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return {"losses": losses, "gradNorms": norms}


def main(out: str) -> None:
    device = pick_device()
    init_distributed(device)
    world = dist.get_world_size()
    results: dict[str, Any] = {}
    references: dict[tuple[str, str], dict[str, list[float]]] = {}
    for name, (given, precision, checkpointing) in runs(world).items():
        training = {**TRAINING, "precision": precision, "activationCheckpointing": checkpointing}
        layout = dict(given)
        model = {**MODEL, **layout.pop("model", {})}
        split = bool(layout.pop(BY_MATRIX, 0))
        env = layout_env(model, training, **layout)
        job = read_job({**env, "WORLD_SIZE": str(world)})
        key = (precision, job.plan.model.mlp)
        if key not in references and dist.get_rank() == 0:
            references[key] = reference_run(job)
        with blocks_split(split):
            result = train(job, build_mesh(job.plan.layout, device))
        results[name] = {
            "losses": [r.loss for r in result.records],
            "gradNorms": [r.grad_norm for r in result.records],
            "precision": precision,
            "reference": references.get(key),
        }
        dist.barrier()
    if dist.get_rank() == 0:
        with open(out, "w", encoding="utf-8") as handle:
            json.dump(results, handle, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(sys.argv[1])
