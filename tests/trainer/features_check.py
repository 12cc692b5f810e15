"""Facts about how the trainer runs, measured in one 4-rank launch.

Usage (under torchrun, 4 ranks): features_check.py OUT.json -- rank 0 writes {check: facts}:
- ``init/<layout>``: each rank's share of the parameters, and whether the gathered values equal
  the single-process model's (meta-device build, shard-by-shard initialisation);
- ``dtypes/<layout>``: parameter, gradient, residual-stream and stage-output dtypes in bf16;
- ``sync/<layout>``: what the gradients and parameters look like after a first accumulation
  micro-step and after the last one (no gradient sync or re-gather in between where it is not
  needed);
- ``loss-parallel``: the placement of the logits under tensor parallelism;
- ``units/zero3-dp4``: FSDP2 units by block and split matrix by matrix.
Launched by test_features.py; not a test module itself.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import torch
import torch.distributed as dist
from layout_check import MODEL, TRAINING, blocks_split
from meshrun_trainer.components.data.synthetic import make_stream, replica_rows
from meshrun_trainer.config.read import read_job
from meshrun_trainer.distributed.mesh import build_mesh, init_distributed, pick_device
from meshrun_trainer.distributed.parallel import gradient_sync
from meshrun_trainer.local.env import layout_env
from meshrun_trainer.loop.train import build_runner
from meshrun_trainer.models.llama import build_model
from meshrun_trainer.models.loss import cross_entropy
from meshrun_trainer.runner import Runner
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from meshrun.jobdoc import JobDocument

PIPE = {"pp": 2, "dp": 2, "schedule": "1f1b", "micro_batches": 2, "grad_accumulation": 2}


def _setup(layout: dict[str, Any], precision: str = "fp32") -> tuple[JobDocument, Runner, Any]:
    env = layout_env(MODEL, {**TRAINING, "precision": precision}, **layout)
    job = read_job({**env, "WORLD_SIZE": str(dist.get_world_size())})
    mesh = build_mesh(job.plan.layout, pick_device())
    return job, build_runner(job, mesh), mesh


def _batch(job: JobDocument, mesh: Any) -> tuple[torch.Tensor, torch.Tensor]:
    shape, dp = job.plan.model, job.plan.layout.dp
    batch = job.spec.training.global_batch_size
    x, y = make_stream(job.spec.dataset, shape.vocab, shape.seq_len, batch, 7).global_batch(1)
    return replica_rows(x, mesh.dp_rank, dp), replica_rows(y, mesh.dp_rank, dp)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def check_init(layout: dict[str, Any]) -> dict[str, Any]:
    job, runner, _ = _setup(layout)
    reference = dict(build_model(job.plan.model, job.spec.training.seed).named_parameters())
    local = sum(_local(p).numel() for p in runner.parameters())
    equal = all(
        torch.equal(p.full_tensor() if isinstance(p, DTensor) else p, reference[name])
        for part in runner.parts
        for name, p in part.named_parameters()
    )
    shares = [0] * dist.get_world_size()
    dist.all_gather_object(shares, local)
    return {"shares": shares, "total": job.plan.model.parameters(), "equal": equal}


def check_dtypes(layout: dict[str, Any]) -> dict[str, Any]:
    job, runner, mesh = _setup(layout, "bf16")
    part = runner.parts[0]
    model = part.module if hasattr(part, "module") else part
    seen: dict[str, str] = {}

    def block_input(_: nn.Module, args: tuple[Any, ...]) -> None:
        seen["residual"] = str(args[0].dtype)

    def stage_output(_: nn.Module, __: Any, output: torch.Tensor) -> None:
        seen["output"] = str(output.dtype)

    first = next(iter(model.layers.values()))
    handles = [
        first.register_forward_pre_hook(block_input),
        model.register_forward_hook(stage_output),
    ]
    x, y = _batch(job, mesh)
    if runner.schedule is None:
        cross_entropy(part(x), y).backward()
    else:
        args = (x,) if runner.is_first else ()
        runner.schedule.step(*args, target=y if runner.is_last else None)
    for handle in handles:
        handle.remove()
    seen["params"] = sorted({str(p.dtype) for p in runner.parameters()})  # type: ignore[assignment]
    seen["grads"] = sorted({str(p.grad.dtype) for p in runner.parameters() if p.grad is not None})  # type: ignore[assignment]
    return seen


def _state(runner: Runner, group: dist.ProcessGroup) -> dict[str, bool | None]:
    params = runner.parameters()
    return {
        "gathered": not any(isinstance(p, DTensor) for p in params),
        "grads": all(p.grad is not None for p in params),
        "same_on_replicas": _replicas_agree(params, group),
        "sharded_grads": _sharded_grads(runner),
    }


def _sharded_grads(runner: Runner) -> bool | None:
    """Whether every FSDP2 shard holds a (reduce-scattered) gradient; None without FSDP2.
    FSDP2's own bookkeeping: while a module's parameters are gathered, the shards are not
    the module's registered parameters."""
    found = []
    for part in runner.parts:
        for module in part.modules():
            if isinstance(module, FSDPModule):
                group = module._get_fsdp_state()._fsdp_param_group
                if group is not None:
                    found += [p.sharded_param.grad is not None for p in group.fsdp_params]
    return all(found) if found else None


def _replicas_agree(params: list[torch.Tensor], group: dist.ProcessGroup) -> bool:
    """Whether the gradients (plain tensors) are equal on every data-parallel replica."""
    grads = [p.grad for p in params if p.grad is not None and not isinstance(p.grad, DTensor)]
    if not grads:
        return True
    flat = torch.cat([g.flatten() for g in grads])
    low, high = flat.clone(), flat.clone()
    dist.all_reduce(low, op=dist.ReduceOp.MIN, group=group)
    dist.all_reduce(high, op=dist.ReduceOp.MAX, group=group)
    return bool(torch.equal(low, high))


def check_sync(layout: dict[str, Any]) -> dict[str, Any]:
    """Run the first and the last of two accumulation micro-steps by hand."""
    job, runner, mesh = _setup(layout)
    x, y = _batch(job, mesh)
    found = {}
    for index, (xs, ys) in enumerate(zip(x.chunk(2), y.chunk(2), strict=True)):
        last = index == 1
        if runner.schedule is None:
            with gradient_sync(runner.parts, job.plan.layout, last), runner.loss_context():
                cross_entropy(runner.parts[0](xs), ys).backward()
        else:
            for stage in runner.pipeline_stages():
                stage.last_run = last
            args = (xs,) if runner.is_first else ()
            with runner.loss_context():
                runner.schedule.step(*args, target=ys if runner.is_last else None)
        found["last" if last else "first"] = _state(runner, mesh.group("dp"))
    return found


def check_loss_parallel() -> dict[str, Any]:
    job, runner, mesh = _setup({"dp": 2, "tp": 2})
    x, _ = _batch(job, mesh)
    logits = runner.parts[0](x)
    placements = [str(p) for p in logits.placements] if isinstance(logits, DTensor) else []
    return {"placements": placements, "shape": list(_local(logits).shape)}


def check_units() -> dict[str, int]:
    """FSDP2 units of ZeRO-3 over 4 ranks: by block, and with the bar for splitting blocks
    lowered so the tiny preset's are split matrix by matrix."""
    counts = {}
    for name, split in (("block", False), ("matrix", True)):
        with blocks_split(split):
            _, runner, _ = _setup({"dp": 4, "zero_stage": 3})
        counts[name] = sum(
            isinstance(module, FSDPModule) for part in runner.parts for module in part.modules()
        )
    return counts


def main(out: str) -> None:
    init_distributed(pick_device())
    facts: dict[str, Any] = {}
    for name, layout in (
        ("zero3-dp4", {"dp": 4, "zero_stage": 3}),
        ("dp2-tp2", {"dp": 2, "tp": 2}),
    ):
        facts[f"init/{name}"] = check_init(layout)
    for name, layout in (
        ("zero3-dp4", {"dp": 4, "zero_stage": 3}),
        ("ddp4", {"dp": 4}),
        ("pp2-dp2", {**PIPE}),
    ):
        facts[f"dtypes/{name}"] = check_dtypes(layout)
    for name, layout in (
        ("ddp4", {"dp": 4, "grad_accumulation": 2}),
        ("zero3-dp4", {"dp": 4, "zero_stage": 3, "grad_accumulation": 2}),
        ("dp2-tp2", {"dp": 2, "tp": 2, "grad_accumulation": 2}),
        ("pp2-dp2", {**PIPE}),
        ("pp2-dp2-zero3", {**PIPE, "zero_stage": 3}),
    ):
        facts[f"sync/{name}"] = check_sync(layout)
    facts["loss-parallel"] = check_loss_parallel()
    facts["units/zero3-dp4"] = check_units()
    if dist.get_rank() == 0:
        with open(out, "w", encoding="utf-8") as handle:
            json.dump(facts, handle, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(sys.argv[1])
