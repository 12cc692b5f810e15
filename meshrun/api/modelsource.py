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
from meshrun.api.presets import PRESETS, REQUIRED_SIZES, SIZES, ModelShape, sizes_of
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
        derived = {"ffn_hidden": default_ffn_hidden(model.hidden), "kv_heads": model.heads}
        base = ModelShape(**{**given, **derived})  # type: ignore[arg-type]
    overrides: dict[str, Any] = {name: value for name, value in given.items() if value is not None}
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


def default_ffn_hidden(hidden: int) -> int:
    """SwiGLU width 2/3 x 4h rounded up to a multiple of 256, as Llama does (Touvron 2023)."""
    return -(-(8 * hidden // 3) // 256) * 256


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
    shape = ModelShape(**sizes_of(model))  # type: ignore[arg-type]  # every size is given
    if model.moe is not None:
        shape = dataclasses.replace(shape, moe=resolve_moe(model.moe, shape.ffn_hidden))
    return shape
