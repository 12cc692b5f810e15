"""The CRD file: its shape, its defaults versus with_defaults, and its CEL messages."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

import meshrun.api.crd as api
from meshrun.api.read import read_spec
from meshrun.rules import strategy

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
CRD_PATH = ROOT / "crds" / api.CRD_FILE


def crd() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(CRD_PATH.read_text())
    return loaded


def version() -> dict[str, Any]:
    served: dict[str, Any] = crd()["spec"]["versions"][0]
    return served


def walk(schema: dict[str, Any], path: str) -> list[tuple[str, dict[str, Any]]]:
    """Every (dotted path, schema) below ``schema``, including itself."""
    found = [(path, schema)]
    for name, sub in schema.get("properties", {}).items():
        found.extend(walk(sub, f"{path}.{name}"))
    if "items" in schema:
        found.extend(walk(schema["items"], f"{path}[]"))
    return found


def test_names_scope_and_status_subresource() -> None:
    spec = crd()["spec"]
    assert spec["group"] == api.GROUP
    assert spec["names"]["kind"] == api.KIND
    assert spec["names"]["plural"] == api.PLURAL
    assert "ptj" in spec["names"]["shortNames"]
    assert spec["scope"] == "Namespaced"
    assert version()["name"] == api.VERSION
    assert version()["subresources"] == {"status": {}}


PRINTER_COLUMNS = [
    ("Strategy", ".status.strategy", 0),
    ("Layout", ".status.layout", 0),
    ("Procs", ".status.worldSize", 0),
    ("Phase", ".status.phase", 0),
    ("Restarts", ".status.restarts", 1),
    ("Step", ".status.display.step", 0),
    ("Progress", ".status.display.progress", 0),
    ("Loss", ".status.display.loss", 0),
    ("Tokens/s", ".status.display.tokensPerSecond", 0),
    ("Predicted Tokens/s", ".status.display.predictedTokensPerSecond", 1),
    ("ETA", ".status.display.eta", 0),
    ("Age", ".metadata.creationTimestamp", 0),
]
"""(name, JSONPath, priority) of ``kubectl get ptj``; priority 1 shows with ``-o wide``."""


def test_printer_columns() -> None:
    columns = version()["additionalPrinterColumns"]
    shown = [(c["name"], c["jsonPath"], c.get("priority", 0)) for c in columns]
    assert shown == PRINTER_COLUMNS
    fields = dict(walk(version()["schema"]["openAPIV3Schema"], ""))
    for column in columns:
        assert column.get("description") or column["type"] == "date", column["name"]
        if column["jsonPath"].startswith(".metadata."):
            continue
        field = fields.get(column["jsonPath"])
        assert field is not None, f"printer column {column['name']} reads an unknown field"
        assert field["type"] == column["type"], column["name"]


def test_every_spec_field_has_a_description() -> None:
    """meshrun's own fields; below spec.podTemplate they are Kubernetes' (`kubectl explain
    pod.spec`), left out of the CRD to keep it small."""
    schema = version()["schema"]["openAPIV3Schema"]
    undocumented = [
        path
        for path, sub in walk(schema["properties"]["spec"], "spec")
        if not sub.get("description")
        and not path.endswith("[]")
        and not path.startswith("spec.podTemplate.")
    ]
    assert undocumented == []


def test_status_schema_has_what_the_operator_writes() -> None:
    status = version()["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    for field in (
        "phase",
        "conditions",
        "plan",
        "placement",
        "restarts",
        "attempt",
        "startTime",
        "completionTime",
        "progress",
        "observedGeneration",
    ):
        assert field in status, field
    progress = status["progress"]["properties"]
    assert {"step", "totalSteps", "loss", "tokensPerSecond", "updatedAt"} <= set(progress)


def test_immutable_sections() -> None:
    spec = version()["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    for section in ("resources", "strategy", "model"):
        rule_texts = [r["rule"] for r in spec[section]["x-kubernetes-validations"]]
        assert "self == oldSelf" in rule_texts, section
    assert not any(
        r["rule"] == "self == oldSelf"
        for r in spec["runPolicy"].get("x-kubernetes-validations", [])
    ), "runPolicy (suspend) must stay mutable"


def all_defaults(schema: dict[str, Any], path: str = "") -> dict[str, Any]:
    """{dotted path: default} for every defaulted field reachable through defaulted parents."""
    found: dict[str, Any] = {}
    for name, sub in schema.get("properties", {}).items():
        if "default" in sub:
            found[f"{path}{name}"] = sub["default"]
            found.update(all_defaults(sub, f"{path}{name}."))
    return found


def lookup(document: dict[str, Any], dotted: str) -> Any:
    value: Any = document
    for part in dotted.split("."):
        value = value[part]
    return value


def test_with_defaults_applies_every_crd_default() -> None:
    spec_schema = version()["schema"]["openAPIV3Schema"]["properties"]["spec"]
    defaults = all_defaults(spec_schema)
    assert len(defaults) >= 20, defaults
    applied = api.with_defaults({"image": "x", "model": {"preset": "tiny"}})
    for dotted, default in defaults.items():
        value = lookup(applied, dotted)
        if isinstance(default, dict):
            assert isinstance(value, dict), dotted
        else:
            assert value == default, dotted


def test_with_defaults_keeps_given_values_and_copies() -> None:
    spec = {"image": "x", "model": {"preset": "tiny"}, "training": {"steps": 7}}
    applied = api.with_defaults(spec)
    assert applied["training"]["steps"] == 7
    assert applied["training"]["precision"] == "bf16"
    assert "precision" not in spec["training"], "with_defaults must not modify its input"


def cel_messages() -> list[str]:
    schema = version()["schema"]["openAPIV3Schema"]
    return [
        " ".join(rule["message"].split())
        for _, sub in walk(schema, "")
        for rule in sub.get("x-kubernetes-validations", [])
    ]


@pytest.mark.parametrize("rule", strategy.ALL_RULES, ids=lambda r: r.message[:60])
def test_the_rules_repeat_the_crd_messages(rule: strategy.Rule) -> None:
    assert rule.message in cel_messages()
    assert rule.field in rule.message, "the message names the field it blames"


def test_every_cel_rule_is_restated_in_python() -> None:
    assert sorted(cel_messages()) == sorted(
        [r.message for r in strategy.ALL_RULES]
        + [
            f"spec.{section} is immutable; delete and recreate the job"
            for section in ("resources", "strategy", "model")
        ]
    )


def test_every_cel_message_names_a_spec_field() -> None:
    messages = cel_messages()
    assert len(messages) >= 12
    assert all("spec." in message for message in messages), messages


@pytest.mark.parametrize(
    ("field", "value", "where"),
    [
        ("image", "r/" + "x" * 511, "spec.image"),
        ("command", ["sh"] * 257, "spec.command"),
        ("command", ["x" * 4097], "spec.command[0]"),
        ("args", ["a"] * 1025, "spec.args"),
        ("args", ["ok", "y" * 4097], "spec.args[1]"),
    ],
)
def test_image_command_and_args_are_bounded(field: str, value: Any, where: str) -> None:
    spec = {"image": "meshrun/trainer:1", "model": {"preset": "tiny"}, field: value}
    with pytest.raises(api.SpecError) as refused:
        api.validate_spec(spec)
    assert refused.value.field == where


def test_micro_batch_size_has_no_default_and_every_rule_guards_it() -> None:
    """Unset, strategy auto chooses the micro-batch size (every other type runs 1), so the CRD
    must not default it, and a CEL rule reading an absent field fails on the API server ("no
    such key") instead of evaluating: each rule that reads it checks has() first."""
    spec = {"image": "x", "model": {"preset": "tiny"}, "training": {"globalBatchSize": 8}}
    assert "microBatchSize" not in api.with_defaults(spec)["training"]
    job = read_spec(spec)
    assert job.training.micro_batch_size is None
    schema = version()["schema"]["openAPIV3Schema"]
    rules = [
        " ".join(rule["rule"].split())
        for _, sub in walk(schema, "")
        for rule in sub.get("x-kubernetes-validations", [])
    ]
    reading = [r for r in rules if "self.training.microBatchSize" in r]
    assert reading
    for rule in reading:
        guarded = rule.count("has(self.training.microBatchSize)")
        assert rule.count("self.training.microBatchSize") == 2 * guarded, rule


def test_threads_asking_at_once_parse_the_crd_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The operator evaluates new jobs on threads: the first of them parses the package's copy
    of the CRD, the others wait for it instead of each parsing it again."""
    parses = []
    real_load = json.loads

    def counted(*args: Any, **kwargs: Any) -> Any:
        parses.append(1)
        time.sleep(0.2)  # long enough for every thread to arrive meanwhile
        return real_load(*args, **kwargs)

    monkeypatch.setattr(api.json, "loads", counted)
    api._parsed.cache_clear()
    try:
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda _: api.crd(), range(8)))
    finally:
        api._parsed.cache_clear()
    assert len(parses) == 1
    assert all(answer is answers[0] for answer in answers)
    assert answers[0]["spec"]["names"]["kind"] == "ParallelTrainingJob"


def test_the_packaged_crd_is_the_crd_file() -> None:
    """The package reads a JSON rendering of crds/ (hack/sync-crds.sh): the same object."""
    assert api.crd() == yaml.safe_load(CRD_PATH.read_text(encoding="utf-8"))
