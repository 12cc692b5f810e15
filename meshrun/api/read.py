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
from meshrun.api.modelsource import resolve_model
from meshrun.api.presets import ModelShape
from meshrun.api.spec import JobSpec, Model

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
    shape = resolve_model(model, folder_shape)
    return read_section(JobSpec, full, shape=shape)


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
