"""The trainer's cross-entropy equals torch's on whole and on vocabulary-sharded logits (two
real gloo ranks), in one slice or many, with padding (ignored targets) left out, and keeps only
the logits and a few numbers per row for backward (torch's keeps fp32 log-probabilities: twice
the bf16 logits)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from meshrun_trainer.models import loss as trainer_loss
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor
from trainer_launch import gloo_ranks

from meshrun.planner import memory

pytestmark = [pytest.mark.trainer, pytest.mark.timeout(300)]

TP = 2
ROWS, SEQUENCE, VOCAB = 3, 10, 64
PER_ROW_SAVED = 8 + 1 + 4 + 4
"""Bytes the loss keeps per row beside the logits: the target's index, whether this rank holds
it, the share of the row's exponentials it holds, and the row's weight in the mean."""


def _case(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logits, targets, torch's loss, torch's gradient of the logits)."""
    generator = torch.Generator().manual_seed(3)
    logits = (torch.randn(ROWS, SEQUENCE, VOCAB, generator=generator) * 4).to(dtype)
    targets = torch.randint(0, VOCAB, (ROWS, SEQUENCE), generator=generator)
    targets[-1, SEQUENCE // 2 :] = trainer_loss.IGNORE  # a padded row, as validation pads
    reference = logits.clone().requires_grad_()
    loss = F.cross_entropy(reference.float().flatten(0, 1), targets.flatten(0, 1))
    (loss * 3).backward()
    assert reference.grad is not None
    return logits, targets, loss.detach(), reference.grad


def _errors(make: Any, dtype: torch.dtype) -> tuple[float, float]:
    """(loss error, largest gradient error) of the trainer's loss on ``make(logits)``."""
    logits, targets, want, want_grad = _case(dtype)
    given = make(logits.clone().requires_grad_())
    got = trainer_loss.cross_entropy(given, targets)
    (got * 3).backward()
    grad = given.grad.full_tensor() if isinstance(given, DTensor) else given.grad
    return abs(float(got.detach() - want)), float((grad.float() - want_grad.float()).abs().max())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("slice_elements", [memory.LOSS_SLICE_ELEMENTS, 2 * VOCAB + 1])
def test_the_loss_is_torchs_on_whole_logits(
    dtype: torch.dtype, slice_elements: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(memory, "LOSS_SLICE_ELEMENTS", slice_elements)
    loss_error, grad_error = _errors(lambda logits: logits, dtype)
    assert loss_error < 1e-5 and grad_error < 1e-6


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_loss_keeps_the_logits_and_a_few_numbers_a_row(dtype: torch.dtype) -> None:
    logits, targets, _, _ = _case(dtype)
    logits.requires_grad_()
    saved: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        trainer_loss.cross_entropy(logits, targets)
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in saved}
    rows = ROWS * SEQUENCE
    assert sum(storages.values()) == logits.numel() * logits.element_size() + rows * PER_ROW_SAVED


def _rank(rank: int, results: dict[str, Any]) -> None:
    mesh = init_device_mesh("cpu", (TP,), mesh_dim_names=("tp",))
    one_slice = memory.LOSS_SLICE_ELEMENTS
    for dtype in (torch.float32, torch.bfloat16):
        for slice_elements in (one_slice, VOCAB // TP + 1):
            memory.LOSS_SLICE_ELEMENTS = slice_elements
            errors = _errors(lambda logits: distribute_tensor(logits, mesh, [Shard(-1)]), dtype)
            key = f"{dtype}-{slice_elements}"
            results[f"{key}-{rank}"] = max(errors)


def test_the_loss_is_torchs_on_vocabulary_sharded_logits() -> None:
    """Each rank holds half of every row's logits; the loss and the gradient of the whole
    logits are torch's on the whole logits, however the rows are sliced."""
    errors = gloo_ranks(_rank, TP)
    assert len(errors) == 2 * 2 * TP
    assert all(error < 1e-5 for error in errors.values()), errors
