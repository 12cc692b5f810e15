"""Where a job's model shape comes from: a preset (explicit sizes overriding it), every explicit
size, or a Hugging Face folder's config.json; and the rules of ``spec.model`` that say so.

The reader (:func:`meshrun.api.read.read_spec`) resolves the shape as it reads the spec, so these
rules are checked there, before any other; they are CEL rules of the CRD too (the message word
for word) and part of :data:`meshrun.rules.strategy.ALL_RULES` through
:data:`meshrun.rules.files.FILE_RULES`. Pure: config.json is read by :mod:`meshrun.files`
where the folder is visible and handed in as ``folder_shape``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from meshrun.api.errors import Rule, SpecError
from meshrun.api.moe import resolve_moe
from meshrun.api.presets import PRESETS, REQUIRED_SIZES, SIZES, Mlp, ModelShape, sizes_of
from meshrun.api.spec import Model

MODEL = "spec.model"
MODEL_SOURCE = Rule(
    MODEL, f"{MODEL} needs a preset, hf, or all of layers, hidden, heads, vocab and seqLen"
)
HF_PRESET = Rule(
    f"{MODEL}.hf", f"{MODEL}.hf and {MODEL}.preset exclude each other (config.json gives the shape)"
)
HF_SEQ_LEN = Rule(f"{MODEL}.seqLen", f"{MODEL}.hf needs {MODEL}.seqLen (the training window)")
MODEL_RULES = (MODEL_SOURCE, HF_PRESET, HF_SEQ_LEN)
"""The rules of this module."""

HF_SIZES = {name: key for name, key in SIZES.items() if name != "seq_len"}
"""ModelShape field -> spec.model key of the sizes given beside hf (config.json's; seqLen is
the training window, the job's own)."""


def check_sizes(shape: ModelShape, given: dict[str, int | None]) -> None:
    """Sizes given beside ``spec.model.hf`` (or planned from them) agree with config.json."""
    for name, value in given.items():
        if value is not None and getattr(shape, name) != value:
            raise SpecError(
                f"spec.model.{HF_SIZES[name]}",
                f"{value}, but config.json in spec.model.hf.path gives {getattr(shape, name)}",
            )


def check_mlp(shape: ModelShape, mlp: Mlp) -> None:
    """``spec.model.mlp`` (or the planned one) is the MLP config.json's family has."""
    if shape.mlp != mlp:
        raise SpecError(
            f"{MODEL}.mlp",
            f"{mlp}, but config.json in spec.model.hf.path describes {shape.mlp} "
            f"({shape.architecture}): write mlp: {shape.mlp} beside hf",
        )


def resolve_model(model: Model, folder_shape: ModelShape | None = None) -> ModelShape:
    """The model shape: a Hugging Face folder's (:func:`hf_shape`), a preset with any explicit
    size overriding it, or explicit sizes."""
    if model.hf is not None:
        return hf_shape(model, folder_shape)
    given = sizes_of(model)
    if model.preset is not None:
        base = PRESETS[model.preset]
    else:
        missing = [SIZES[name] for name in REQUIRED_SIZES if given[name] is None]
        if missing:
            raise MODEL_SOURCE.error(f"missing {', '.join(missing)}")
        assert model.hidden and model.heads
        derived = {
            "ffn_hidden": default_ffn_hidden(model.hidden, model.mlp),
            "kv_heads": model.heads,
        }
        base = ModelShape(**{**given, **derived})  # type: ignore[arg-type]
    overrides: dict[str, Any] = {name: value for name, value in given.items() if value is not None}
    overrides["mlp"] = model.mlp
    shape = dataclasses.replace(base, **overrides)
    if model.preset is None and model.kv_heads is None:
        shape = dataclasses.replace(shape, kv_heads=shape.heads)
    if model.moe is not None:
        shape = dataclasses.replace(shape, moe=resolve_moe(model.moe, shape.ffn_hidden))
    return shape


def check_moe(shape: ModelShape, model: Model) -> ModelShape:
    """``spec.model.moe`` given beside hf agrees with config.json's mixture of experts; the
    training choices (the balancing) are the spec's."""
    if model.moe is None:
        return shape
    folder = shape.moe
    if folder is None:
        raise SpecError(f"{MODEL}.moe", "is given, but config.json describes a dense model")
    given = resolve_moe(model.moe, folder.expert_ffn_hidden)
    checked = ("experts", "experts_per_token", "expert_ffn_hidden", "first_dense_layers", "router")
    for name in checked:
        if getattr(given, name) != getattr(folder, name):
            key = "".join(w.capitalize() if i else w for i, w in enumerate(name.split("_")))
            raise SpecError(
                f"{MODEL}.moe.{key}",
                f"{getattr(given, name)}, but config.json in spec.model.hf.path gives "
                f"{getattr(folder, name)}",
            )
    trained = dataclasses.replace(
        folder,
        aux_loss_coefficient=given.aux_loss_coefficient,
        bias_balancing=given.bias_balancing,
    )
    return dataclasses.replace(shape, moe=trained)


def default_ffn_hidden(hidden: int, mlp: Mlp = "swiglu") -> int:
    """SwiGLU width 2/3 x 4h rounded up to a multiple of 256, as Llama does (Touvron 2023); a
    GeLU MLP's 4h, as GPT-2/3 and GPT-NeoX have it."""
    if mlp == "gelu":
        return 4 * hidden
    return -(-(8 * hidden // 3) // 256) * 256


GELU_FAMILIES = ("gpt2", "gpt_neox", "falcon", "mpt", "bloom", "phi", "gptj", "gpt_bigcode")
"""Hugging Face ``model_type`` values whose blocks have the two-matrix GeLU MLP (an up and a
down projection): GPT-2 (and GPT-3's design), GPT-NeoX (Pythia), Falcon, MPT, BLOOM, Phi (1, 1.5
and 2), GPT-J and StarCoder's GPTBigCode."""
SWIGLU_FAMILIES = ("llama", "mistral", "qwen2", "mixtral", "qwen2_moe")
"""Those with the SiLU-gated three-matrix MLP."""
GELU_ACTIVATIONS = ("gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh", "gelu_python")
"""transformers' names of the GeLU (exact or its tanh approximation)."""


def mlp_of_config(config: dict[str, Any], field: str) -> Mlp:
    """The MLP a Hugging Face config.json describes: its family's (``model_type``), checked
    against ``hidden_act`` (``activation_function`` in GPT-2's config) where it names one.
    MPT and Falcon write no activation (theirs is GeLU); BLOOM's ``bloom_gelu`` is GeLU's tanh
    approximation."""
    kind = config.get("model_type")
    activation = config.get("hidden_act", config.get("activation_function"))
    if kind in SWIGLU_FAMILIES:
        if activation not in (None, "silu"):
            why = f"hidden_act {activation!r} is not supported for {kind} (SwiGLU uses silu)"
            raise SpecError(field, f"config.json: {why}")
        return "swiglu"
    if kind in GELU_FAMILIES:
        if activation not in (None, *GELU_ACTIVATIONS):
            why = f"{kind} with activation {activation!r} is not a GeLU MLP"
            raise SpecError(field, f"config.json: {why} ({', '.join(GELU_ACTIVATIONS)})")
        return "gelu"
    known = f"swiglu: {', '.join(SWIGLU_FAMILIES)}; gelu: {', '.join(GELU_FAMILIES)}"
    raise SpecError(field, f"config.json: model_type {kind!r} names no known MLP ({known})")


def hf_shape(model: Model, folder_shape: ModelShape | None) -> ModelShape:
    """The shape a job with ``spec.model.hf`` is planned with: its config.json's where it was
    read (``folder_shape``; sizes given beside hf must agree), else the sizes given beside hf."""
    assert model.hf is not None
    if model.preset is not None:
        raise HF_PRESET.error(f"preset {model.preset}")
    if model.seq_len is None:
        raise HF_SEQ_LEN.error()
    given = {name: getattr(model, name) for name in HF_SIZES}
    if folder_shape is not None:
        check_sizes(folder_shape, given)
        check_mlp(folder_shape, model.mlp)
        return dataclasses.replace(check_moe(folder_shape, model), seq_len=model.seq_len)
    missing = [key for name, key in HF_SIZES.items() if given[name] is None]
    if missing:
        raise SpecError(
            "spec.model.hf.path",
            f"{model.hf.path} is not read where the job is planned (the operator never opens a "
            "job's files; meshrun plan reads the folder when it is visible, with --mount for a "
            "volume's path). A job whose folder is on a volume is planned from the sizes given "
            "beside hf (the trainer checks them against config.json): spec.model needs "
            f"{', '.join(missing)} too",
        )
    shape = ModelShape(**sizes_of(model), mlp=model.mlp)  # type: ignore[arg-type]  # all given
    if model.moe is not None:
        shape = dataclasses.replace(shape, moe=resolve_moe(model.moe, shape.ffn_hidden))
    return shape
