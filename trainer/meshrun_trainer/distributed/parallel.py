"""The model parts of one rank: built on the meta device, parallelised, then materialized.

Order (torchtitan's): build on the meta device and cut the pipeline stage, tensor parallelism,
activation checkpointing and ``torch.compile`` per block, FSDP2, then materialization
(:mod:`meshrun_trainer.models.materialize`: each rank allocates and fills only its own shards), then
DDP (which needs real parameters).

Tensor parallel: DTensor ``parallelize_module`` with sequence parallel, the plan of torchtitan's
Llama (Megatron-LM column/row split, Korthikanti et al. 2022 for the sequence-parallel norms),
with the output head left sharded over the vocabulary for a loss-parallel cross-entropy.
Data parallel: DDP (ZeRO-0), DDP + ZeroRedundancyOptimizer (ZeRO-1), FSDP2 ``fully_shard`` with
``reshard_after_forward`` False (ZeRO-2) or True (ZeRO-3). DDP cannot wrap DTensor modules or a
pipeline stage, so hybrids take data parallelism from FSDP2: ZeRO-0 replicates (HSDP on the
("dp", "dp_shard") mesh with shard size 1, DDP's memory), ZeRO-1/2 shard on "dp" with
reshard_after_forward=False (FSDP2 has no optimizer-only sharding, so ZeRO-1 also shards
gradients there) and ZeRO-3 with True, except under pipelining (see :func:`apply_fsdp`).

Context parallelism (:mod:`meshrun_trainer.models.context`): every parameter is replicated over
the cp ranks, which see other tokens of the same sequences, so data parallelism spans dp x cp
(:meth:`meshrun_trainer.distributed.mesh.Mesh.gradient_mesh`): DDP and ZeRO-1 over the dp x cp
group, FSDP2 sharding over it (ZeRO-2/3), HSDP replicating over dp and sharding over cp (ZeRO-0
in a hybrid, torchtitan's ``dp_shard_cp``). A layout with cp > 1 and dp 1 is data parallel.

Precision (docs/trainer.md): parameters and optimizer state stay fp32 (the master weights).
Under FSDP2, bf16 training is a ``MixedPrecisionPolicy``: parameters are gathered and computed in
bf16, gradients reduced in fp32. Elsewhere (one process, DDP, TP or PP without data parallel
replicas) autocast computes in bf16 over the fp32 parameters and DDP all-reduces fp32 gradients.
Either way the residual stream and what pipeline stages send are bf16.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.nn.parallel import DistributedDataParallel

from meshrun.api.fsdpunits import gathers_by_matrix
from meshrun.api.layout import Layout
from meshrun.jobdoc import JobDocument
from meshrun_trainer.distributed.blocks import apply_activation_checkpointing, apply_compile
from meshrun_trainer.distributed.experts import (
    ddp_ignore,
    expert_mesh,
    own_params,
    place_experts,
    shard_experts,
    stage_group,
)
from meshrun_trainer.distributed.gather import gather_inputs, placed
from meshrun_trainer.distributed.mesh import Mesh
from meshrun_trainer.models.context import ContextGroup
from meshrun_trainer.models.llama import Transformer
from meshrun_trainer.models.materialize import SeededInit, WeightSource, materialize

# FSDP2 warns when a wrapped module returns a view (an nn.Linear output on 3-D input is one),
# because an in-place op on it would skip the pre-backward hook. Nothing here modifies model
# outputs in place (the loss and pipeline stages read them), so the warning is noise.
warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")


@dataclass(frozen=True, kw_only=True)
class PartOptions:
    """How each model part is built, beyond the layout and the precision."""

    activation_checkpointing: str = "none"
    """none, selective (per-op) or full (meshrun_trainer.distributed.blocks)."""
    compile: bool = False
    """torch.compile each transformer block."""
    loss_parallel: bool = True
    """Under TP, keep the logits sharded over the vocabulary and compute the loss that way."""


class DataParallel(StrEnum):
    """How the dp x cp ranks hold the model: the mechanism data parallelism runs on."""

    NONE = "none"
    """One replica: nothing to synchronise."""
    DDP = "ddp"
    """DistributedDataParallel: whole replicas, gradients all-reduced in buckets."""
    DDP_ZERO1 = "ddp+zero1"
    """DDP with ZeroRedundancyOptimizer: the optimizer state sharded (ZeRO-1)."""
    HSDP_REPLICATE = "hsdp-replicate"
    """FSDP2 replicating (ZeRO-0 in a hybrid, where DDP cannot wrap a DTensor or a stage)."""
    FSDP_ZERO2 = "fsdp-zero2"
    """FSDP2 sharding gradients and optimizer state; parameters kept after forward."""
    FSDP_ZERO3 = "fsdp-zero3"
    """FSDP2 sharding parameters too, gathered only while a unit computes."""

    @property
    def buckets(self) -> bool:
        """Whether the gradients are views into DDP's all-reduce buckets."""
        return self in (DataParallel.DDP, DataParallel.DDP_ZERO1)

    @property
    def fsdp(self) -> bool:
        """Whether FSDP2 holds the model (and bf16 comes from its mixed-precision policy)."""
        return self not in (DataParallel.NONE, DataParallel.DDP, DataParallel.DDP_ZERO1)

    @property
    def replicates_gradients(self) -> bool:
        """Whether every replica holds whole gradients, all-reduced once per optimizer step."""
        return self.buckets or self is DataParallel.HSDP_REPLICATE


def data_parallel_kind(layout: Layout) -> DataParallel:
    """The mechanism data parallelism runs on over the dp x cp ranks."""
    if layout.dp * layout.cp == 1:
        return DataParallel.NONE
    pure = layout.pp == 1 and layout.tp == 1
    if pure and layout.zero_stage == 0:
        return DataParallel.DDP
    # ZeroRedundancyOptimizer broadcasts each parameter from the rank that updates it: experts
    # sharded over an EP group differ from rank to rank, so ZeRO-1 with expert parallelism
    # takes FSDP2's (which leaves the experts alone and shards gradients too, as in hybrids).
    if pure and layout.zero_stage == 1 and layout.ep == 1:
        return DataParallel.DDP_ZERO1
    if layout.zero_stage == 0:
        return DataParallel.HSDP_REPLICATE
    return DataParallel.FSDP_ZERO3 if layout.zero_stage == 3 else DataParallel.FSDP_ZERO2


def gradients_in_buckets(layout: Layout) -> bool:
    """Whether the gradients are views into DDP's all-reduce buckets (plain DDP and ZeRO-1)."""
    return data_parallel_kind(layout).buckets


def uses_fsdp(layout: Layout) -> bool:
    """Whether data parallelism comes from FSDP2 (and bf16 from its mixed-precision policy)."""
    return data_parallel_kind(layout).fsdp


def apply_tensor_parallel(
    model: Transformer, mesh: Mesh, loss_parallel: bool = True, keep_shards: bool = True
) -> None:
    """Shard every block's linears (column then row) and the norms along the sequence; the head
    leaves its logits sharded over the vocabulary when ``loss_parallel``; ``keep_shards``: see
    :mod:`meshrun_trainer.distributed.gather`."""
    tp_mesh = mesh.device_mesh["tp"]
    top: dict[str, Any] = {}
    if model.tok_embeddings is not None:
        top["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1))
    if model.norm is not None:
        top["norm"] = SequenceParallel()
    if model.output is not None:
        top["output"] = ColwiseParallel(
            input_layouts=Shard(1),
            output_layouts=Shard(-1) if loss_parallel else Replicate(),
            use_local_output=not loss_parallel,
        )
    if top:
        parallelize_module(model, tp_mesh, top)
        # parallelize_module gave the embedding and the head a DTensor each; both are sharded
        # over the vocabulary (Shard(0)), so a tied pair can share one again.
        model.tie()
    block_plan: dict[str, Any] = {
        "attention_norm": SequenceParallel(),
        # The attention's and the feed-forward's inputs are gathered by gather_inputs.
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
        "ffn_norm": SequenceParallel(),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
        "feed_forward.w3": ColwiseParallel(),
    }
    if model.shape.mlp == "gelu":  # two matrices: w1 up (column), w2 down (row), no gate
        del block_plan["feed_forward.w3"]
    # A MoE layer routes the tokens of its sequence shard (expertTensorParallel 1): its input
    # is the norm's shard as a plain tensor, its output joins the residual stream's shard
    # (plain, as the row-parallel outputs are), and its weights are whole on every rank
    # (meshrun_trainer.distributed.experts reduces their gradients).
    dense = {k: v for k, v in block_plan.items() if not k.startswith("feed_forward.")}
    moe_plan = {
        **dense,
        "moe": PrepareModuleInput(
            input_layouts=(Shard(1),), desired_input_layouts=(Shard(1),), use_local_output=True
        ),
    }
    for block in model.layers.values():
        moe = getattr(block, "moe", None)
        parallelize_module(block, tp_mesh, block_plan if moe is None else moe_plan)
    # Backward keeps the gathered inputs' shards where autograd would keep them whole (no
    # checkpointing; under selective checkpointing the gathers are redone anyway, and a
    # compiled block's saved tensors are the compiler's to choose).
    gather_inputs(list(model.layers.values()), keep_shards)


def _placed_like(param: DTensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """A gradient hook giving ``param``'s gradient ``param``'s own placement, in a storage of
    its own (the whole gradient is freed at once)."""

    def hook(grad: torch.Tensor) -> torch.Tensor:
        if not isinstance(grad, DTensor) or grad.placements == param.placements:
            return grad
        local = grad.redistribute(param.device_mesh, param.placements)._local_tensor
        if local.untyped_storage().nbytes() > local.nbytes:
            local = local.clone()  # a slice of the whole gradient would keep all of it
        return placed(local, param.device_mesh, param.placements, param.shape, param.stride())

    return hook


def shard_embedding_gradient(model: nn.Module) -> None:
    """DTensor computes the vocabulary-sharded embedding's gradient whole (replicated) on
    every tensor-parallel rank; resharded as it is produced, the gradient, its accumulation
    and the optimizer step stay 1/t (otherwise each AdamW operation reshards it again). FSDP2
    reduces the gradients of the parameters it wraps itself."""
    embedding = getattr(model, "tok_embeddings", None)
    if isinstance(embedding, nn.Embedding) and isinstance(embedding.weight, DTensor):
        embedding.weight.register_hook(_placed_like(embedding.weight))  # type: ignore[no-untyped-call]


def block_matrices(block: nn.Module) -> list[nn.Linear]:
    """A dense block's attention and MLP matrices."""
    return [
        module
        for part in (block.get_submodule("attention"), block.get_submodule("feed_forward"))
        for module in part.children()
        if isinstance(module, nn.Linear)
    ]


def apply_fsdp(model: Transformer, layout: Layout, mesh: Mesh, bf16: bool) -> None:
    """FSDP2 units: the input embedding, each transformer block, the final norm with the head,
    then the root (torchtitan's units; a tied embedding and head stay together in the root).
    A block too large to gather whole under ZeRO-3 (meshrun.api.fsdpunits) is split: each of
    its matrices is a unit, and the block's own unit keeps its norms.

    ZeRO-3 gathers a unit only while it computes, so its peak holds one unit (the embedding, a
    block or the head) gathered, not the embedding and the head together for the whole step.
    The head's unit is not resharded after forward: backward needs it at once. ZeRO-0 in a
    hybrid replicates: HSDP on (dp, dp_shard) with dp_shard of size 1 (with cp, sharded over
    the cp ranks: (dp, dp_shard x cp)); ZeRO-2/3 shard over dp x cp. Under pipelining,
    parameters are not resharded after each micro-batch's forward (torchtitan's default): a
    stage's blocks would otherwise be gathered again for every micro-batch; the schedule
    reshards them once, after the last backward of the optimizer step.
    """
    kind = data_parallel_kind(layout)
    replicate = kind is DataParallel.HSDP_REPLICATE
    dp_mesh = mesh.gradient_mesh(replicate)
    reshard = kind is DataParallel.FSDP_ZERO3 and layout.pp == 1
    policy = MixedPrecisionPolicy(
        param_dtype=torch.bfloat16 if bf16 else None,
        reduce_dtype=torch.float32 if bf16 else None,
    )

    experts = set(own_params([model], layout))  # reduced by meshrun_trainer.distributed.experts

    def shard(modules: nn.Module | list[nn.Module], reshard_after_forward: bool) -> None:
        fully_shard(
            modules,
            mesh=dp_mesh,
            reshard_after_forward=reshard_after_forward,
            mp_policy=policy,
            ignored_params=experts or None,
        )

    separate = not model.shape.tie_embeddings
    if separate and model.tok_embeddings is not None:
        shard(model.tok_embeddings, reshard)
    by_matrix = gathers_by_matrix(model.shape, layout)
    for block in model.layers.values():
        for matrix in block_matrices(block) if by_matrix else ():
            shard(matrix, reshard)
        shard(block, reshard)  # its norms, or all of it
    head: list[nn.Module] = [m for m in (model.norm, model.output) if m is not None]
    if separate and head:
        shard(head, False)
    shard(model, reshard)


def build_parts(
    job: JobDocument,
    mesh: Mesh,
    stage_ids: list[int],
    options: PartOptions | None = None,
    source: WeightSource | None = None,
) -> list[nn.Module]:
    """This rank's model parts (one per pipeline stage it holds), parallelised and initialised
    from ``source`` (default: the seeded random initialisation). DDP wraps the part it
    returns when the layout is plain data parallel."""
    options = options or PartOptions()
    layout, shape = job.plan.layout, job.plan.model
    bf16 = job.spec.training.precision == "bf16"
    fsdp = uses_fsdp(layout)
    ep_mesh = expert_mesh(layout, mesh.device) if shape.moe is not None else None
    stage = stage_group(layout, mesh.device) if shape.moe is not None else None
    parts: list[nn.Module] = []
    for stage_id in stage_ids:
        with torch.device("meta"):
            # Autocast only where no FSDP2 policy casts the parameters.
            model = Transformer(shape, autocast_dtype=torch.bfloat16 if bf16 and not fsdp else None)
        if layout.pp > 1:
            model.keep_layers(*job.plan.stage_layers[stage_id])
        if layout.cp > 1:
            group = mesh.group("cp")
            context = ContextGroup(group, mesh.cp_rank, layout.cp, shape.seq_len, mesh.device)
            model.split_sequences(context)
        shard_experts(model, ep_mesh)
        if layout.tp > 1:
            keep_shards = options.activation_checkpointing == "none" and not options.compile
            apply_tensor_parallel(model, mesh, options.loss_parallel, keep_shards)
        blocks = list(model.layers.values())
        apply_activation_checkpointing(blocks, options.activation_checkpointing)
        if options.compile:
            apply_compile(blocks)
        if fsdp:
            apply_fsdp(model, layout, mesh, bf16)
        parts.append(model)
    seeded = SeededInit(job.spec.training.seed, shape.tie_embeddings)
    materialize(parts, mesh.device, source or seeded)
    place_experts(parts, layout, mesh, ep_mesh, stage)
    if layout.tp > 1 and not fsdp:
        for part in parts:
            shard_embedding_gradient(part)
    if gradients_in_buckets(layout):
        device_ids = [mesh.device.index] if mesh.device.type == "cuda" else None
        ddp_ignore(parts[0])
        # The gradients are views into DDP's all-reduce buckets instead of a second copy of
        # every gradient beside them (torch's DDP documentation: it saves the gradients' size).
        ddp = DistributedDataParallel(
            parts[0],
            device_ids=device_ids,
            process_group=mesh.gradient_group(),
            gradient_as_bucket_view=True,
        )
        return [ddp]
    return parts


@contextmanager
def gradient_sync(parts: list[nn.Module], layout: Layout, last: bool) -> Iterator[None]:
    """One gradient-accumulation micro-step (without pipelining; the pipeline stages do this
    themselves): replicated gradients (DDP, ZeRO-1, HSDP) are all-reduced only on the ``last``
    one. Sharded gradients (ZeRO-2/3) are reduce-scattered after every micro-step: skipping
    that would hold the whole model's gradients on every rank, which ZeRO-2/3 exist to avoid."""
    if last or not data_parallel_kind(layout).replicates_gradients:
        yield
        return
    with ExitStack() as stack:
        for part in parts:
            if isinstance(part, DistributedDataParallel):
                stack.enter_context(part.no_sync())
            elif isinstance(part, FSDPModule):
                part.set_requires_gradient_sync(False)
                stack.callback(part.set_requires_gradient_sync, True)
        yield


def plain(tensor: torch.Tensor) -> torch.Tensor:
    """A loss as a plain tensor (a loss-parallel loss is a replicated DTensor)."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def end_forward_only(parts: list[nn.Module]) -> None:
    """Call after forward passes without a backward (validation).

    FSDP2 units not resharded after forward (ZeRO-2, HSDP, the head's unit, every unit under
    pipelining) would otherwise stay gathered and keep FSDP2's per-iteration bookkeeping into
    the next training step, whose backward then gathers a unit again after its reshard: the
    step after that computes with weights from before the optimizer step. reset_iter_state
    reshards every unit and clears that bookkeeping."""
    for part in parts:
        if isinstance(part, FSDPModule):
            part.reset_iter_state()
