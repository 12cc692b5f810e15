"""Hugging Face model folders read without torch: ``config.json`` to a :class:`ModelShape`, the
safetensors headers to tensor shapes, and the checks that refuse a folder before any process
starts.

A folder holds ``config.json``, optionally ``*.safetensors`` weights (with
``model.safetensors.index.json`` when sharded) and ``tokenizer.json``. The supported
architectures are the Llama family as transformers defines it: ``llama`` (Llama 2 and 3),
``mistral`` and ``qwen2``; their weights use transformers' key names (:func:`expected_shapes`).
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from meshrun.api.errors import SpecError
from meshrun.api.modelsource import GELU_FAMILIES, mlp_of_config
from meshrun.api.moe import MoeShape
from meshrun.api.presets import ModelShape, RopeScaling
from meshrun.files.bounded import (
    HEADER_CAP,
    TOKENIZER_CAP,
    in_kernel_filesystem,
    is_regular,
    open_regular,
    read_open_bounded,
    read_text_bounded,
)

FIELD = "spec.model.hf.path"
SUPPORTED = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM",
}
"""model_type -> the transformers class that loads it."""
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "generation_config.json",
)
"""Files copied next to exported weights so the folder is complete for transformers."""


def side_file(folder: Path, name: str) -> bytes | None:
    """The bytes of ``folder/name`` for an export to publish: None when absent; SpecError when
    it is not the folder's own file.

    An export publishes what it copies, so a side file that is a link out of the model's folder
    (``generation_config.json -> /proc/self/environ``, or to the pod's service-account token) is
    refused: a link is followed only to a file inside the folder, or inside the ``blobs`` folder
    of the Hugging Face cache repository whose snapshot the folder is (where the hub's own links
    point). The file must be regular and at most TOKENIZER_CAP bytes, and the one opened must be
    the one checked."""
    path = folder / name
    if not os.path.lexists(path):
        return None
    real = Path(os.path.realpath(path))
    home = Path(os.path.realpath(folder))
    homes = [home]
    if home.parent.name == "snapshots":
        homes.append(home.parent.parent / "blobs")
    if not any(real.is_relative_to(h) for h in homes):
        raise SpecError(
            FIELD, f"{path} links to {real}, outside the model's folder: not copied into an export"
        )
    with open_regular(real, FIELD) as handle:
        if not os.path.samestat(os.fstat(handle.fileno()), os.stat(path)):
            raise SpecError(FIELD, f"{path} changed while it was being copied")
        return read_open_bounded(handle, path, FIELD, TOKENIZER_CAP)


@dataclass(frozen=True)
class HFModel:
    """A Hugging Face model folder, read."""

    path: Path
    """The folder."""
    config: dict[str, Any]
    """config.json as written."""
    shape: ModelShape
    """The shape and architecture features, with the training window as ``seq_len``."""
    weights: tuple[Path, ...]
    """The ``*.safetensors`` files (empty: start from random weights)."""
    dtype: str
    """The weights' dtype in config.json (``float32`` when it names none)."""

    @property
    def tokenizer(self) -> Path | None:
        path = self.path / "tokenizer.json"
        return path if is_regular(path) else None


def read_config(folder: str | Path, field: str = FIELD) -> dict[str, Any]:
    path = Path(folder) / "config.json"
    if not path.exists():
        raise SpecError(field, f"{path} does not exist (a Hugging Face folder has config.json)")
    try:
        config = json.loads(read_text_bounded(path, field))
    except (OSError, ValueError) as error:
        raise SpecError(field, f"{path} is not readable JSON: {error}") from None
    if not isinstance(config, dict):
        raise SpecError(field, f"{path} must hold a JSON object")
    return config


def _rope(config: dict[str, Any], field: str) -> tuple[float, RopeScaling | None]:
    # transformers 5 writes rope_parameters {rope_type, rope_theta, ...}; older configs write
    # rope_theta and rope_scaling at the top level.
    params = config.get("rope_parameters") or {}
    scaling = config.get("rope_scaling") or params
    theta = float(params.get("rope_theta", config.get("rope_theta", 10000.0)))
    kind = scaling.get("rope_type", scaling.get("type", "default")) if scaling else "default"
    if kind == "default":
        return theta, None
    if kind != "llama3":
        raise SpecError(field, f"RoPE scaling {kind!r} is not supported (supported: none, llama3)")
    return theta, RopeScaling(
        factor=float(scaling["factor"]),
        low_freq_factor=float(scaling["low_freq_factor"]),
        high_freq_factor=float(scaling["high_freq_factor"]),
        original_max_position=int(scaling["original_max_position_embeddings"]),
    )


def _int(config: dict[str, Any], key: str, field: str) -> int:
    value = config.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise SpecError(field, f"config.json: {key} must be a positive integer, got {value!r}")
    return value


def shape_from_config(config: dict[str, Any], seq_len: int, field: str = FIELD) -> ModelShape:
    """The model shape config.json describes, trained on windows of ``seq_len`` tokens.

    Raises SpecError naming an unsupported architecture or feature.
    """
    kind = config.get("model_type")
    if kind in GELU_FAMILIES:
        return gelu_shape_from_config(config, seq_len, field)
    if kind not in SUPPORTED:
        names = config.get("architectures") or [kind]
        raise SpecError(
            field,
            f"architecture {', '.join(map(str, names))} (model_type {kind!r}) is not supported; "
            f"supported: {', '.join(SUPPORTED.values())}, and the shapes of "
            f"{', '.join(GELU_FAMILIES)} (mlp: gelu, from random weights)",
        )
    mlp = mlp_of_config(config, field)
    if config.get("mlp_bias"):
        raise SpecError(field, "config.json: mlp_bias is not supported")
    window = config.get("sliding_window")
    sliding = kind == "mistral" or config.get("use_sliding_window", False)
    if sliding and isinstance(window, int) and window < seq_len:
        raise SpecError(
            "spec.model.seqLen",
            f"{seq_len} exceeds the model's sliding_window {window}; sliding-window attention "
            "is not supported, so train on windows of at most that many tokens",
        )
    theta, scaling = _rope(config, field)
    heads = _int(config, "num_attention_heads", field)
    hidden = _int(config, "hidden_size", field)
    head_dim = config.get("head_dim") or hidden // heads
    attention_bias = bool(config.get("attention_bias", False))
    return ModelShape(
        layers=_int(config, "num_hidden_layers", field),
        hidden=hidden,
        heads=heads,
        vocab=_int(config, "vocab_size", field),
        seq_len=seq_len,
        ffn_hidden=_int(config, "intermediate_size", field),
        kv_heads=int(config.get("num_key_value_heads") or heads),
        head_size=0 if head_dim * heads == hidden else int(head_dim),
        rope_theta=theta,
        rope_scaling=scaling,
        tie_embeddings=bool(config.get("tie_word_embeddings", False)),
        qkv_bias=kind in ("qwen2", "qwen2_moe") or attention_bias,
        output_bias=attention_bias,
        norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        architecture=kind,
        mlp=mlp,
        moe=moe_from_config(config, field),
    )


GELU_KEYS: dict[str, tuple[str, str, str, str | None]] = {
    "gpt2": ("n_layer", "n_embd", "n_head", "n_inner"),
    "gptj": ("n_layer", "n_embd", "n_head", "n_inner"),
    "gpt_bigcode": ("n_layer", "n_embd", "n_head", "n_inner"),
    "gpt_neox": ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size"),
    "phi": ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size"),
    "falcon": ("num_hidden_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size"),
    "bloom": ("n_layer", "hidden_size", "n_head", None),
    "mpt": ("n_layers", "d_model", "n_heads", None),
}
"""config.json's keys of the layers, hidden size, heads and MLP width (None or unset: 4h, MPT's
``expansion_ratio`` x h) per GeLU family, as transformers' configuration classes write them."""
GELU_TIED = ("gpt2", "gpt_bigcode", "falcon", "bloom", "mpt")
"""Families whose output head is the input embedding unless ``tie_word_embeddings`` says not."""


def gelu_shape_from_config(config: dict[str, Any], seq_len: int, field: str = FIELD) -> ModelShape:
    """The shape of a GeLU family's config.json (GPT-2, GPT-J, GPTBigCode, GPT-NeoX, Phi, Falcon,
    BLOOM, MPT) as the trainer's block has it: its layers, hidden size, heads, key/value heads
    (Falcon's and GPTBigCode's multi-query one, Phi's and Falcon's grouped ones), vocabulary, MLP
    width and tied head, with ``mlp: gelu``. The block is the trainer's (RMSNorm, rotary, no
    biases), so the family's biases, LayerNorm biases and GPT-2's learned positions are not
    counted, and its weights are not loaded (:func:`load_hf_model`)."""
    kind = str(config.get("model_type"))
    mlp = mlp_of_config(config, field)
    layers_key, hidden_key, heads_key, ffn_key = GELU_KEYS[kind]
    hidden = _int(config, hidden_key if hidden_key in config else "hidden_size", field)
    heads = _int(config, heads_key, field)
    width = config.get(ffn_key) if ffn_key else None
    if kind == "mpt":
        width = int(config.get("expansion_ratio", 4) * hidden)
    kv_heads = int(config.get("num_key_value_heads") or heads)
    if kind == "falcon" and config.get("new_decoder_architecture"):
        kv_heads = int(config.get("num_kv_heads") or heads)
    elif kind in ("falcon", "gpt_bigcode") and config.get("multi_query", kind == "falcon"):
        kv_heads = 1
    theta = config.get("rope_theta", config.get("rotary_emb_base", 10000.0))
    return ModelShape(
        layers=_int(config, layers_key, field),
        hidden=hidden,
        heads=heads,
        vocab=_int(config, "vocab_size", field),
        seq_len=seq_len,
        ffn_hidden=int(width) if width else 4 * hidden,
        kv_heads=kv_heads,
        rope_theta=float(theta),
        tie_embeddings=bool(config.get("tie_word_embeddings", kind in GELU_TIED)),
        norm_eps=float(config.get("layer_norm_eps", config.get("layer_norm_epsilon", 1e-5))),
        architecture=kind,
        mlp=mlp,
    )


def moe_from_config(config: dict[str, Any], field: str = FIELD) -> MoeShape | None:
    """The mixture of experts of a Mixtral or Qwen2-MoE config.json, None for a dense model.

    Mixtral: num_local_experts experts of intermediate_size, num_experts_per_tok of them per
    token, renormalized. Qwen2-MoE: num_experts of moe_intermediate_size, a shared expert of
    shared_expert_intermediate_size behind a sigmoid gate, norm_topk_prob; its dense layers
    (mlp_only_layers, decoder_sparse_step) must be the first ones.
    """
    kind = config.get("model_type")
    coefficient = float(config.get("router_aux_loss_coef", 0.01))
    if kind == "mixtral":
        return MoeShape(
            experts=_int(config, "num_local_experts", field),
            experts_per_token=_int(config, "num_experts_per_tok", field),
            expert_ffn_hidden=_int(config, "intermediate_size", field),
            aux_loss_coefficient=coefficient,
        )
    if kind != "qwen2_moe":
        return None
    layers = _int(config, "num_hidden_layers", field)
    step = int(config.get("decoder_sparse_step", 1))
    dense = set(config.get("mlp_only_layers") or [])
    dense |= {i for i in range(layers) if step > 1 and (i + 1) % step}
    first = len(dense)
    if dense != set(range(first)):
        raise SpecError(
            field,
            f"config.json: dense layers {sorted(dense)} (mlp_only_layers, decoder_sparse_step) "
            "are supported only as the first layers",
        )
    shared = int(config.get("shared_expert_intermediate_size") or 0)
    return MoeShape(
        experts=_int(config, "num_experts", field),
        experts_per_token=_int(config, "num_experts_per_tok", field),
        expert_ffn_hidden=_int(config, "moe_intermediate_size", field),
        shared_experts=1 if shared else 0,
        first_dense_layers=first,
        aux_loss_coefficient=coefficient,
        normalize_top_k=bool(config.get("norm_topk_prob", False)),
        shared_ffn_hidden=shared,
        shared_expert_gate=bool(shared),
    )


def expected_shapes(shape: ModelShape) -> dict[str, tuple[int, ...]]:
    """transformers' tensor names and shapes for ``shape`` (lm_head absent when tied)."""
    q, kv, h = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim, shape.hidden
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (shape.vocab, h)}
    for i in range(shape.layers):
        p = f"model.layers.{i}."
        shapes |= {
            p + "self_attn.q_proj.weight": (q, h),
            p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h),
            p + "self_attn.o_proj.weight": (h, q),
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
        }
        shapes |= mlp_shapes(shape, i)
        if shape.qkv_bias:
            shapes |= {p + "self_attn.q_proj.bias": (q,)}
            shapes |= {p + f"self_attn.{n}_proj.bias": (kv,) for n in ("k", "v")}
        if shape.output_bias:
            shapes[p + "self_attn.o_proj.bias"] = (h,)
    shapes["model.norm.weight"] = (h,)
    if not shape.tie_embeddings:
        shapes["lm_head.weight"] = (shape.vocab, h)
    return shapes


MOE_NAMES = {
    "mixtral": ("block_sparse_moe", "experts.{}.w1", "experts.{}.w2", "experts.{}.w3"),
    "qwen2_moe": (
        "mlp",
        "experts.{}.gate_proj",
        "experts.{}.down_proj",
        "experts.{}.up_proj",
    ),
}
"""model_type -> a MoE layer's module and its experts' (SwiGLU w1 gate, w2 down, w3 up) names;
any other architecture with a mixture of experts is written as Mixtral names it."""


def moe_names(shape: ModelShape) -> tuple[str, str, str, str]:
    """(the MoE module, expert j's w1, w2, w3 with ``{}`` for j) for ``shape``'s architecture."""
    return MOE_NAMES.get(shape.architecture, MOE_NAMES["mixtral"])


def mlp_shapes(shape: ModelShape, layer: int) -> dict[str, tuple[int, ...]]:
    """transformers' tensor names and shapes of block ``layer``'s MLP: dense, or a MoE layer's
    router, experts, shared expert and its gate."""
    h, p, moe = shape.hidden, f"model.layers.{layer}.", shape.moe
    if moe is None or not moe.is_moe_layer(layer):
        f = shape.ffn_hidden
        return {
            p + "mlp.gate_proj.weight": (f, h),
            p + "mlp.up_proj.weight": (f, h),
            p + "mlp.down_proj.weight": (h, f),
        }
    module, w1, w2, w3 = moe_names(shape)
    p += module + "."
    f = moe.expert_ffn_hidden
    shapes: dict[str, tuple[int, ...]] = {p + "gate.weight": (moe.experts, h)}
    for j in range(moe.experts):
        shapes |= {
            p + w1.format(j) + ".weight": (f, h),
            p + w2.format(j) + ".weight": (h, f),
            p + w3.format(j) + ".weight": (f, h),
        }
    if moe.shared_width:
        s = moe.shared_width
        shapes |= {
            p + "shared_expert.gate_proj.weight": (s, h),
            p + "shared_expert.up_proj.weight": (s, h),
            p + "shared_expert.down_proj.weight": (h, s),
        }
    if moe.shared_expert_gate:
        shapes[p + "shared_expert_gate.weight"] = (1, h)
    return shapes


def safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of a safetensors file (8-byte little-endian length, then JSON)."""
    with open_regular(path, FIELD) as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        if length > HEADER_CAP:
            raise ValueError(f"its header claims {length} bytes, more than {HEADER_CAP}")
        header: dict[str, Any] = json.loads(handle.read(length))
    header.pop("__metadata__", None)
    return header


def check_weights(model: HFModel, field: str = FIELD) -> None:
    """Every tensor config.json implies is present with its shape; nothing else is there."""
    found: dict[str, tuple[int, ...]] = {}
    for file in model.weights:
        try:
            header = safetensors_header(file)
        except (OSError, ValueError, struct.error) as error:
            raise SpecError(field, f"{file} is not a safetensors file: {error}") from None
        found |= {name: tuple(info["shape"]) for name, info in header.items()}
    expected = expected_shapes(model.shape)
    if model.shape.tie_embeddings:
        found.pop("lm_head.weight", None)  # some tied checkpoints still carry the copy
    for name, want in expected.items():
        if name not in found:
            raise SpecError(field, f"weights lack {name} (config.json implies shape {list(want)})")
        if found[name] != want:
            raise SpecError(
                field,
                f"weight {name} has shape {list(found[name])} but config.json implies {list(want)}",
            )
    extra = sorted(set(found) - set(expected) - {"lm_head.weight"})
    if extra:
        raise SpecError(field, f"weights hold tensors config.json does not describe: {extra[:3]}")


def load_hf_model(folder: str | Path, seq_len: int, field: str = FIELD) -> HFModel:
    """Read and check a Hugging Face folder; SpecError names what is wrong."""
    path = Path(folder)
    if in_kernel_filesystem(path) or not path.is_dir():
        raise SpecError(field, f"{path} is not a directory")
    config = read_config(path, field)
    shape = shape_from_config(config, seq_len, field)
    dtype = str(config.get("dtype") or config.get("torch_dtype") or "float32")
    model = HFModel(path, config, shape, tuple(sorted(path.glob("*.safetensors"))), dtype)
    if model.weights and shape.architecture not in SUPPORTED:
        raise SpecError(
            field,
            f"{path} holds {shape.architecture} weights, which the trainer does not load (its "
            "GeLU block is Llama's with a two-matrix MLP); a folder without *.safetensors trains "
            "its config.json's shape from random weights",
        )
    if model.weights:
        check_weights(model, field)
    return model
