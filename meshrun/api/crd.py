"""The ParallelTrainingJob API as Python sees it, derived from the CRD file itself.

The CRD (``crds/meshrun.dev_paralleltrainingjobs.yaml``, rendered as JSON into ``meshrun/data/``
so an installed package has it) is the single source of truth: defaults and the per-field checks
(types, enums, bounds, unknown fields) are read from its OpenAPI schema, the way the API server
applies them, so ``meshrun plan`` and the cluster agree. Cross-field rules (the CEL rules) are
checked by the planner, which names the same fields.
"""

from __future__ import annotations

import copy
import datetime
import functools
import json
import re
import threading
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from meshrun.api.errors import SpecError

GROUP = "meshrun.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "ParallelTrainingJob"
PLURAL = "paralleltrainingjobs"
CRD_FILE = "meshrun.dev_paralleltrainingjobs.yaml"
PACKAGED_CRD = "meshrun.dev_paralleltrainingjobs.json"
"""The package's copy of the CRD, the same object as JSON (hack/sync-crds.sh writes and checks
it). Every process that evaluates a job reads it once: json parses it in 2 ms and keeps the
process 0.7 MiB larger; YAML, even with libyaml, took 50 ms and left the operator 4.9 MiB larger
(the document's node tree, built whole before the objects, freed into the allocator's pools)."""

Schema = Mapping[str, Any]

NULL_IS_UNSET = frozenset({"podTemplate"})
"""Sections of ``spec`` (Kubernetes' own types) where a null reads as unset, as the API server
reads it: it drops a null it cannot store (its field not ``nullable``) before defaulting. In
meshrun's own fields a null is refused, so that a key left empty in YAML is named."""


_LOADING = threading.Lock()
"""Taken by every call of :func:`crd`: the first parses, those arriving meanwhile wait."""


@functools.cache
def _parsed() -> dict[str, Any]:
    text = resources.files("meshrun").joinpath("data", PACKAGED_CRD).read_text(encoding="utf-8")
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def crd() -> dict[str, Any]:
    """The CRD object shipped in the package (crds/ as JSON), parsed once per process.

    The lock keeps threads that ask at once (the operator evaluates new jobs on threads) from
    each parsing it: 200 jobs created together once parsed the YAML dozens of times, 5.8 s of
    CPU."""
    with _LOADING:
        return _parsed()


def spec_schema() -> Schema:
    """The OpenAPI schema of ``spec`` in the served version."""
    version = next(v for v in crd()["spec"]["versions"] if v["name"] == VERSION)
    schema: Schema = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return schema


def status_schema() -> Schema:
    """The OpenAPI schema of ``status`` in the served version."""
    version = next(v for v in crd()["spec"]["versions"] if v["name"] == VERSION)
    schema: Schema = version["schema"]["openAPIV3Schema"]["properties"]["status"]
    return schema


def with_defaults(spec: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of ``spec`` with the CRD's defaults applied (camelCase keys kept).

    Like the API server's structural defaulting: a missing field with a ``default`` gets it, and
    defaulting continues inside objects, including objects that were themselves defaulted.
    """
    result = copy.deepcopy(dict(spec))
    properties = spec_schema()["properties"]
    for name in NULL_IS_UNSET & result.keys():
        _prune_nulls(result[name], properties[name])
    _apply_defaults(result, spec_schema())
    return result


def _prune_nulls(value: Any, schema: Schema) -> None:
    """Drop the nulls of fields that are not nullable, in place (the API server's pruning)."""
    if isinstance(value, dict):
        for name in list(value):
            sub = _field_schema(schema, name)
            if value[name] is None and not (sub or {}).get("nullable"):
                del value[name]
            elif sub is not None:
                _prune_nulls(value[name], sub)
    elif isinstance(value, list) and "items" in schema:
        for item in value:
            _prune_nulls(item, schema["items"])


def _field_schema(schema: Schema, name: str) -> Schema | None:
    properties = schema.get("properties", {})
    if name in properties:
        return properties[name]  # type: ignore[no-any-return]
    return schema.get("additionalProperties")


def _apply_defaults(value: Any, schema: Schema) -> None:
    if isinstance(value, dict):
        for name, sub in schema.get("properties", {}).items():
            if name not in value and "default" in sub:
                value[name] = copy.deepcopy(sub["default"])
            if name in value:
                _apply_defaults(value[name], sub)
    elif isinstance(value, list) and "items" in schema:
        for item in value:
            _apply_defaults(item, schema["items"])


def validate_spec(spec: Any) -> None:
    """Check ``spec`` against the CRD schema: types, enums, bounds, required and unknown fields.

    Raises SpecError naming the first offending field. Unknown fields are errors (the API server
    would silently prune them, which hides typos such as ``tensorParalel``).
    """
    _validate(spec, spec_schema(), "spec")


def validate_status(status: Any) -> None:
    """Check a status the operator writes against the CRD's status schema; a None value is a
    key the merge patch removes. Stricter than the API server: a key under a section that keeps
    unknown fields (``status.plan``) must be declared too, when the section declares any, so
    each key the operator writes has a type and a description in the CRD."""
    _validate(status, status_schema(), "status", nulls_unset=True, declared=True)


_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
}


def _validate(
    value: Any, schema: Schema, path: str, nulls_unset: bool = False, declared: bool = False
) -> None:
    kind = schema.get("type")
    if kind is not None:
        allowed = _TYPES[kind]
        # bool is an int subclass in Python, but not an integer to the API server.
        if not isinstance(value, allowed) or (isinstance(value, bool) and kind != "boolean"):
            raise SpecError(path, f"must be {_article(kind)} {kind}, got {_as_yaml(value)}")
    if "enum" in schema and value not in schema["enum"]:
        choices = ", ".join(str(choice) for choice in schema["enum"])
        raise SpecError(path, f"{value!r} is not one of: {choices}")
    _check_bounds(value, schema, path)
    properties = schema.get("properties", {})
    keeps_unknown = schema.get("x-kubernetes-preserve-unknown-fields")
    if isinstance(value, dict) and (not keeps_unknown or (declared and properties)):
        for name in schema.get("required", []):
            if name not in value:
                raise SpecError(f"{path}.{name}", "is required")
        for name, item in value.items():
            unset = nulls_unset or (path == "spec" and name in NULL_IS_UNSET)
            sub = _field_schema(schema, name)
            if sub is None:
                known = ", ".join(properties)
                raise SpecError(f"{path}.{name}", f"unknown field (known fields: {known})")
            if item is None and unset and not sub.get("nullable"):
                continue  # the API server drops it: unset
            _validate(item, sub, f"{path}.{name}", unset, declared)
    if isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            _validate(item, schema["items"], f"{path}[{index}]", nulls_unset, declared)


def _check_bounds(value: Any, schema: Schema, path: str) -> None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in schema:
            low = schema["minimum"]
            if schema.get("exclusiveMinimum") and value <= low:
                raise SpecError(path, f"must be greater than {low}, got {value}")
            if value < low:
                raise SpecError(path, f"must be at least {low}, got {value}")
        if "maximum" in schema:
            high = schema["maximum"]
            if schema.get("exclusiveMaximum") and value >= high:
                raise SpecError(path, f"must be less than {high}, got {value}")
            if value > high:
                raise SpecError(path, f"must be at most {high}, got {value}")
        if schema.get("type") == "integer":
            # The API server refuses an integer beyond int64. It does not check an int32
            # format, but the schema declares it for every client that reads the field.
            bits = 32 if schema.get("format") == "int32" else 64
            if not -(2 ** (bits - 1)) <= value < 2 ** (bits - 1):
                raise SpecError(
                    path,
                    f"must fit in a {bits}-bit integer (at most {2 ** (bits - 1) - 1}), "
                    f"got {value}",
                )
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            raise SpecError(path, f"must have at least {schema['minItems']} items, got {value}")
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            raise SpecError(path, f"must have at most {schema['maxItems']} items, got {value}")
    if isinstance(value, str):
        if len(value) < schema.get("minLength", 0):
            raise SpecError(path, f"must have at least {schema['minLength']} characters")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            raise SpecError(path, f"must have at most {schema['maxLength']} characters")
        if "pattern" in schema and re.search(schema["pattern"], value) is None:
            raise SpecError(path, f"{value!r} does not match {schema['pattern']}")


def _as_yaml(value: Any) -> str:
    """A value as the YAML that gave it (``true``, ``null``, ``2024-01-01``), not Python's repr
    (``True``, ``None``, ``datetime.date(2024, 1, 1)``); strings and the rest as repr."""
    if value is None or isinstance(value, bool | datetime.date):
        return yaml.safe_dump(value, default_flow_style=True).removesuffix("\n...\n").strip()
    return repr(value)


def _article(kind: str) -> str:
    return "an" if kind[0] in "aeiou" else "a"


def check_job(job: Any, where: str = "job") -> dict[str, Any]:
    """Check one object is a ParallelTrainingJob with a valid spec; return it unchanged."""
    if not isinstance(job, dict):
        raise SpecError(where, "must be a YAML mapping (a Kubernetes object)")
    if job.get("apiVersion") != API_VERSION:
        raise SpecError(
            f"{where}.apiVersion", f"must be {API_VERSION}, got {_as_yaml(job.get('apiVersion'))}"
        )
    if job.get("kind") != KIND:
        raise SpecError(f"{where}.kind", f"must be {KIND}, got {_as_yaml(job.get('kind'))}")
    metadata = job.get("metadata")
    if not isinstance(metadata, dict) or not isinstance(metadata.get("name"), str):
        raise SpecError(f"{where}.metadata.name", "is required")
    if "spec" not in job:
        raise SpecError("spec", "is required")
    validate_spec(job["spec"])
    return job


def load_jobs(path: str | Path) -> list[dict[str, Any]]:
    """The ParallelTrainingJob objects in a YAML file (one or more ``---`` documents).

    Raises SpecError when the file cannot be read or parsed, or holds something else.
    """
    documents, source = read_documents(path), str(Path(path))
    return [check_job(doc, f"{source}[{index}]") for index, doc in enumerate(documents)]


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping as kubectl does (PyYAML
    keeps the last, so a pasted field would silently replace the one above it)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        lines: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *anchor`: the keys it brings may be given again
            key = self.construct_object(key_node, deep=deep)
            try:
                first = lines.get(key)
            except TypeError:
                continue  # an unhashable key: the safe loader's own error says so
            if first is not None:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"{key!r} is given twice in one mapping (first on line {first})",
                    key_node.start_mark,
                )
            lines[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep)


def documents_of(text: str, source: str = "<stdin>") -> list[Any]:
    """The YAML documents of ``text``, unchecked (SpecError when it does not parse, gives a key
    twice in one mapping, or holds none)."""
    try:
        documents = [doc for doc in yaml.load_all(text, Loader=_UniqueKeyLoader) if doc is not None]
    except yaml.YAMLError as error:
        raise SpecError(source, f"is not valid YAML: {_yaml_problem(error)}") from None
    if not documents:
        raise SpecError(source, "holds no ParallelTrainingJob")
    return documents


def _yaml_problem(error: yaml.YAMLError) -> str:
    """A YAML error in one line: where, what, and what it was in the middle of."""
    if not isinstance(error, yaml.MarkedYAMLError) or error.problem_mark is None:
        return " ".join(str(error).split())
    mark = error.problem_mark
    said = f"line {mark.line + 1}, column {mark.column + 1}: {error.problem}"
    if error.context:
        started = error.context_mark
        since = f" at line {started.line + 1}, column {started.column + 1}" if started else ""
        said += f" ({error.context}{since})"
    return said


def read_documents(path: str | Path) -> list[Any]:
    """:func:`documents_of` a file."""
    source = Path(path)
    try:
        text = source.read_text(encoding="utf-8")
    except OSError as error:
        raise SpecError(str(source), f"cannot be read ({error.strerror or error})") from None
    except UnicodeDecodeError as error:
        raise SpecError(
            str(source),
            f"is not UTF-8 text (byte {error.object[error.start]:#04x} at offset {error.start}); "
            "save it as UTF-8",
        ) from None
    return documents_of(text, str(source))
