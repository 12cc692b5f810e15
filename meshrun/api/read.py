"""Reading a spec into :class:`meshrun.api.spec.JobSpec`: schema check, CRD defaults, then types.

The reader is generic: each dataclass field is looked up under its CRD key (the camelCase of its
name, or its ``key`` metadata), nested dataclasses are read recursively, and nothing is
defaulted here (the CRD's defaults were applied before). The schema check already refused wrong
types, enums, bounds and unknown keys with the field's name, so reading cannot fail except for
the model, whose sizes need a preset, every explicit size, or a Hugging Face folder's
config.json. Reading is pure: nothing here opens a file. A folder's config.json is read by
:mod:`meshrun.files.checks` where the folder is visible and handed in as ``folder_shape``;
elsewhere (the operator, or a laptop without the volume) the sizes given beside
``spec.model.hf`` are the shape, and the trainer checks them against config.json first thing.
"""

from __future__ import annotations

import copy
import dataclasses
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from meshrun.api.crd import validate_spec, with_defaults
from meshrun.api.errors import SpecError
from meshrun.api.presets import PRESETS, REQUIRED_SIZES, SIZES, ModelShape, sizes_of
from meshrun.api.spec import JobSpec, Model
from meshrun.rules.inputs import HF_PRESET, HF_SEQ_LEN, HF_SIZES, MODEL_SOURCE, check_sizes

T = TypeVar("T")


def read_spec(
    spec: Mapping[str, Any] | JobSpec, *, folder_shape: ModelShape | None = None
) -> JobSpec:
    """Check ``spec`` against the CRD schema, apply the CRD's defaults and read it into types.

    ``folder_shape``: the shape read from ``spec.model.hf``'s config.json by whoever could see
    the folder (sizes given beside hf must agree with it). Raises SpecError naming the first
    offending field. The cross-field rules are checked by
    :func:`meshrun.rules.strategy.check_spec`, which ``meshrun.planner.plan.plan_job`` runs.
    """
    if isinstance(spec, JobSpec):
        return spec
    full = defaulted(spec)
    model = read_section(Model, full["model"])
    # The one value read_spec fills in: an unset microBatchSize is 1 unless auto chooses it
    # (the CRD has no default, so the API server's stored spec still says it was unset).
    training = full.setdefault("training", {})
    given = training.get("microBatchSize") is not None
    training.setdefault("microBatchSize", 1)
    shape = resolve_model(model, folder_shape)
    return read_section(JobSpec, full, shape=shape, micro_batch_size_set=given)


def defaulted(spec: Mapping[str, Any]) -> dict[str, Any]:
    """``spec`` checked against the CRD schema, with the CRD's defaults applied."""
    validate_spec(spec)
    return with_defaults(spec)


def crd_key_of(field: dataclasses.Field[Any]) -> str:
    """The CRD key a dataclass field reads: its ``key`` metadata or its name in camelCase."""
    key = field.metadata.get("key")
    if key:
        return str(key)
    first, *rest = field.name.split("_")
    return first + "".join(part.capitalize() for part in rest)


def read_section(cls: type[T], data: Mapping[str, Any], **derived: Any) -> T:
    """An instance of dataclass ``cls`` from the defaulted CRD section ``data``."""
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = dict(derived)
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]
        if field.metadata.get("derived"):
            continue
        values[field.name] = _value(hints[field.name], data.get(crd_key_of(field)))
    return cls(**values)


def _value(hint: Any, raw: Any) -> Any:
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return read_section(hint, raw or {})
    section = optional_section(hint)
    if section is not None:
        return None if raw is None else read_section(section, raw)
    if hint is float and isinstance(raw, int):
        return float(raw)  # the schema's "number" also admits 1
    if typing.get_origin(hint) is list and typing.get_args(hint) == (float,) and raw is not None:
        return [float(item) for item in raw]
    item = list_section(hint)
    if item is not None:
        return None if raw is None else [read_section(item, entry) for entry in raw]
    return copy.deepcopy(raw)


def optional_section(hint: Any) -> type | None:
    """The dataclass of an optional section (``Data | None``), else None."""
    if typing.get_origin(hint) is list:
        return None
    members = [m for m in typing.get_args(hint) if m is not type(None)]
    if len(members) == 1 and isinstance(members[0], type) and dataclasses.is_dataclass(members[0]):
        return members[0]
    return None


def list_section(hint: Any) -> type | None:
    """The dataclass of a list of sections (``list[Rule] | None``), else None."""
    members = [hint]
    if typing.get_origin(hint) is not list:
        members = [m for m in typing.get_args(hint) if m is not type(None)]
    if len(members) != 1 or typing.get_origin(members[0]) is not list:
        return None
    (item,) = typing.get_args(members[0])
    return item if isinstance(item, type) and dataclasses.is_dataclass(item) else None


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
    return shape


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
        return dataclasses.replace(folder_shape, seq_len=model.seq_len)
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
    return ModelShape(**sizes_of(model))  # type: ignore[arg-type]  # every size is given


def write_section(value: Any) -> Any:
    """The JSON of a dataclass read by :func:`read_section` (its inverse): each field under its
    CRD key, nested sections written alike, unset (None) fields and derived ones left out."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        written: dict[str, Any] = {}
        for field in dataclasses.fields(value):
            item = getattr(value, field.name)
            if item is None or field.metadata.get("derived"):
                continue
            written[crd_key_of(field)] = write_section(item)
        return written
    if isinstance(value, list | tuple):
        return [write_section(item) for item in value]
    return copy.deepcopy(value)
