"""AdamW, its learning-rate schedule (warmup, then cosine or linear decay), and global
gradient-norm clipping."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.optim.lr_scheduler import LambdaLR

from meshrun.api.spec import LRSchedule, Optimizer

ADAMW_BETAS = (0.9, 0.95)
"""The CRD's default betas (spec.training.optimizer.betas; Llama 2's, Touvron et al. 2023,
section 2.2), for callers that give only a learning rate (tests, benches)."""
WEIGHT_DECAY = 0.1
"""The CRD's default weight decay (spec.training.optimizer.weightDecay; Llama 2's)."""
ADAMW_EPS = 1e-8
"""AdamW's epsilon (torch's default; not a spec field)."""


def lr_factor(step: int, total_steps: int, schedule: LRSchedule) -> float:
    """Multiplier of the peak learning rate for 1-based optimizer step ``step``."""
    if step <= schedule.warmup_steps:
        return step / schedule.warmup_steps
    if schedule.decay == "constant":
        return 1.0
    span = max(total_steps - schedule.warmup_steps, 1)
    progress = min((step - schedule.warmup_steps) / span, 1.0)
    shape = 0.5 * (1 + math.cos(math.pi * progress)) if schedule.decay == "cosine" else 1 - progress
    return schedule.min_ratio + (1 - schedule.min_ratio) * shape


def make_optimizer(
    params: Iterable[torch.nn.Parameter],
    learning_rate: float,
    settings: Optimizer | None = None,
    zero1_group: dist.ProcessGroup | None = None,
) -> torch.optim.Optimizer:
    """AdamW (fused on CUDA) at peak ``learning_rate`` with ``settings``
    (spec.training.optimizer; None: the CRD's defaults); sharded across ``zero1_group`` (ZeRO-1)
    when given."""
    betas = tuple(settings.betas) if settings is not None else ADAMW_BETAS
    params = list(params)
    options: dict[str, Any] = {
        "lr": learning_rate,
        "betas": betas,
        "weight_decay": settings.weight_decay if settings is not None else WEIGHT_DECAY,
        "eps": ADAMW_EPS,
        # One kernel for all parameters instead of a loop of small ones (torch docs: AdamW).
        "fused": bool(params) and all(p.device.type == "cuda" for p in params),
    }
    if zero1_group is not None:
        # imported here: TorchScript compiles torch.distributed.optim's functional optimizers
        # at import, a third of a second of CPU in every process that never shards one
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(
            params, optimizer_class=torch.optim.AdamW, process_group=zero1_group, **options
        )
    return torch.optim.AdamW(params, **options)


def make_scheduler(
    optimizer: torch.optim.Optimizer, schedule: LRSchedule, total_steps: int
) -> LambdaLR:
    """The schedule as a LambdaLR; its ``last_epoch`` counts optimizer steps taken.

    LambdaLR sets the learning rate of step 1 at construction (factor of step ``last_epoch +
    1``), and each ``scheduler.step()`` after an optimizer step prepares the next one.
    """
    # ZeroRedundancyOptimizer copies its own groups' learning rate into its shard's optimizer
    # at each step, so the schedule drives the outer optimizer in every case.
    return LambdaLR(optimizer, lambda taken: lr_factor(taken + 1, total_steps, schedule))


def clip_grad_norm(
    params: list[torch.nn.Parameter],
    max_norm: float,
    pp_group: dist.ProcessGroup | None = None,
    duplicates: Iterable[torch.nn.Parameter] = (),
    experts: Iterable[torch.nn.Parameter] = (),
    expert_square: torch.Tensor | None = None,
) -> torch.Tensor:
    """Clip by the norm over all parameters of the whole model; returns that norm.

    DTensor gradients (TP and FSDP shards) give a DTensor norm whose full_tensor() covers the
    TP/DP shards; pipeline stages hold disjoint parameters, so their squared norms are summed
    across the pp group (the torchtitan recipe). DDP gradients are already whole on each rank.
    ``duplicates``: parameters another stage also holds (a tied head's copy of the embedding),
    counted once, by that other stage. ``experts``: a mixture of experts' weights, spread over
    the expert-parallel group, whose squared gradient norm over that group is
    ``expert_square`` (meshrun_trainer.distributed.experts).
    """
    expert_list = list(experts)
    own = {id(p) for p in expert_list}
    skip = {id(p) for p in duplicates} | own
    grads = [p.grad for p in params if p.grad is not None and id(p) not in skip]
    total = torch.nn.utils.get_total_norm(grads, norm_type=2.0)
    if isinstance(total, DTensor):
        total = total.full_tensor()
    if expert_square is not None:
        total = (total.pow(2) + expert_square.to(total)).sqrt()
    if pp_group is not None and dist.get_world_size(pp_group) > 1:
        squared = total.pow(2)
        dist.all_reduce(squared, group=pp_group)
        total = squared.sqrt()
    if max_norm > 0:
        # torch.nn.utils.clip_grads_with_norm_'s rule, applied to each rank's shards: the
        # coefficient is the same number on every rank, so scaling the local tensors is the same
        # product, without DTensor's sharding propagation for a foreach op over every gradient
        # (seconds of CPU per layout on a 2-D mesh).
        coefficient = (max_norm / (total + 1e-6)).clamp(max=1.0)
        every = {id(p): p for p in [*params, *expert_list]}  # the experts' own weights too
        shards = [
            grad.to_local() if isinstance(grad, DTensor) else grad
            for grad in (p.grad for p in every.values())
            if grad is not None
        ]
        torch._foreach_mul_(shards, coefficient)
    return total


class LRSchedules:
    """The learning-rate schedule of each optimizer of this rank (torchtitan's
    LRSchedulersContainer): stepped together after each optimizer step, checkpointed as a list
    in optimizer order."""

    def __init__(
        self, optimizers: list[torch.optim.Optimizer], schedule: LRSchedule, total_steps: int
    ) -> None:
        self.schedulers = [make_scheduler(opt, schedule, total_steps) for opt in optimizers]

    def step(self) -> None:
        for scheduler in self.schedulers:
            scheduler.step()

    def state_dict(self) -> list[dict[str, Any]]:
        return [scheduler.state_dict() for scheduler in self.schedulers]

    def load_state_dict(self, states: list[dict[str, Any]]) -> None:
        for scheduler, saved in zip(self.schedulers, states, strict=False):
            scheduler.load_state_dict(saved)
