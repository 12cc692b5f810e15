"""config.json to a model shape: exact parameter counts against transformers (meta device) and the
published figures, the architecture features, and refusals naming what is wrong."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

from meshrun.api.errors import SpecError
from meshrun.api.modelsource import mlp_of_config
from meshrun.api.read import read_spec
from meshrun.files.hf import expected_shapes, load_hf_model, shape_from_config

pytestmark = pytest.mark.unit

LLAMA2_7B = dict(
    model_type="llama",
    hidden_size=4096,
    intermediate_size=11008,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=32,
    vocab_size=32000,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
)
LLAMA3_8B = dict(
    model_type="llama",
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    vocab_size=128256,
    rms_norm_eps=1e-5,
    rope_theta=500000.0,
    max_position_embeddings=131072,
    rope_scaling={
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
)
QWEN25_05B = dict(
    model_type="qwen2",
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    vocab_size=151936,
    rms_norm_eps=1e-6,
    rope_theta=1000000.0,
    tie_word_embeddings=True,
)
MISTRAL_7B = dict(
    model_type="mistral",
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    vocab_size=32000,
    sliding_window=4096,
    rope_theta=10000.0,
)


def _written(config: dict[str, Any], folder: Path) -> dict[str, Any]:
    """config.json exactly as transformers writes it for these values."""
    values = dict(config)
    kind = values.pop("model_type")
    transformers.AutoConfig.for_model(kind, **values).save_pretrained(folder)
    written: dict[str, Any] = json.loads((folder / "config.json").read_text())
    return written


def _transformers_count(config: dict[str, Any]) -> int:
    values = dict(config)
    built = transformers.AutoConfig.for_model(values.pop("model_type"), **values)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(built)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(
    ("config", "published"),
    [
        (LLAMA2_7B, 6_738_415_616),
        (LLAMA3_8B, 8_030_261_248),
        (QWEN25_05B, 494_032_768),
        (MISTRAL_7B, None),
    ],
    ids=["llama-2-7b", "llama-3-8b", "qwen2.5-0.5b", "mistral-7b"],
)
def test_parameter_count_is_exact(
    config: dict[str, Any], published: int | None, tmp_path: Path
) -> None:
    shape = shape_from_config(_written(config, tmp_path), seq_len=4096)
    assert shape.parameters() == _transformers_count(config)
    if published is not None:
        assert shape.parameters() == published
    assert sum(torch.Size(s).numel() for s in expected_shapes(shape).values()) == shape.parameters()


PYTHIA_1_4B = dict(
    model_type="gpt_neox",
    hidden_size=2048,
    intermediate_size=8192,
    num_hidden_layers=24,
    num_attention_heads=16,
    vocab_size=50304,
    hidden_act="gelu",
)
GPT2_124M = dict(model_type="gpt2", n_embd=768, n_layer=12, n_head=12, vocab_size=50257)
FALCON_7B = dict(
    model_type="falcon",
    hidden_size=4544,
    num_hidden_layers=32,
    num_attention_heads=71,
    vocab_size=65024,
    multi_query=True,
    parallel_attn=True,
    bias=False,
)
PHI_2 = dict(
    model_type="phi",
    hidden_size=2560,
    intermediate_size=10240,
    num_hidden_layers=32,
    num_attention_heads=32,
    vocab_size=51200,
    hidden_act="gelu_new",
)
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


@pytest.mark.parametrize(
    ("config", "published", "kv_heads", "tied"),
    [
        (PYTHIA_1_4B, 1_414_647_808, 16, False),
        (GPT2_124M, 124_439_808, 12, True),
        (FALCON_7B, 6_921_720_704, 1, True),
        (PHI_2, 2_779_683_840, 32, False),
    ],
    ids=["pythia-1.4b", "gpt2", "falcon-7b", "phi-2"],
)
def test_gelu_families_are_read_as_a_two_matrix_mlp(
    config: dict[str, Any], published: int, kv_heads: int, tied: bool, tmp_path: Path
) -> None:
    """A GeLU family's config.json gives mlp gelu and sizes whose weight matrices are exactly
    transformers' (its MLP two h x f matrices, Falcon's multi-query keys and values, the tied
    head once), GPT-2's learned positions aside; the rest of the published count is the
    family's biases and LayerNorm biases, which the trainer's block lacks."""
    written = _written(config, tmp_path)
    assert mlp_of_config(written, "spec.model.hf.path") == "gelu"
    shape = shape_from_config(written, seq_len=2048)
    assert (shape.mlp, shape.kv_heads, shape.tie_embeddings) == ("gelu", kv_heads, tied)
    values = dict(config)
    built = transformers.AutoConfig.for_model(values.pop("model_type"), **values)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(built)
    assert sum(p.numel() for p in model.parameters()) == published
    matrices = {n: p.numel() for n, p in model.named_parameters() if p.dim() == 2}
    positions = matrices.pop("transformer.wpe.weight", 0)  # GPT-2's learned positions
    norms = (2 * shape.layers + 1) * shape.hidden
    assert sum(matrices.values()) == shape.parameters() - norms
    assert positions == (1024 * 768 if config is GPT2_124M else 0)
    # the same sizes given in spec.model with mlp gelu plan the same shape
    sizes = {"layers": shape.layers, "hidden": shape.hidden, "heads": shape.heads}
    sizes |= {"vocab": shape.vocab, "ffnHidden": shape.ffn_hidden, "kvHeads": kv_heads}
    job = {"image": "t", "resources": {"accelerator": "cpu"}}
    given = read_spec({**job, "model": {**sizes, "seqLen": 2048, "mlp": "gelu"}}).shape
    assert given.layer_parameters() == shape.layer_parameters()


def test_gelu_weights_are_refused_and_its_shape_trains_from_random(tmp_path: Path) -> None:
    _written(PYTHIA_1_4B, tmp_path)
    assert load_hf_model(tmp_path, 2048).shape.mlp == "gelu"
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(SpecError, match="gpt_neox weights, which the trainer does not load"):
        load_hf_model(tmp_path, 2048)


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


def test_architecture_features_are_read(tmp_path: Path) -> None:
    llama3 = shape_from_config(_written(LLAMA3_8B, tmp_path), seq_len=8192)
    assert (llama3.kv_heads, llama3.rope_theta, llama3.tie_embeddings) == (8, 500000.0, False)
    assert llama3.rope_scaling is not None and llama3.rope_scaling.factor == 8.0
    assert llama3.rope_scaling.original_max_position == 8192
    qwen = shape_from_config(_written(QWEN25_05B, tmp_path), seq_len=1024)
    assert qwen.tie_embeddings and qwen.qkv_bias and not qwen.output_bias
    assert (qwen.norm_eps, qwen.architecture, qwen.head_dim) == (1e-6, "qwen2", 64)
    assert "lm_head.weight" not in expected_shapes(qwen)
    # Legacy (transformers 4) spelling: top-level rope_theta / rope_scaling.
    legacy = {k: v for k, v in LLAMA3_8B.items()} | {"hidden_act": "silu"}
    same = shape_from_config(legacy, seq_len=8192)
    assert same.rope_scaling == llama3.rope_scaling and same.rope_theta == llama3.rope_theta


def test_explicit_head_dim(tmp_path: Path) -> None:
    config = dict(LLAMA2_7B, head_dim=64, num_attention_heads=16, num_key_value_heads=4)
    shape = shape_from_config(_written(config, tmp_path), seq_len=128)
    assert shape.head_dim == 64 and shape.heads * shape.head_dim != shape.hidden
    assert shape.parameters() == _transformers_count(config)


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"model_type": "t5", "architectures": ["T5ForConditionalGeneration"]}, "T5ForCond"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "'yarn' is not supported"),
        ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
        ({"num_hidden_layers": 0}, "num_hidden_layers must be a positive integer"),
    ],
)
def test_unsupported_is_refused_by_name(change: dict[str, Any], words: str) -> None:
    config = dict(LLAMA2_7B, hidden_act="silu") | change
    with pytest.raises(SpecError, match=words) as caught:
        shape_from_config(config, seq_len=128)
    assert caught.value.field == "spec.model.hf.path"


def test_sliding_window_shorter_than_the_window_is_refused(tmp_path: Path) -> None:
    written = _written(MISTRAL_7B, tmp_path)
    assert shape_from_config(written, seq_len=4096).architecture == "mistral"
    with pytest.raises(SpecError, match="sliding_window 4096") as caught:
        shape_from_config(written, seq_len=8192)
    assert caught.value.field == "spec.model.seqLen"


def test_folder_errors(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="is not a directory"):
        load_hf_model(tmp_path / "absent", 16)
    with pytest.raises(SpecError, match=r"config\.json does not exist"):
        load_hf_model(tmp_path, 16)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(SpecError, match="not readable JSON"):
        load_hf_model(tmp_path, 16)
