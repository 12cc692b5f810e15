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

Writing is the inverse and as generic: :func:`write_section` turns any dataclass into its
CRD-shaped JSON (the job document, the operator's status, the plan's reports), and
:func:`view_of` fills a report's dataclass from the object it reports on.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
import typing
from collections.abc import Mapping
from datetime import UTC, datetime
from enum import Enum
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


@functools.cache
def crd_key_of(field: dataclasses.Field[Any]) -> str:
    """The CRD key a dataclass field reads: its ``key`` metadata or its name in camelCase
    (once per field: every read and write of a spec, a plan or a status asks again)."""
    key = field.metadata.get("key")
    if key:
        return str(key)
    first, *rest = field.name.split("_")
    return first + "".join(part.capitalize() for part in rest)


HINTS: dict[type, dict[str, Any]] = {}
"""Each dataclass's resolved annotations (:func:`type_hints`)."""


def type_hints(cls: type) -> dict[str, Any]:
    """``cls``'s resolved annotations, once per class: resolving the string annotations again
    was a fifth of the operator's event-loop time in a launch of 200 jobs (each status write
    reads the plan's report through :func:`view_of`)."""
    hints = HINTS.get(cls)
    if hints is None:
        hints = HINTS[cls] = typing.get_type_hints(cls)
    return hints


def read_section(cls: type[T], data: Mapping[str, Any], **derived: Any) -> T:
    """An instance of dataclass ``cls`` from the defaulted CRD section ``data``."""
    hints = type_hints(cls)
    values: dict[str, Any] = dict(derived)
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]
        if field.metadata.get("derived"):
            continue
        values[field.name] = _value(hints[field.name], data.get(crd_key_of(field)))
    return cls(**values)


def _value(hint: Any, raw: Any) -> Any:
    kind, section = _reading(hint)
    if kind == "section":
        return read_section(section, raw or {})
    if kind == "optional":
        return None if raw is None else read_section(section, raw)
    if kind == "float" and isinstance(raw, int):
        return float(raw)  # the schema's "number" also admits 1
    if kind == "floats" and raw is not None:
        return [float(item) for item in raw]
    if kind == "sections":
        return None if raw is None else [read_section(section, entry) for entry in raw]
    if raw is None or isinstance(raw, str | int | float):
        return raw
    return copy.deepcopy(raw)


@functools.cache
def _reading(hint: Any) -> tuple[str, Any]:
    """How :func:`_value` reads a field of type ``hint``, worked out once per type: a section,
    an optional one, a number, a list of numbers, a list of sections or a plain value."""
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return "section", hint
    section = optional_section(hint)
    if section is not None:
        return "optional", section
    if hint is float:
        return "float", None
    if typing.get_origin(hint) is list and typing.get_args(hint) == (float,):
        return "floats", None
    item = list_section(hint)
    if item is not None:
        return "sections", item
    return "plain", None


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


def write_section(value: Any, *, nulls: bool = False) -> Any:
    """The JSON of a dataclass: each field under its CRD key (:func:`crd_key_of`), nested
    sections written alike; the one writer of the job document, ``status`` and the plan's
    reports, so the inverse of :func:`read_section`.

    Field metadata: ``derived`` fields are left out, an ``inline`` section's keys are merged
    into its parent's, ``digits`` rounds a number (or a mapping's numbers). Unset (None) fields
    are left out, or written as null with ``nulls`` (a status merge patch, where null removes
    the key, or a report that shows it). Enums are written as their values, times as RFC 3339
    in UTC to the second, as the API server writes them."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        written: dict[str, Any] = {}
        for field in dataclasses.fields(value):
            item = getattr(value, field.name)
            if field.metadata.get("derived") or (item is None and not nulls):
                continue
            item = write_section(item, nulls=nulls)
            digits = field.metadata.get("digits")
            if digits is not None:
                item = _rounded(item, digits)
            if field.metadata.get("inline"):
                written.update(item)
            else:
                written[crd_key_of(field)] = item
        return written
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, datetime):
        return format_time(value)
    if isinstance(value, Mapping):
        return {key: write_section(item, nulls=nulls) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [write_section(item, nulls=nulls) for item in value]
    return copy.deepcopy(value)


def format_time(moment: datetime) -> str:
    """RFC 3339 in UTC with a ``Z``, second precision, as the API server writes times."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _rounded(value: Any, digits: int) -> Any:
    if isinstance(value, Mapping):
        return {key: _rounded(item, digits) for key, item in value.items()}
    return round(value, digits) if isinstance(value, float) else value


def view_of(cls: type[T], source: object) -> T:
    """An instance of dataclass ``cls`` (a report: the keys another reader sees) filled from
    ``source``'s attributes: each field from the attribute of its name, or from its ``source``
    metadata, a dotted attribute path or a function of ``source``; a method found is called. A
    field whose type is a dataclass that the value is not an instance of is filled from that
    value alike, and so is each entry of a list of them."""
    hints = type_hints(cls)
    values: dict[str, Any] = {}
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]
        values[field.name] = _as(hints[field.name], _attribute(source, field))
    return cls(**values)


def _attribute(source: object, field: dataclasses.Field[Any]) -> Any:
    path = field.metadata.get("source", field.name)
    if callable(path):
        return path(source)
    value: Any = source
    for name in str(path).split("."):
        value = getattr(value, name)
    return value() if inspect.ismethod(value) else value


def _as(hint: Any, value: Any) -> Any:
    section = hint if isinstance(hint, type) and dataclasses.is_dataclass(hint) else None
    section = section or optional_section(hint)
    if section is not None and value is not None and not isinstance(value, section):
        return view_of(section, value)
    item = list_section(hint)
    if item is not None and value is not None:
        return [entry if isinstance(entry, item) else view_of(item, entry) for entry in value]
    return value
