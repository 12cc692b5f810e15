"""Reading a spec into :class:`meshrun.spec.JobSpec`: schema check, CRD defaults, then types.

The reader is generic: each dataclass field is looked up under its CRD key (the camelCase of its
name, or its ``key`` metadata), nested dataclasses are read recursively, and nothing is
defaulted here (the CRD's defaults were applied before). The schema check already refused wrong
types, enums, bounds and unknown keys with the field's name, so reading cannot fail except for
the model, whose sizes need a preset or every explicit size.
"""

from __future__ import annotations

import copy
import dataclasses
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from meshrun.api import validate_spec, with_defaults
from meshrun.errors import SpecError
from meshrun.presets import PRESETS, ModelShape
from meshrun.spec import JobSpec, Model

T = TypeVar("T")


def read_spec(spec: Mapping[str, Any] | JobSpec) -> JobSpec:
    """Check ``spec`` against the CRD schema, apply the CRD's defaults and read it into types.

    Raises SpecError naming the first offending field. The cross-field rules are checked by
    :func:`meshrun.rules.check_spec`, which ``meshrun.planner.plan_job`` runs.
    """
    if isinstance(spec, JobSpec):
        return spec
    validate_spec(spec)
    full = with_defaults(spec)
    model = read_section(Model, full["model"])
    return read_section(JobSpec, full, shape=resolve_model(model))


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
    if hint is float and isinstance(raw, int):
        return float(raw)  # the schema's "number" also admits 1
    return copy.deepcopy(raw)


def resolve_model(model: Model) -> ModelShape:
    """The model shape: a preset with any explicit size overriding it, or explicit sizes."""
    if model.preset is not None:
        base = PRESETS[model.preset]
    else:
        given = {
            "layers": model.layers,
            "hidden": model.hidden,
            "heads": model.heads,
            "vocab": model.vocab,
            "seqLen": model.seq_len,
        }
        missing = [name for name, value in given.items() if value is None]
        if missing:
            raise SpecError(
                "spec.model",
                f"needs a preset or all of layers, hidden, heads, vocab and seqLen "
                f"(missing {', '.join(missing)})",
            )
        assert model.layers and model.hidden and model.heads and model.vocab and model.seq_len
        base = ModelShape(
            layers=model.layers,
            hidden=model.hidden,
            heads=model.heads,
            vocab=model.vocab,
            seq_len=model.seq_len,
            ffn_hidden=default_ffn_hidden(model.hidden),
            kv_heads=model.heads,
        )
    overrides: dict[str, Any] = {
        "layers": model.layers,
        "hidden": model.hidden,
        "heads": model.heads,
        "vocab": model.vocab,
        "seq_len": model.seq_len,
        "ffn_hidden": model.ffn_hidden,
        "kv_heads": model.kv_heads,
    }
    shape = dataclasses.replace(base, **{k: v for k, v in overrides.items() if v is not None})
    if model.preset is None and model.kv_heads is None:
        shape = dataclasses.replace(shape, kv_heads=shape.heads)
    return shape


def default_ffn_hidden(hidden: int) -> int:
    """SwiGLU width 2/3 x 4h rounded up to a multiple of 256, as Llama does (Touvron 2023)."""
    return -(-(8 * hidden // 3) // 256) * 256
