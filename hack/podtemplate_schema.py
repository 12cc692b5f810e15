#!/usr/bin/env python3
"""Write the structural schema of ``spec.podTemplate`` into the CRD, from Kubernetes' own OpenAPI.

The schema is io.k8s.api.core.v1.PodTemplateSpec of the Kubernetes release the project builds
(``KUBE_VERSION`` in hack/versions.env), read from the OpenAPI v3 document that ships in that
release's Go module (api/openapi-spec/v3/api__v1_openapi.json), with every ``$ref`` resolved the
way controller-gen embeds a PodTemplateSpec in a CRD:

- what a structural schema forbids or a CRD does not know goes (``oneOf``, ``allOf``, the patch
  strategies, unions, group-version-kinds); ``x-kubernetes-list-type``, ``-list-map-keys`` and
  ``-map-type`` stay, so the API server checks list keys as it does for pods;
- Quantity and IntOrString become ``x-kubernetes-int-or-string`` (a Quantity with its pattern);
- ObjectMeta becomes labels and annotations, the only metadata a template gives a pod;
- defaults stay where they are real (``protocol: TCP``) or where a list key needs one; the zero
  values the OpenAPI writes for every non-pointer field (``""``, ``0``, ``{}``) go, and no field
  is nullable: the API server drops a null as Kubernetes' Go decoding does for a pod (unset);
- the containers are not required: the operator adds the trainer's;
- descriptions go (``kubectl explain pod.spec`` has them): the CRD stays a small object that
  ``kubectl apply`` (client-side, whose annotation holds 256 KiB) and etcd accept.

Whatever a job's template holds beyond the schema is pruned by the API server, so what it stores
is as deep as the schema and no deeper. A type that contains itself would be cut to an object
without properties (nothing below it is kept).

    hack/podtemplate_schema.py            rewrite the podTemplate block of crds/ (then
                                          hack/sync-crds.sh copies it)
    hack/podtemplate_schema.py --check    change nothing; fail when the block is not current
    hack/podtemplate_schema.py --openapi FILE   read this OpenAPI document instead
    hack/podtemplate_schema.py --check --cached-only   (hack/verify.sh) no download: without
                                          the module in the cache, say so and succeed
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
CRD = ROOT / "crds" / "meshrun.dev_paralleltrainingjobs.yaml"
VERSIONS = ROOT / "hack" / "versions.env"
OPENAPI_IN_MODULE = "api/openapi-spec/v3/api__v1_openapi.json"

ROOT_TYPE = "io.k8s.api.core.v1.PodTemplateSpec"
OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"
INT_OR_STRING = "io.k8s.apimachinery.pkg.util.intstr.IntOrString"
# controller-gen's pattern for a resource.Quantity.
QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?"
    r"(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
NOT_REQUIRED = {("io.k8s.api.core.v1.PodSpec", "containers")}
"""Fields the OpenAPI requires that a template may leave out: the operator fills them."""
FORMATS = {"int32", "int64", "float", "double", "byte", "date-time"}
"""The formats kept (what a CRD validates); others, such as int-or-string, go."""

# Where the block sits in the CRD: the key and its indentation.
BLOCK_KEY = "podTemplate:"
BLOCK_INDENT = 16
DESCRIPTION = (
    "A PodTemplateSpec (metadata and spec) merged into every pod: labels, annotations, "
    "volumes, env, nodeSelector, tolerations and so on. Fields the operator sets (the trainer "
    "container's command, rank env) win. Its schema is Kubernetes {version}'s PodTemplateSpec: "
    "unknown fields are pruned and a null is unset, as for a pod; the operator's pod policy "
    "refuses what it does not admit."
)


def kube_version() -> str:
    for line in VERSIONS.read_text().splitlines():
        if line.startswith("KUBE_VERSION="):
            return line.split("=", 1)[1].split()[0]
    raise SystemExit(f"{VERSIONS}: no KUBE_VERSION")


def openapi_path(version: str, download: bool = True) -> Path:
    """The OpenAPI document in the Go module cache, downloaded there when missing."""
    env = {**os.environ, "GOFLAGS": "-mod=mod"}
    cache = subprocess.run(
        ["go", "env", "GOMODCACHE"], check=True, capture_output=True, text=True, env=env
    ).stdout.strip()
    path = Path(cache) / f"k8s.io/kubernetes@{version}" / OPENAPI_IN_MODULE
    if not path.exists() and download:
        subprocess.run(
            ["go", "mod", "download", f"k8s.io/kubernetes@{version}"], check=True, env=env
        )
    return path


class Builder:
    """Resolves the OpenAPI's schemas into one structural schema."""

    def __init__(self, schemas: dict[str, Any], version: str) -> None:
        self.schemas = schemas
        self.version = version

    def named(self, name: str, stack: tuple[str, ...]) -> dict[str, Any]:
        if name == OBJECT_META:
            labels = {"type": "object", "additionalProperties": {"type": "string"}}
            return {"type": "object", "properties": {"annotations": labels, "labels": labels}}
        if name == QUANTITY:
            return int_or_string(pattern=QUANTITY_PATTERN)
        if name == INT_OR_STRING:
            return int_or_string()
        if name in stack:  # a type inside itself: nothing below is kept
            print(f"podtemplate_schema: {' -> '.join((*stack, name))} cut", file=sys.stderr)
            return {"type": "object"}
        return self.node(self.schemas[name], (*stack, name))

    def node(self, raw: dict[str, Any], stack: tuple[str, ...]) -> dict[str, Any]:
        ref = raw.get("$ref") or next(
            (s["$ref"] for s in raw.get("allOf", []) if "$ref" in s), None
        )
        if ref is not None:
            named = self.named(ref.rsplit("/", 1)[1], stack)
            return with_default(named, raw.get("default"))
        out: dict[str, Any] = {}
        kind = raw.get("type")
        if kind is None:
            raise SystemExit(f"podtemplate_schema: no type at {' -> '.join(stack)}: {raw}")
        out["type"] = kind
        if raw.get("format") in FORMATS:
            out["format"] = raw["format"]
        for key in ("enum", "minimum", "maximum", "pattern", "minLength", "maxLength"):
            if key in raw:
                out[key] = raw[key]
        if kind == "object" and "properties" in raw:
            owner = stack[-1]
            out["properties"] = {
                name: self.node(sub, stack) for name, sub in sorted(raw["properties"].items())
            }
            required = [r for r in raw.get("required", []) if (owner, r) not in NOT_REQUIRED]
            if required:
                out["required"] = sorted(required)
        elif kind == "object" and "additionalProperties" in raw:
            out["additionalProperties"] = self.node(raw["additionalProperties"], stack)
        elif kind == "array":
            out["items"] = self.node(raw["items"], stack)
            list_keys(out, raw)
        if "x-kubernetes-map-type" in raw:
            out["x-kubernetes-map-type"] = raw["x-kubernetes-map-type"]
        return with_default(out, raw.get("default"))

    def build(self) -> dict[str, Any]:
        schema = self.named(ROOT_TYPE, ())
        description = DESCRIPTION.format(version=self.version)
        return {"type": "object", "description": description, "properties": schema["properties"]}


def int_or_string(pattern: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"anyOf": [{"type": "integer"}, {"type": "string"}]}
    if pattern:
        out["pattern"] = pattern
    out["x-kubernetes-int-or-string"] = True
    return out


def with_default(out: dict[str, Any], default: Any) -> dict[str, Any]:
    """A real default stays; the OpenAPI's zero values (every non-pointer field's) go."""
    if default is not None and default not in ("", 0, False, {}, []) and "type" in out:
        out["default"] = default
    return out


def list_keys(out: dict[str, Any], raw: dict[str, Any]) -> None:
    """The list's merge semantics, valid for a CRD: a map list's keys are required or defaulted
    (the API server refuses a CRD otherwise), so a key the OpenAPI leaves optional gets its zero
    value as the default, which is what Kubernetes reads an absent key as."""
    kind = raw.get("x-kubernetes-list-type")
    if kind is None:
        return
    out["x-kubernetes-list-type"] = kind
    if kind != "map":
        return
    keys = raw["x-kubernetes-list-map-keys"]
    out["x-kubernetes-list-map-keys"] = keys
    item = out["items"]
    for key in keys:
        if key in item.get("required", []) or "default" in item["properties"][key]:
            continue
        zero = {"string": "", "integer": 0}[item["properties"][key]["type"]]
        item["properties"][key]["default"] = zero


class _Dumper(yaml.SafeDumper):
    """Block style with no anchors: every shared sub-schema written out where it is used."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def block(schema: dict[str, Any]) -> str:
    """The podTemplate block as it sits in the CRD: indented, the description folded as the
    CRD's hand-written ones are."""
    body = {key: value for key, value in schema.items() if key != "description"}
    text = yaml.dump(
        {"podTemplate": body}, Dumper=_Dumper, sort_keys=False, width=1000, default_flow_style=False
    )
    head, rest = text.split("\n", 2)[:2], text.split("\n", 2)[2]
    folded = textwrap.wrap(schema["description"], width=100 - BLOCK_INDENT - 4)
    description = ["  description: >-", *("    " + line for line in folded)]
    lines = [*head, *description, *rest.splitlines()]
    pad = " " * BLOCK_INDENT
    return "".join(pad + line + "\n" for line in lines)


def splice(crd: str, new_block: str) -> str:
    """``crd`` with its podTemplate block replaced (the rest of the file byte for byte)."""
    lines = crd.splitlines(True)
    start = next(
        (i for i, line in enumerate(lines) if line == " " * BLOCK_INDENT + BLOCK_KEY + "\n"), None
    )
    if start is None:
        raise SystemExit(f"podtemplate_schema: no {BLOCK_KEY} at indent {BLOCK_INDENT}")
    end = start + 1
    while end < len(lines) and (
        not lines[end].strip() or len(lines[end]) - len(lines[end].lstrip()) > BLOCK_INDENT
    ):
        end += 1
    return "".join(lines[:start]) + new_block + "".join(lines[end:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--check", action="store_true", help="fail when the CRD is not current")
    parser.add_argument("--openapi", type=Path, help="the OpenAPI v3 document of core/v1")
    parser.add_argument("--crd", type=Path, default=CRD, help="the CRD file to rewrite")
    parser.add_argument(
        "--cached-only",
        action="store_true",
        help="download nothing: say so and succeed when the OpenAPI is not in the module cache",
    )
    args = parser.parse_args()
    version = kube_version()
    source = args.openapi or openapi_path(version, download=not args.cached_only)
    if not source.exists():
        print(f"podtemplate_schema: {source} is absent; spec.podTemplate not checked")
        return 0
    document = json.loads(source.read_text())
    schema = Builder(document["components"]["schemas"], version).build()
    crd: Path = args.crd
    current = crd.read_text()
    wanted = splice(current, block(schema))
    if args.check:
        if wanted != current:
            print(
                f"podtemplate_schema: {crd}'s podTemplate is not the "
                f"PodTemplateSpec of {source}; run hack/podtemplate_schema.py",
                file=sys.stderr,
            )
            return 1
        return 0
    crd.write_text(wanted)
    print(f"wrote spec.podTemplate ({len(block(schema))} bytes) into {crd}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
