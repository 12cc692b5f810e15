"""Expert parallelism: a MoE layer's experts spread over ``ep`` ranks of one pipeline stage.

EP is folded from the data-parallel, context-parallel and tensor-parallel ranks of a stage
(torchtitan's ParallelDims, Megatron-Core's MoE parallel folding): with the planner's rank order
(pp outermost, then dp, cp, tp) the dp x cp x tp ranks of a stage are reshaped as (edp, ep), ep
innermost, so an EP group is ``ep`` consecutive ranks (a cp group's when ep is cp and tp 1)
and each of its ranks holds experts / ep of every MoE layer (a DTensor sharded on the expert
dimension over the "ep" mesh dimension: checkpoints save the whole expert tensors, and resume
at any other ep). The ``edp`` ranks at the same place of the other EP groups hold the same
experts: expert-data parallelism.

The experts are left out of DDP and FSDP2 (their gradients are not the dense part's): after
backward each expert gradient is summed over its edp group and divided by the dense
data-parallel degree dp x cp, which makes it the gradient of the global batch's mean loss, as
the dense part's average over dp x cp does (each rank's expert gradient already sums the
contributions of every token of its EP group that reached it; a context-parallel rank's loss
is its share of the mean times cp). Expert weights are not sharded further by ZeRO. Under
tensor parallelism each expert stays whole (expertTensorParallel 1, meshrun.rules.moe).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from meshrun.api.layout import Layout
from meshrun_trainer.distributed.mesh import Mesh
from meshrun_trainer.models.moe import Experts, moe_layers


def expert_mesh(layout: Layout, device: torch.device) -> DeviceMesh | None:
    """The (pp, edp, ep) mesh over the whole world, or None without expert parallelism."""
    if layout.ep == 1:
        return None
    stage = layout.dp * layout.cp * layout.tp
    return init_device_mesh(
        device.type,
        (layout.pp, stage // layout.ep, layout.ep),
        mesh_dim_names=("pp", "edp", "ep"),
    )


def stage_group(layout: Layout, device: torch.device) -> dist.ProcessGroup | None:
    """The dp x cp x tp ranks of this rank's pipeline stage, which see different tokens of a MoE
    layer (None: this rank alone)."""
    if layout.dp * layout.cp * layout.tp == 1:
        return None
    if layout.tp == 1:
        return None  # the dp x cp group; see :func:`place_experts`
    mesh = init_device_mesh(
        device.type, (layout.pp, layout.dp * layout.cp * layout.tp), mesh_dim_names=("pp", "stage")
    )
    return mesh["stage"].get_group()


def expert_modules(parts: Iterable[nn.Module]) -> list[Experts]:
    return [m for part in parts for m in part.modules() if isinstance(m, Experts)]


def expert_params(parts: Iterable[nn.Module]) -> list[nn.Parameter]:
    return [p for m in expert_modules(parts) for p in m.parameters()]


def routing_params(parts: Iterable[nn.Module], layout: Layout) -> list[nn.Parameter]:
    """A MoE layer's other weights (router, shared experts, their gate) where the trainer
    reduces their gradients itself: under tensor parallelism, whose ranks see different
    tokens of the layer (the sequence is sharded) but hold the same weights."""
    if layout.tp == 1:
        return []
    return [
        p
        for part in parts
        for layer in moe_layers(part)
        for name, p in layer.named_parameters()
        if not name.startswith("experts.")
    ]


def own_params(parts: Iterable[nn.Module], layout: Layout) -> list[nn.Parameter]:
    """Parameters whose gradients this module reduces (DDP and FSDP2 leave them alone)."""
    parts = list(parts)
    return expert_params(parts) + routing_params(parts, layout)


def shard_experts(model: nn.Module, mesh: DeviceMesh | None) -> None:
    """Each MoE layer's stacked experts sharded on the expert dimension over ``mesh["ep"]``
    (on the meta device: materialization fills each rank's own experts)."""
    if mesh is None:
        return
    ep_mesh = mesh["ep"]
    for experts in expert_modules([model]):
        for name, param in list(experts.named_parameters(recurse=False)):
            placed = distribute_tensor(param.data, ep_mesh, [Shard(0)], src_data_rank=None)
            experts.register_parameter(name, nn.Parameter(placed))
        experts.ep_group = ep_mesh.get_group()


def ddp_ignore(model: nn.Module) -> None:
    """Keep DDP off the experts' weights (their gradients are reduced by
    :func:`reduce_expert_grads`)."""
    ids = {id(p) for p in expert_params([model])}
    names = [name for name, p in model.named_parameters() if id(p) in ids]
    if names:
        ddp = nn.parallel.DistributedDataParallel
        ddp._set_params_and_buffers_to_ignore_for_model(model, names)  # type: ignore[no-untyped-call]


def place_experts(
    parts: list[nn.Module],
    layout: Layout,
    mesh: Mesh,
    ep_mesh: DeviceMesh | None,
    stage: dist.ProcessGroup | None,
) -> None:
    """Tell every MoE layer of ``parts`` its groups: the ranks of its stage (the whole batch's
    tokens), the ranks holding the other shards of its sequences (cp x tp) and, for its
    experts, the ranks holding the same experts."""
    if stage is None and layout.dp * layout.cp > 1:
        stage = mesh.gradient_group()  # tp 1: the stage's ranks are the dp x cp ones
    edp = stage
    if ep_mesh is not None:
        edp = ep_mesh["edp"].get_group() if layout.dp * layout.cp * layout.tp > layout.ep else None
    sequence = mesh.sequence_group()
    for part in parts:
        for layer in moe_layers(part):
            layer.stage_group = stage
            layer.sequence_group = sequence
            layer.sequence_shards = layout.cp * layout.tp
            layer.summed_shards = layout.tp
            layer.experts.edp_group = edp


def reduce_expert_grads(parts: list[nn.Module], layout: Layout) -> None:
    """Each gradient of :func:`own_params` summed over the ranks holding the same weights (the
    experts': their edp group; the routing weights': the stage) and divided by the
    data-parallel degree (dp x cp)."""
    routing = {id(p) for p in routing_params(parts, layout)}
    for part in parts:
        for layer in moe_layers(part):
            for name, param in layer.named_parameters():
                expert = name.startswith("experts.")
                if param.grad is None or not (expert or id(param) in routing):
                    continue
                grad = param.grad.to_local() if isinstance(param.grad, DTensor) else param.grad
                group = layer.experts.edp_group if expert else layer.stage_group
                if group is not None:
                    dist.all_reduce(grad, group=group)
                if layout.dp * layout.cp > 1:
                    grad.div_(layout.dp * layout.cp)


def expert_grad_square(parts: list[nn.Module], layout: Layout) -> torch.Tensor | None:
    """The squared norm of the gradients of :func:`own_params`: the experts' over the whole EP
    group, the routing weights' (the same on every rank of the stage) once (None: none)."""
    modules = expert_modules(parts)
    if not modules:
        return None

    def square(params: Iterable[nn.Parameter]) -> torch.Tensor:
        total = torch.zeros((), dtype=torch.float32)
        for param in params:
            if param.grad is not None:
                grad = param.grad.to_local() if isinstance(param.grad, DTensor) else param.grad
                total = total.to(grad.device) + grad.float().pow(2).sum()
        return total

    experts = square(expert_params(parts))
    group = modules[0].ep_group
    if group is not None:
        dist.all_reduce(experts, group=group)
    routing = square(routing_params(parts, layout))
    return experts + routing.to(experts.device)


def update_biases(parts: list[nn.Module]) -> None:
    """Bias balancing after each optimizer step, on the loads of the whole global batch."""
    for part in parts:
        for layer in moe_layers(part):
            layer.update_bias(layer.stage_group)
