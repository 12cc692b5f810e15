"""Activation checkpointing per block: what each mode keeps, against the planner's accounting."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from activations_held import held_after_forward
from meshrun_trainer.distributed.blocks import apply_activation_checkpointing
from meshrun_trainer.models.llama import build_model

from meshrun.api.presets import PRESETS, ModelShape
from meshrun.planner.memory import layer_activation_elements

pytestmark = pytest.mark.unit

TINY = PRESETS["tiny"]
GQA = dataclasses.replace(TINY, kv_heads=2)
ROWS = 2


def _run(shape: ModelShape, mode: str) -> tuple[int, dict[str, torch.Tensor]]:
    """(activation bytes held after forward, gradients) of one fp32 step on the CPU."""
    model = build_model(shape, 0)
    apply_activation_checkpointing(list(model.layers.values()), mode)
    tokens = torch.randint(0, shape.vocab, (ROWS, shape.seq_len), generator=torch.Generator())
    held = held_after_forward(model, tokens)
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return held, grads


@pytest.mark.parametrize("shape", [TINY, GQA], ids=["mha", "gqa"])
def test_each_mode_keeps_what_the_planner_counts(shape: ModelShape) -> None:
    tokens = ROWS * shape.seq_len
    reference: dict[str, torch.Tensor] = {}
    for mode in ("none", "selective", "full"):
        four, grads = _run(shape, mode)
        two, _ = _run(dataclasses.replace(shape, layers=2), mode)
        per_layer = (four - two) / 2 / tokens / 4  # fp32 elements per token
        assert per_layer == layer_activation_elements(shape, 1, mode), mode
        reference = reference or grads
        for name, grad in grads.items():
            assert torch.allclose(grad, reference[name], atol=1e-6), (mode, name)


def test_unknown_mode_is_refused() -> None:
    model = build_model(TINY, 0)
    with pytest.raises(ValueError, match="activation checkpointing must be one of"):
        apply_activation_checkpointing(list(model.layers.values()), "some")
