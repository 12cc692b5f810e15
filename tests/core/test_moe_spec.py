"""spec.model.moe and expert parallelism in the API: the shape read from the spec, the presets
and Mixtral / Qwen2-MoE config.json (parameter counts exact against transformers, active ones
against the published figures), the rules naming their fields, and the layout carrying ep."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

from meshrun.api.errors import SpecError
from meshrun.api.presets import PRESETS
from meshrun.api.read import read_spec
from meshrun.files.hf import expected_shapes, shape_from_config
from meshrun.jobdoc import JobDocument, Pod, read_document, write_document
from meshrun.planner.plan import plan_job

pytestmark = pytest.mark.unit

MIXTRAL_8X7B = dict(
    model_type="mixtral",
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    vocab_size=32000,
    num_local_experts=8,
    num_experts_per_tok=2,
    rope_theta=1e6,
)
QWEN15_MOE_A27B = dict(
    model_type="qwen2_moe",
    hidden_size=2048,
    intermediate_size=5632,
    moe_intermediate_size=1408,
    shared_expert_intermediate_size=5632,
    num_hidden_layers=24,
    num_attention_heads=16,
    num_key_value_heads=16,
    vocab_size=151936,
    num_experts=60,
    num_experts_per_tok=4,
    tie_word_embeddings=False,
)


def _written(config: dict[str, Any], folder: Path) -> dict[str, Any]:
    values = dict(config)
    transformers.AutoConfig.for_model(values.pop("model_type"), **values).save_pretrained(folder)
    written: dict[str, Any] = json.loads((folder / "config.json").read_text())
    return written


def _transformers_count(config: dict[str, Any]) -> int:
    values = dict(config)
    built = transformers.AutoConfig.for_model(values.pop("model_type"), **values)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(built)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(
    ("config", "active"),
    [(MIXTRAL_8X7B, 12.9e9), (QWEN15_MOE_A27B, 2.7e9)],
    ids=["mixtral-8x7b", "qwen1.5-moe-a2.7b"],
)
def test_moe_config_counts(config: dict[str, Any], active: float, tmp_path: Path) -> None:
    shape = shape_from_config(_written(config, tmp_path), seq_len=4096)
    assert shape.moe is not None
    assert shape.parameters() == _transformers_count(config)
    assert sum(torch.Size(s).numel() for s in expected_shapes(shape).values()) == shape.parameters()
    assert shape.parameters(active=True) == pytest.approx(active, rel=0.02)


def test_qwen2_moe_features_and_dense_layers(tmp_path: Path) -> None:
    config = {**QWEN15_MOE_A27B, "mlp_only_layers": [0, 1], "norm_topk_prob": True}
    moe = shape_from_config(_written(config, tmp_path), seq_len=1024).moe
    assert moe is not None
    assert (moe.first_dense_layers, moe.shared_width, moe.shared_expert_gate) == (2, 5632, True)
    assert moe.normalize_top_k and moe.expert_ffn_hidden == 1408
    scattered = {**QWEN15_MOE_A27B, "mlp_only_layers": [3]}
    with pytest.raises(SpecError, match="first layers"):
        shape_from_config(_written(scattered, tmp_path), seq_len=1024)


def test_presets_are_the_published_shapes() -> None:
    large, small = PRESETS["moe-large"], PRESETS["moe-small"]
    assert large.parameters() == 46_702_792_704  # Mixtral 8x7B
    assert large.parameters(active=True) == pytest.approx(12.9e9, rel=0.01)
    assert small.parameters() == pytest.approx(14.3e9, rel=0.01)
    assert small.parameters(active=True) == pytest.approx(2.7e9, rel=0.01)


def _spec(moe: dict[str, Any] | None = None, **strategy: Any) -> dict[str, Any]:
    model: dict[str, Any] = {"preset": "tiny"}
    if moe is not None:
        model["moe"] = moe
    return {
        "image": "x",
        "resources": {"numNodes": 1, "numProcPerNode": 4, "accelerator": "cpu"},
        "strategy": {"type": "hybrid", "pipelineParallel": 1, "tensorParallel": 1, **strategy},
        "model": model,
        "training": {"globalBatchSize": 8, "dataset": "synthetic"},
    }


def test_the_spec_resolves_the_mixture() -> None:
    spec = read_spec(_spec({"experts": 8, "biasBalancing": True, "router": "sigmoid"}))
    moe = spec.shape.moe
    assert moe is not None
    assert (moe.experts, moe.experts_per_token, moe.expert_ffn_hidden) == (8, 2, 192)
    assert (moe.aux_loss_coefficient, moe.router) == (0.0, "sigmoid")  # 0 with biasBalancing
    assert read_spec(_spec({"experts": 8})).shape.moe.aux_loss_coefficient == 0.01  # type: ignore[union-attr]
    assert read_spec(_spec()).shape.moe is None


@pytest.mark.parametrize(
    ("moe", "strategy", "field", "words"),
    [
        (None, {"expertParallel": 2}, "spec.strategy.expertParallel", "needs spec.model.moe"),
        ({"experts": 6}, {"expertParallel": 4}, "spec.strategy.expertParallel", "must divide"),
        ({"experts": 4, "expertsPerToken": 5}, {}, "spec.model.moe.expertsPerToken", "exceed"),
        ({"experts": 4, "firstDenseLayers": 4}, {}, "spec.model.moe.firstDenseLayers", "below"),
        (
            {"experts": 4},
            {"expertTensorParallel": 2},
            "spec.strategy.expertTensorParallel",
            "1 or equal",
        ),
        (
            {"experts": 8},
            {"expertParallel": 8, "dataParallel": 4},
            "spec.strategy.expertParallel",
            "ranks of one pipeline stage",
        ),
    ],
)
def test_rules_name_the_field(
    moe: dict[str, Any] | None, strategy: dict[str, Any], field: str, words: str
) -> None:
    with pytest.raises(SpecError, match=words) as caught:
        plan_job(read_spec(_spec(moe, **strategy)), "moe")
    assert caught.value.field == field


def test_the_layout_carries_ep_through_the_job_document() -> None:
    spec = read_spec(_spec({"experts": 4}, dataParallel=4, expertParallel=2))
    plan = plan_job(spec, "moe")
    assert (plan.layout.ep, plan.layout.etp) == (2, 1)
    assert plan.layout.world_size == 4  # expert parallelism is folded, not added
    assert "(ep2)" in plan.layout.text()
    pod = Pod(
        job_name="moe",
        namespace="",
        index=0,
        attempt=0,
        checkpoint_dir=None,
        checkpoint_keep=0,
        metrics_port=0,
        termination_log="",
    )
    document = read_document(write_document(JobDocument(spec=spec, plan=plan, pod=pod)))
    assert document.plan.layout == plan.layout
    assert document.plan.model.moe == spec.shape.moe
