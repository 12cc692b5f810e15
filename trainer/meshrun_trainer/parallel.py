"""Tensor and data parallelism applied to one model part (the whole model or a pipeline stage).

Tensor parallel: DTensor ``parallelize_module`` with sequence parallel, the plan of torchtitan's
Llama (Megatron-LM column/row split, Korthikanti et al. 2022 for the sequence-parallel norms).
Data parallel: DDP (ZeRO-0), DDP + ZeroRedundancyOptimizer (ZeRO-1), FSDP2 ``fully_shard`` with
``reshard_after_forward`` False (ZeRO-2) or True (ZeRO-3). DDP cannot wrap DTensor modules or a
pipeline stage (REFERENCE section 4), so hybrids take data parallelism from FSDP2: ZeRO-0 replicates
(HSDP on the ("dp", "dp_shard") mesh with shard size 1, DDP's memory), ZeRO-1/2 shard on "dp" with
reshard_after_forward=False (FSDP2 has no optimizer-only sharding, so ZeRO-1 also shards
gradients there) and ZeRO-3 with True.
"""

from __future__ import annotations

import warnings
from typing import Any

from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.nn.parallel import DistributedDataParallel

from meshrun_trainer.config import Layout
from meshrun_trainer.mesh import Mesh
from meshrun_trainer.model import Transformer

# FSDP2 warns when a wrapped module returns a view (an nn.Linear output on 3-D input is one),
# because an in-place op on it would skip the pre-backward hook. Nothing here modifies model
# outputs in place (the loss and pipeline stages read them), so the warning is noise.
warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")


def data_parallel_kind(layout: Layout) -> str:
    """One of "none", "ddp", "ddp+zero1", "hsdp-replicate", "fsdp-zero2" or "fsdp-zero3"."""
    if layout.dp == 1:
        return "none"
    pure = layout.pp == 1 and layout.tp == 1
    if pure and layout.zero_stage == 0:
        return "ddp"
    if pure and layout.zero_stage == 1:
        return "ddp+zero1"
    if layout.zero_stage == 0:
        return "hsdp-replicate"
    return "fsdp-zero3" if layout.zero_stage == 3 else "fsdp-zero2"


def apply_tensor_parallel(model: Transformer, mesh: Mesh) -> None:
    """Shard every block's linears (column then row) and the norms along the sequence."""
    tp_mesh = mesh.device_mesh["tp"]
    top: dict[str, Any] = {}
    if model.tok_embeddings is not None:
        top["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1))
    if model.norm is not None:
        top["norm"] = SequenceParallel()
    if model.output is not None:
        top["output"] = ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())
    if top:
        parallelize_module(model, tp_mesh, top)
        # parallelize_module gave the embedding and the head a DTensor each; both are sharded
        # over the vocabulary (Shard(0)), so a tied pair can share one again.
        model.tie()
    block_plan: dict[str, Any] = {
        "attention_norm": SequenceParallel(),
        # rope tables travel as plain tensors (None: leave them alone)
        "attention": PrepareModuleInput(
            input_layouts=(Shard(1), None, None),
            desired_input_layouts=(Replicate(), None, None),
        ),
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
        "ffn_norm": SequenceParallel(),
        "feed_forward": PrepareModuleInput(
            input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
        ),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
        "feed_forward.w3": ColwiseParallel(),
    }
    for block in model.layers.values():
        parallelize_module(block, tp_mesh, block_plan)


def apply_fsdp(
    model: Transformer, mesh: Mesh, reshard_after_forward: bool, replicate: bool = False
) -> None:
    """FSDP2 per transformer block, then the root (embeddings, norm, head).

    ``replicate``: HSDP on (dp, dp_shard) with dp_shard of size 1, i.e. plain replication.
    """
    dp_mesh = mesh.device_mesh["dp", "dp_shard"] if replicate else mesh.device_mesh["dp"]
    for block in model.layers.values():
        fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=dp_mesh, reshard_after_forward=reshard_after_forward)


def parallelize(model: Transformer, layout: Layout, mesh: Mesh) -> nn.Module:
    """Apply TP then DP to ``model`` in place; returns the module to call (DDP wraps it)."""
    model.to(mesh.device)
    if layout.tp > 1:
        apply_tensor_parallel(model, mesh)
    kind = data_parallel_kind(layout)
    if kind in ("ddp", "ddp+zero1"):
        device_ids = [mesh.device.index] if mesh.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=device_ids, process_group=mesh.group("dp"))
    if kind == "hsdp-replicate":
        apply_fsdp(model, mesh, reshard_after_forward=False, replicate=True)
    elif kind.startswith("fsdp"):
        apply_fsdp(model, mesh, reshard_after_forward=kind == "fsdp-zero3")
    return model
