"""The model: shapes, parameter count matching the presets, and pipeline stages composing."""

from __future__ import annotations

import pytest
import torch
from meshrun_trainer.models.llama import build_model
from meshrun_trainer.models.loss import cross_entropy

from meshrun.api.presets import PRESETS

pytestmark = pytest.mark.unit

TINY = PRESETS["tiny"]


def test_parameter_count_matches_the_planner_formula() -> None:
    model = build_model(TINY, seed=0)
    assert sum(p.numel() for p in model.parameters()) == TINY.parameters()


def test_logits_shape_and_initial_loss_near_uniform() -> None:
    model = build_model(TINY, seed=0)
    tokens = torch.randint(0, TINY.vocab, (2, TINY.seq_len))
    logits = model(tokens)
    assert logits.shape == (2, TINY.seq_len, TINY.vocab)
    loss = cross_entropy(logits, tokens)
    assert abs(loss.item() - torch.log(torch.tensor(TINY.vocab)).item()) < 0.1


def test_same_seed_same_weights_different_seed_different_weights() -> None:
    a, b, c = build_model(TINY, 3), build_model(TINY, 3), build_model(TINY, 4)
    for (name, pa), pb, pc in zip(
        a.named_parameters(), b.parameters(), c.parameters(), strict=True
    ):
        assert torch.equal(pa, pb), name
        if "norm" not in name:
            assert not torch.equal(pa, pc), name


def test_pipeline_stages_compose_to_the_full_model() -> None:
    full = build_model(TINY, 1)
    first, second = build_model(TINY, 1, (0, 1)), build_model(TINY, 1, (2, 3))
    assert first.output is None and second.tok_embeddings is None
    assert sorted(first.layers) == ["0", "1"] and sorted(second.layers) == ["2", "3"]
    names = {n for n, _ in first.named_parameters()} | {n for n, _ in second.named_parameters()}
    assert names == {n for n, _ in full.named_parameters()}, "stages keep the full model's names"
    tokens = torch.randint(0, TINY.vocab, (2, TINY.seq_len))
    assert torch.allclose(second(first(tokens)), full(tokens), atol=1e-6)


def test_attention_is_causal() -> None:
    model = build_model(TINY, 2)
    tokens = torch.randint(0, TINY.vocab, (1, TINY.seq_len))
    changed = tokens.clone()
    changed[0, -1] = (changed[0, -1] + 1) % TINY.vocab
    assert torch.allclose(model(tokens)[0, :-1], model(changed)[0, :-1], atol=1e-6)


def test_bf16_autocast_runs() -> None:
    model = build_model(TINY, 0, bf16=True)
    out = model(torch.randint(0, TINY.vocab, (1, 8)))
    assert out.dtype == torch.bfloat16
