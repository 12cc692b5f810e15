"""Expert parallelism: a MoE layer's experts spread over ``ep`` ranks of one pipeline stage.

EP is folded from the data-parallel ranks of a stage (torchtitan's ParallelDims, Megatron-Core's
MoE parallel folding): with the planner's rank order (pp outermost, then dp, then tp) the ranks
of a stage are reshaped as (edp, ep), ep innermost, so an EP group is ``ep`` consecutive ranks
and each of its ranks holds experts / ep of every MoE layer (a DTensor sharded on the expert
dimension over the "ep" mesh dimension: checkpoints save the whole expert tensors, and resume
at any other ep). The ``edp`` ranks at the same place of the other EP groups hold the same
experts: expert-data parallelism.

The experts are left out of DDP and FSDP2 (their gradients are not the dense part's): after
backward each expert gradient is summed over its edp group and divided by the dense
data-parallel degree, which makes it the gradient of the global batch's mean loss, as the dense
part's average over dp does (each rank's expert gradient already sums the contributions of
every token of its EP group that reached it). Expert weights are not sharded further by ZeRO.
Tensor parallelism with MoE layers is not run (meshrun.rules.moe refuses tensorParallel above 1
with spec.model.moe).
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
    stage = layout.dp * layout.tp
    return init_device_mesh(
        device.type,
        (layout.pp, stage // layout.ep, layout.ep),
        mesh_dim_names=("pp", "edp", "ep"),
    )


def expert_modules(parts: Iterable[nn.Module]) -> list[Experts]:
    return [m for part in parts for m in part.modules() if isinstance(m, Experts)]


def expert_params(parts: Iterable[nn.Module]) -> list[nn.Parameter]:
    return [p for m in expert_modules(parts) for p in m.parameters()]


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


def edp_group(layout: Layout, mesh: Mesh, ep_mesh: DeviceMesh | None) -> dist.ProcessGroup | None:
    """The ranks holding the same experts (None: this rank alone)."""
    if ep_mesh is not None:
        return ep_mesh["edp"].get_group() if layout.dp * layout.tp > layout.ep else None
    return mesh.group("dp") if layout.dp > 1 else None


def place_experts(
    parts: list[nn.Module], layout: Layout, mesh: Mesh, ep_mesh: DeviceMesh | None
) -> None:
    """Tell every experts module of ``parts`` the ranks that hold the same experts."""
    group = edp_group(layout, mesh, ep_mesh)
    for module in expert_modules(parts):
        module.edp_group = group


def reduce_expert_grads(parts: list[nn.Module], layout: Layout) -> None:
    """Each expert gradient summed over its edp group and divided by the data-parallel degree."""
    for module in expert_modules(parts):
        for param in module.parameters():
            if param.grad is None:
                continue
            grad = param.grad.to_local() if isinstance(param.grad, DTensor) else param.grad
            if module.edp_group is not None:
                dist.all_reduce(grad, group=module.edp_group)
            if layout.dp > 1:
                grad.div_(layout.dp)


def expert_grad_square(parts: list[nn.Module]) -> torch.Tensor | None:
    """The squared norm of the experts' gradients over the whole EP group (None: no experts)."""
    modules = expert_modules(parts)
    if not modules:
        return None
    total = torch.zeros((), dtype=torch.float32)
    for module in modules:
        for param in module.parameters():
            if param.grad is not None:
                grad = param.grad.to_local() if isinstance(param.grad, DTensor) else param.grad
                total = total.to(grad.device) + grad.float().pow(2).sum()
    group = modules[0].ep_group
    if group is not None:
        dist.all_reduce(total, group=group)
    return total


def update_biases(parts: list[nn.Module], layout: Layout, mesh: Mesh) -> None:
    """Bias balancing after each optimizer step, on the loads of the whole global batch."""
    group = mesh.group("dp") if layout.dp > 1 else None
    for part in parts:
        for layer in moe_layers(part):
            layer.update_bias(group)
