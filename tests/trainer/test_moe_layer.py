"""The MoE layer in one process: grouped experts against a loop over experts, dropless routing,
the bias steering the choice but not the weights, the auxiliary loss against Switch's formula,
and a mixture not read from a Hugging Face folder exported as a Mixtral transformers runs."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import transformers
from meshrun_trainer.models.hf import export
from meshrun_trainer.models.llama import build_model
from meshrun_trainer.models.moe import MoE, grouped_matmul

from meshrun.api.moe import MoeShape
from meshrun.api.presets import PRESETS

pytestmark = pytest.mark.unit


def _layer(**moe: object) -> MoE:
    shape = dataclasses.replace(
        PRESETS["tiny"],
        moe=MoeShape(**{"experts": 4, "experts_per_token": 2, "expert_ffn_hidden": 32, **moe}),  # type: ignore[arg-type]
    )
    layer = build_model(shape, 3).layers["0"].moe
    assert layer is not None
    return layer


def test_grouped_matmul_equals_a_loop_over_the_groups() -> None:
    generator = torch.Generator().manual_seed(0)
    counts = torch.tensor([3, 0, 5, 1])
    x = torch.randn(9, 8, generator=generator)
    weight = torch.randn(4, 6, 8, generator=generator)
    looped = torch.cat(
        [part @ w.T for part, w in zip(x.split(counts.tolist()), weight, strict=True)]
    )
    torch.testing.assert_close(grouped_matmul(x, weight, counts), looped)


def test_every_token_reaches_its_experts_and_equals_a_loop() -> None:
    layer = _layer(shared_experts=1)
    x = torch.randn(2, 16, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got = layer(x)
        tokens = x.reshape(-1, 64)
        chosen, weights, _ = layer.route(tokens)
        want = layer.shared(tokens) if layer.shared is not None else torch.zeros_like(tokens)
        w1, w2, w3 = layer.experts.w1, layer.experts.w2, layer.experts.w3
        for row in range(tokens.shape[0]):
            for slot in range(2):
                e = int(chosen[row, slot])
                hidden = F.silu(w1[e] @ tokens[row]) * (w3[e] @ tokens[row])
                want[row] += weights[row, slot] * (w2[e] @ hidden)
    torch.testing.assert_close(got.reshape(-1, 64), want, rtol=1e-5, atol=1e-6)
    # Dropless: the loads count every token's k choices.
    assert int(layer.get_buffer("expert_load").sum()) == tokens.shape[0] * 2


def test_the_bias_steers_the_choice_not_the_weights() -> None:
    layer = _layer(router="sigmoid", bias_balancing=True, aux_loss_coefficient=0.0)
    tokens = torch.randn(32, 64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        layer.get_buffer("expert_bias").copy_(torch.tensor([10.0, 10.0, 0.0, 0.0]))
        chosen, weights, scores = layer.route(tokens)
    assert set(chosen.flatten().tolist()) == {0, 1}
    picked = scores.gather(1, chosen)
    torch.testing.assert_close(weights, picked / picked.sum(-1, keepdim=True))
    # After a step the overloaded experts' bias goes down, the idle ones' up.
    with torch.no_grad():
        layer(tokens.view(1, 32, 64))
    layer.update_bias(None)
    bias = layer.get_buffer("expert_bias")
    assert bias[0] < 10 and bias[2] > 0


def test_aux_loss_is_switch_per_sequence() -> None:
    layer = _layer()
    scores = torch.softmax(torch.randn(2 * 8, 4, generator=torch.Generator().manual_seed(3)), -1)
    chosen = scores.topk(2, dim=-1).indices
    got = layer.aux_loss(chosen, scores, batch=2)
    want = []
    for seq in range(2):
        rows = slice(8 * seq, 8 * seq + 8)
        share = F.one_hot(chosen[rows], 4).sum((0, 1)).float() / (8 * 2)
        want.append(4 * (share * scores[rows].mean(0)).sum())
    torch.testing.assert_close(got, torch.stack(want).mean())


def test_a_preset_mixture_exports_as_a_mixtral_transformers_runs(tmp_path: Path) -> None:
    shape = dataclasses.replace(
        PRESETS["tiny"],
        moe=MoeShape(experts=4, experts_per_token=2, expert_ffn_hidden=32),
    )
    model = build_model(shape, 5)
    folder = export([model], tmp_path / "out", shape)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    assert type(loaded).__name__ == "MixtralForCausalLM"
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, model(ids), rtol=1e-4, atol=1e-5)
