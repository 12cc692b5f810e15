"""spec.podTemplate's schema: Kubernetes' PodTemplateSpec, structural, as the generator writes it.

The API server prunes what a job's template holds beyond this schema and drops its nulls, so the
template it stores is as deep as the schema. hack/podtemplate_schema.py writes it from the
OpenAPI of the Kubernetes release the project builds; `hack/verify.sh` checks it is current.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

from meshrun.api.crd import spec_schema, validate_spec, with_defaults
from meshrun.api.errors import SpecError

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def generator() -> Any:
    spec = importlib.util.spec_from_file_location(
        "podtemplate_schema", ROOT / "hack" / "podtemplate_schema.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def template() -> dict[str, Any]:
    schema: dict[str, Any] = spec_schema()["properties"]["podTemplate"]
    return schema


def nodes(schema: dict[str, Any], path: str = "podTemplate") -> list[tuple[str, dict[str, Any]]]:
    found = [(path, schema)]
    for name, sub in schema.get("properties", {}).items():
        found.extend(nodes(sub, f"{path}.{name}"))
    if "items" in schema:
        found.extend(nodes(schema["items"], f"{path}[]"))
    if "additionalProperties" in schema:
        found.extend(nodes(schema["additionalProperties"], f"{path}.*"))
    return found


def at(path: str) -> dict[str, Any]:
    return dict(nodes(template()))[path]


CRD_KEYS = {
    "type",
    "format",
    "description",
    "properties",
    "required",
    "items",
    "additionalProperties",
    "default",
    "enum",
    "pattern",
    "anyOf",
    "x-kubernetes-int-or-string",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-map-type",
}


def test_the_template_schema_is_structural_and_bounded() -> None:
    """What the API server requires of a structural schema, and no open subtree anywhere."""
    found = nodes(template())
    assert len(found) > 1000  # the whole PodSpec, not a stub
    for path, node in found:
        assert set(node) <= CRD_KEYS, (path, set(node) - CRD_KEYS)
        if node.get("x-kubernetes-int-or-string"):
            assert node["anyOf"] == [{"type": "integer"}, {"type": "string"}], path
            assert "type" not in node, path
            continue
        assert "type" in node and "anyOf" not in node, path
        assert "nullable" not in node and "x-kubernetes-preserve-unknown-fields" not in node, path
        if node["type"] == "object":
            assert ("properties" in node) != ("additionalProperties" in node), path
        if node["type"] == "array":
            assert "items" in node, path
        if node.get("x-kubernetes-list-type") == "map":
            item = node["items"]
            for key in node["x-kubernetes-list-map-keys"]:
                assert key in item.get("required", []) or "default" in item["properties"][key], (
                    path,
                    key,
                )
        if path != "podTemplate":
            assert "description" not in node, path  # kept out: the CRD stays small
    depth = max(path.count(".") + path.count("[]") for path, _ in found)
    assert depth < 20, depth


def test_known_fields_are_kubernetes_own() -> None:
    assert set(template()["properties"]) == {"metadata", "spec"}
    labels = {"type": "object", "additionalProperties": {"type": "string"}}
    assert at("podTemplate.metadata") == {
        "type": "object",
        "properties": {"annotations": labels, "labels": labels},
    }
    pod = at("podTemplate.spec")
    assert "required" not in pod, "the operator adds the trainer container: none is required"
    assert {"nodeName", "tolerations", "serviceAccountName", "volumes", "affinity"} <= set(
        pod["properties"]
    )
    containers = at("podTemplate.spec.containers")
    assert containers["x-kubernetes-list-type"] == "map"
    assert containers["x-kubernetes-list-map-keys"] == ["name"]
    assert containers["items"]["required"] == ["name"]
    port = at("podTemplate.spec.containers[].ports[]")
    assert port["required"] == ["containerPort"]
    assert port["properties"]["containerPort"] == {"type": "integer", "format": "int32"}
    assert port["properties"]["protocol"] == {"type": "string", "default": "TCP"}
    limit = at("podTemplate.spec.containers[].resources.limits.*")
    assert limit["x-kubernetes-int-or-string"] is True
    assert limit["pattern"] == generator().QUANTITY_PATTERN
    assert at("podTemplate.spec.tolerations")["x-kubernetes-list-type"] == "atomic"
    assert at("podTemplate.spec.nodeSelector") == labels | {"x-kubernetes-map-type": "atomic"}
    assert at("podTemplate.spec.containers[].livenessProbe.httpGet.port") == {
        "anyOf": [{"type": "integer"}, {"type": "string"}],
        "x-kubernetes-int-or-string": True,
    }
    secret = at("podTemplate.spec.imagePullSecrets")
    assert secret["items"]["properties"]["name"]["default"] == "", "a list key needs a default"


def test_the_local_check_and_defaults_are_the_api_servers() -> None:
    """meshrun plan reads a template as the API server stores it: unknown fields and wrong types
    named, nulls unset, quantities checked, a port's protocol defaulted."""
    base = {"image": "x", "model": {"preset": "tiny"}}
    containers = [{"name": "trainer", "ports": [{"containerPort": 80}], "securityContext": None}]
    spec = {**base, "podTemplate": {"spec": {"containers": containers, "hostNetwork": None}}}
    validate_spec(spec)
    pod = with_defaults(spec)["podTemplate"]["spec"]
    assert pod == {
        "containers": [{"name": "trainer", "ports": [{"containerPort": 80, "protocol": "TCP"}]}]
    }
    bad = {"resources": {"limits": {"cpu": "2 cores"}}}
    with pytest.raises(SpecError) as caught:
        validate_spec({**base, "podTemplate": {"spec": {"containers": [{"name": "t", **bad}]}}})
    assert caught.value.field == "spec.podTemplate.spec.containers[0].resources.limits.cpu"
    with pytest.raises(SpecError) as caught:
        validate_spec({**base, "podTemplate": {"spec": {"containers": [None]}}})
    assert caught.value.field == "spec.podTemplate.spec.containers[0]"
    with pytest.raises(SpecError) as caught:
        validate_spec({**base, "training": {"steps": None}})
    assert caught.value.field == "spec.training.steps", "meshrun's own fields refuse a null"


OPENAPI: dict[str, Any] = {
    "io.k8s.api.core.v1.PodTemplateSpec": {
        "type": "object",
        "properties": {
            "metadata": {
                "allOf": [
                    {"$ref": "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}
                ],
                "default": {},
            },
            "spec": {
                "allOf": [{"$ref": "#/components/schemas/io.k8s.api.core.v1.PodSpec"}],
                "default": {},
            },
        },
    },
    "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta": {
        "type": "object",
        "properties": {"name": {"type": "string"}, "labels": {"type": "object"}},
    },
    "io.k8s.api.core.v1.PodSpec": {
        "type": "object",
        "description": "a pod",
        "required": ["containers"],
        "properties": {
            "containers": {
                "type": "array",
                "items": {
                    "allOf": [{"$ref": "#/components/schemas/io.k8s.api.core.v1.Container"}],
                    "default": {},
                },
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["name"],
                "x-kubernetes-patch-strategy": "merge",
            },
            "hosts": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"ip": {"type": "string", "default": ""}},
                },
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["ip"],
            },
            "loop": {"$ref": "#/components/schemas/io.k8s.api.core.v1.Loop"},
        },
    },
    "io.k8s.api.core.v1.Container": {
        "type": "object",
        "required": ["name"],
        "properties": {
            "name": {"type": "string", "default": "", "description": "its name"},
            "port": {
                "$ref": "#/components/schemas/io.k8s.apimachinery.pkg.util.intstr.IntOrString"
            },
            "cpu": {"$ref": "#/components/schemas/io.k8s.apimachinery.pkg.api.resource.Quantity"},
            "count": {"type": "integer", "format": "int32", "default": 0},
            "protocol": {"type": "string", "default": "TCP"},
        },
        "x-kubernetes-unions": [{"discriminator": "name"}],
    },
    "io.k8s.api.core.v1.Loop": {
        "type": "object",
        "properties": {"again": {"$ref": "#/components/schemas/io.k8s.api.core.v1.Loop"}},
    },
    "io.k8s.apimachinery.pkg.util.intstr.IntOrString": {
        "format": "int-or-string",
        "oneOf": [{"type": "integer"}, {"type": "string"}],
    },
    "io.k8s.apimachinery.pkg.api.resource.Quantity": {
        "oneOf": [{"type": "string"}, {"type": "number"}]
    },
}


def test_the_generator_resolves_references_and_drops_what_a_crd_cannot_hold() -> None:
    gen = generator()
    schema = gen.Builder(OPENAPI, "v9.9.9").build()
    assert "v9.9.9" in schema["description"]
    meta, pod = schema["properties"]["metadata"], schema["properties"]["spec"]
    assert set(meta["properties"]) == {"labels", "annotations"}
    assert "required" not in pod and "description" not in pod
    containers = pod["properties"]["containers"]
    assert set(containers) == {
        "type",
        "items",
        "x-kubernetes-list-type",
        "x-kubernetes-list-map-keys",
    }
    container = containers["items"]["properties"]
    assert container["name"] == {"type": "string"}  # the zero default and description gone
    assert container["count"] == {"type": "integer", "format": "int32"}
    assert container["protocol"] == {"type": "string", "default": "TCP"}
    assert container["port"]["x-kubernetes-int-or-string"] is True
    assert container["cpu"]["pattern"] == gen.QUANTITY_PATTERN
    assert "x-kubernetes-unions" not in containers["items"]
    # a list key the items do not require gets its zero value as the default
    assert pod["properties"]["hosts"]["items"]["properties"]["ip"] == {
        "type": "string",
        "default": "",
    }
    # a type inside itself is cut: nothing below the first repetition is kept
    assert pod["properties"]["loop"]["properties"]["again"] == {"type": "object"}


def test_the_generator_rewrites_only_the_template_block() -> None:
    gen = generator()
    crd = (
        "a:\n" + " " * 16 + "before: 1\n"
        + " " * 16 + "podTemplate:\n" + " " * 18 + "type: object\n"
        + " " * 18 + "x-kubernetes-preserve-unknown-fields: true\n"
        + " " * 16 + "after:\n" + " " * 18 + "type: string\n"
    )  # fmt: skip
    block = gen.block({"type": "object", "description": "the template", "properties": {}})
    out = gen.splice(crd, block)
    assert out.startswith("a:\n" + " " * 16 + "before: 1\n" + block)
    assert out.endswith(" " * 16 + "after:\n" + " " * 18 + "type: string\n")
    assert "preserve-unknown" not in out
    assert gen.splice(out, block) == out
