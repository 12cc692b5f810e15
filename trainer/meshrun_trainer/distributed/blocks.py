"""Per-block activation checkpointing and ``torch.compile``.

Both replace a transformer block's ``forward`` on the instance instead of wrapping the module,
so parameter names (checkpoints, Hugging Face keys, the tensor-parallel plan) stay those of the
model, and the hooks FSDP2 and tensor parallelism put around the block's ``__call__`` stay
outside the recomputed region: in backward FSDP2 gathers the block's parameters (pre-backward
hook), then the checkpoint recomputes the block's forward with them, as torchtitan's ordering
(checkpoint inside, FSDP outside) does.

Modes (``spec.training.activationCheckpointing``):

- ``none``: autograd keeps every tensor backward needs.
- ``selective``: per-op selective recomputation (torchtitan's op-level policy): the outputs of
  the matrix multiplications and of attention are kept, everything else in the block (norms,
  rotary embedding, SiLU, products, repeats, tensor parallelism's all-gathers) is recomputed in
  backward. Costs a few cheap element-wise kernels; keeps the results of the expensive ops.
- ``full``: only the block's input is kept; the whole block runs again in backward (about one
  extra forward, a third more compute).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

CHECKPOINTING = ("none", "selective", "full")
"""Activation-checkpointing modes."""

_ops = torch.ops.aten
SAVED_OPS = frozenset(
    {
        _ops.mm.default,
        _ops.addmm.default,
        _ops.bmm.default,
        _ops._scaled_dot_product_flash_attention.default,
        _ops._scaled_dot_product_flash_attention_for_cpu.default,
        _ops._scaled_dot_product_efficient_attention.default,
        _ops._scaled_dot_product_cudnn_attention.default,
        # Tensor parallelism's reduce-scatter after wo and w2 (its result is 1/t of their
        # output); the all-gathers before wq/wk/wv and w1/w3 are redone in backward, as
        # Megatron-LM's sequence parallelism does, since keeping them costs a whole h per token.
        torch.ops._c10d_functional.reduce_scatter_tensor.default,
    }
)
"""Ops whose outputs selective checkpointing keeps (matrix multiplies, attention, and the
reduce-scatter of tensor parallelism); meshrun.planner.memory counts exactly these."""


def _selective_policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    del ctx, args, kwargs
    return CheckpointPolicy.MUST_SAVE if op in SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def _selective_contexts() -> Any:
    return create_selective_checkpoint_contexts(_selective_policy)  # type: ignore[no-untyped-call]


def checkpointed(forward: Callable[..., torch.Tensor], mode: str) -> Callable[..., torch.Tensor]:
    """``forward`` with activation checkpointing ``mode`` ("selective" or "full")."""
    if mode == "full":
        return partial(checkpoint, forward, use_reentrant=False)
    if mode == "selective":
        return partial(checkpoint, forward, use_reentrant=False, context_fn=_selective_contexts)
    raise ValueError(f"activation checkpointing must be one of {CHECKPOINTING}, got {mode!r}")


def _replace_forward(block: nn.Module, forward: Callable[..., torch.Tensor]) -> None:
    # An instance attribute shadows the class's forward; nn.Module.__call__ still runs the hooks.
    block.__dict__["forward"] = forward


def apply_activation_checkpointing(blocks: list[nn.Module], mode: str) -> None:
    """Checkpoint each block's forward; ``none`` leaves the blocks alone."""
    if mode == "none":
        return
    for block in blocks:
        _replace_forward(block, checkpointed(block.forward, mode))


def apply_compile(blocks: list[nn.Module]) -> None:
    """Compile each block's forward (after checkpointing, so the recomputation is compiled
    too); blocks are identical, so one compiled graph serves them all."""
    for block in blocks:
        _replace_forward(block, torch.compile(block.forward))
