"""Meta-device build and materialization: per-(seed, name) values, stages, tied heads, buffers."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from meshrun_trainer.models.llama import Transformer, build_model, rotary_tables
from meshrun_trainer.models.materialize import (
    SeededInit,
    canonical_name,
    materialize,
    parameter_targets,
)

from meshrun.api.presets import PRESETS

pytestmark = pytest.mark.unit

TINY = PRESETS["tiny"]


def test_values_depend_only_on_seed_and_name() -> None:
    source = SeededInit(5)
    shape = torch.Size([8, 4])
    first = source.full_tensor("layers.0.attention.wq.weight", shape)
    assert torch.equal(first, SeededInit(5).full_tensor("layers.0.attention.wq.weight", shape))
    assert not torch.equal(first, source.full_tensor("layers.1.attention.wq.weight", shape))
    assert not torch.equal(first, SeededInit(6).full_tensor("layers.0.attention.wq.weight", shape))
    assert abs(first.std().item() - 0.02) < 0.01
    assert torch.equal(source.full_tensor("norm.weight", torch.Size([4])), torch.ones(4))
    assert torch.equal(
        source.full_tensor("layers.0.attention.wq.bias", torch.Size([4])), torch.zeros(4)
    )


def test_a_stage_holds_exactly_the_full_models_values_for_its_names() -> None:
    full = dict(build_model(TINY, 3).named_parameters())
    stage = build_model(TINY, 3, (2, 3))
    names = [name for name, _ in stage.named_parameters()]
    assert "tok_embeddings.weight" not in names and "layers.0.attention.wq.weight" not in names
    for name, param in stage.named_parameters():
        assert torch.equal(param, full[name]), name


def test_materialize_allocates_fills_and_recomputes_buffers() -> None:
    with torch.device("meta"):
        model = Transformer(TINY)
    model.keep_layers(0, 1)
    assert all(p.is_meta for p in model.parameters())
    materialize([model], torch.device("cpu"), SeededInit(0))
    assert not any(p.is_meta for p in model.parameters())
    cos, sin = rotary_tables(TINY)
    assert torch.equal(model.get_buffer("rope_cos"), cos)
    assert torch.equal(model.get_buffer("rope_sin"), sin)


def test_tied_head_stays_shared_and_a_lone_head_starts_as_the_embedding() -> None:
    tied = dataclasses.replace(TINY, tie_embeddings=True)
    model = build_model(tied, 1)
    assert model.output is not None and model.tok_embeddings is not None
    assert model.output.weight is model.tok_embeddings.weight
    last = build_model(tied, 1, (2, 3))
    assert last.output is not None
    assert torch.equal(last.output.weight, model.tok_embeddings.weight)


def test_wrapper_prefixes_are_not_part_of_names() -> None:
    assert canonical_name("module.layers.0._orig_mod.attention.wq.weight") == (
        "layers.0.attention.wq.weight"
    )
    model = build_model(TINY, 0, (0, 0))
    assert set(parameter_targets([model])) == {n for n, _ in model.named_parameters()}
