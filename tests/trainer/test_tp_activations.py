"""What a tensor-parallel block keeps for backward, on two real gloo ranks, against the
planner's accounting; keeping the gathered inputs' shards, and resharding the embedding's
gradient as it is produced, change no gradient.

Both blocks, with shards kept and without, are counted from what autograd's saved-tensor hooks
keep (the trainer's own hooks included: a kept shard counts in place of its gathered tensor).
MemTracker's count of the same blocks depended on when storages were freed: it varied between
machines and fell short by the MLP's width under load, while the saved tensors are the same
everywhere."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from activations_held import saved_after_forward
from meshrun_trainer.distributed.mesh import Mesh
from meshrun_trainer.distributed.parallel import apply_tensor_parallel, shard_embedding_gradient
from meshrun_trainer.models.llama import Transformer
from meshrun_trainer.models.materialize import SeededInit, materialize
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from trainer_launch import gloo_ranks

from meshrun.api.presets import PRESETS, ModelShape
from meshrun.planner.memory import layer_activation_elements

pytestmark = [pytest.mark.trainer, pytest.mark.timeout(300)]

TP = 2
ROWS = 2
TINY = PRESETS["tiny"]


def _step(
    shape: ModelShape, mesh: Mesh, keep_shards: bool
) -> tuple[int, dict[str, torch.Tensor], list[int]]:
    """(activation bytes held, full gradients, elements of each embedding gradient as it
    arrived on this rank, before the trainer reshards it)."""
    with torch.device("meta"):
        model = Transformer(shape)
    apply_tensor_parallel(model, mesh, loss_parallel=False, keep_shards=keep_shards)
    materialize([model], torch.device("cpu"), SeededInit(0, shape.tie_embeddings))
    arrived: list[int] = []
    if keep_shards:
        weight = model.tok_embeddings.weight
        weight.register_hook(lambda grad: arrived.append(grad.to_local().numel()))
        shard_embedding_gradient(model)
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, shape.vocab, (ROWS, shape.seq_len), generator=generator)
    held = saved_after_forward(model, tokens)
    grads = {}
    for name, param in model.named_parameters():
        grad = param.grad
        assert isinstance(grad, DTensor) and isinstance(param, DTensor), name
        if keep_shards and name == "tok_embeddings.weight":
            # left to DTensor it is replicated: the whole vocabulary on every rank
            assert grad.placements == param.placements
            assert grad.to_local().shape == param.to_local().shape
        grads[name] = grad.full_tensor()
    return held, grads, arrived


def _rank(rank: int, results: dict[str, Any]) -> None:
    device_mesh = init_device_mesh(
        "cpu", (1, 1, 1, TP), mesh_dim_names=("pp", "dp", "dp_shard", "tp")
    )
    mesh = Mesh(device_mesh, torch.device("cpu"), 0, 0, rank)
    tokens = ROWS * TINY.seq_len
    per_layer = {}
    grads = {}
    for keep in (True, False):
        four, grads[keep], arrived = _step(TINY, mesh, keep)
        if keep and rank == 0:
            results["arrived"] = arrived
        two, _, _ = _step(dataclasses.replace(TINY, layers=2), mesh, keep)
        per_layer[keep] = (four - two) / 2 / tokens / 4  # fp32 elements per token
    if rank == 0:
        results["kept"] = per_layer[True]
        results["whole"] = per_layer[False]
        results["grad_error"] = max(
            float((grads[True][n] - grads[False][n]).abs().max()) for n in grads[True]
        )


def test_tensor_parallel_block_keeps_what_the_planner_counts() -> None:
    results = gloo_ranks(_rank, TP)
    kept, whole = results["kept"], results["whole"]
    assert kept == layer_activation_elements(TINY, TP, "none")
    # Autograd alone keeps both norms' gathered outputs whole (2h) instead of their shards.
    assert whole - kept == 2 * TINY.hidden - 2 * TINY.hidden / TP
    assert results["grad_error"] < 1e-6
    # The planner counts the embedding's gradient whole beside its shard under TP: DTensor
    # computes it so on every rank, the whole vocabulary, before the trainer reshards it.
    assert list(results["arrived"]) == [TINY.vocab * TINY.hidden]
