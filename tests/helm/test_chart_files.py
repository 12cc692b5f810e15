"""The chart's files, read as files: every value commented and typed (hack/verify.sh checks
the CRD copy)."""

from __future__ import annotations

import json
import re
import tomllib
from typing import Any

import pytest
import yaml
from helm_support import CHART, ROOT

pytestmark = pytest.mark.unit

KEY_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z][A-Za-z0-9]*):")


def schema() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((CHART / "values.schema.json").read_text())
    return loaded


def value_paths(node: dict[str, Any], prefix: str = "") -> set[str]:
    """Dotted paths of every value the schema declares (free-form objects are leaves)."""
    paths: set[str] = set()
    for key, sub in node.get("properties", {}).items():
        path = f"{prefix}{key}"
        paths.add(path)
        paths |= value_paths(sub, f"{path}.")
    return paths


def test_every_value_has_a_comment_right_above_it() -> None:
    declared = value_paths(schema())
    stack: list[tuple[int, str]] = []
    previous = ""
    uncommented = []
    for line in (CHART / "values.yaml").read_text().splitlines():
        match = KEY_LINE.match(line)
        if match:
            indent = len(match["indent"])
            while stack and stack[-1][0] >= indent:
                stack.pop()
            path = ".".join([k for _, k in stack] + [match["key"]])
            stack.append((indent, match["key"]))
            # Keys inside free-form values (resources.requests.cpu) are examples, not values.
            if path in declared and not previous.lstrip().startswith("#"):
                uncommented.append(path)
        if line.strip():
            previous = line
    assert uncommented == []


def test_values_and_schema_declare_the_same_keys() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def walk(node: dict[str, Any], sub: dict[str, Any], prefix: str) -> set[str]:
        paths = set()
        for key, value in node.items():
            paths.add(prefix + key)
            child = sub.get("properties", {}).get(key, {})
            if isinstance(value, dict) and "properties" in child:
                paths |= walk(value, child, f"{prefix}{key}.")
        return paths

    assert walk(values, schema(), "") == value_paths(schema())


def test_schema_types_every_value_and_rejects_unknown_keys() -> None:
    def check(node: dict[str, Any], path: str) -> list[str]:
        problems = []
        if "type" not in node and "anyOf" not in node:
            problems.append(f"{path}: no type")
        if not node.get("description") and path != "(root)":
            problems.append(f"{path}: no description")
        if "properties" in node:
            if node.get("additionalProperties") is not False:
                problems.append(f"{path}: additionalProperties must be false (typos fail)")
            for key, sub in node["properties"].items():
                problems += check(sub, key if path == "(root)" else f"{path}.{key}")
        return problems

    assert check(schema(), "(root)") == []


def test_app_version_and_trainer_image_follow_the_package_version() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert chart["appVersion"] == project["version"]
    assert values["trainerImage"] == f"meshrun/trainer:{project['version']}"
