"""The typed spec: one dataclass field per CRD key, the CRD's defaults, errors naming the field."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Literal

import pytest

import meshrun.api.crd as crd
from meshrun.api.errors import SpecError
from meshrun.api.read import crd_key_of, list_section, optional_section, read_spec
from meshrun.api.spec import JobSpec

pytestmark = pytest.mark.unit

SPEC = {
    "image": "img",
    "resources": {"numNodes": 4, "numProcPerNode": 8},
    "model": {"preset": "tiny"},
}


def sections(
    cls: type, schema: dict[str, Any], path: str
) -> list[tuple[str, type, dict[str, Any]]]:
    """(path, dataclass, schema) of every object section the typed spec reads."""
    found = [(path, cls, schema)]
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        hint = hints[field.name]
        if field.metadata.get("derived"):
            continue
        section = hint if dataclasses.is_dataclass(hint) else optional_section(hint)
        if isinstance(section, type):
            sub = schema["properties"][crd_key_of(field)]
            found += sections(section, sub, f"{path}.{crd_key_of(field)}")
        item = list_section(hint)
        if item is not None:
            sub = schema["properties"][crd_key_of(field)]["items"]
            found += sections(item, sub, f"{path}.{crd_key_of(field)}[]")
    return found


SECTIONS = sections(JobSpec, dict(crd.spec_schema()), "spec")


@pytest.mark.parametrize(("path", "cls", "schema"), SECTIONS, ids=[s[0] for s in SECTIONS])
def test_one_field_per_crd_key(path: str, cls: type, schema: dict[str, Any]) -> None:
    read = {crd_key_of(f) for f in dataclasses.fields(cls) if not f.metadata.get("derived")}
    assert read == set(schema["properties"]), f"{path}: the CRD and {cls.__name__} differ"


@pytest.mark.parametrize(("path", "cls", "schema"), SECTIONS, ids=[s[0] for s in SECTIONS])
def test_literal_fields_are_the_crd_enums(path: str, cls: type, schema: dict[str, Any]) -> None:
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        if field.metadata.get("derived"):
            continue
        prop = schema["properties"][crd_key_of(field)]
        hint = hints[field.name]
        members = [hint] if typing.get_origin(hint) is Literal else typing.get_args(hint)
        literal = [
            arg
            for member in members
            if typing.get_origin(member) is Literal
            for arg in typing.get_args(member)
        ]
        if "enum" in prop:
            assert sorted(literal) == sorted(prop["enum"]), f"{path}.{crd_key_of(field)}"
        else:
            assert not literal, f"{path}.{crd_key_of(field)} has no enum in the CRD"


def test_every_default_comes_from_the_crd() -> None:
    job = read_spec(SPEC)
    assert job.run_policy.backoff_limit == 3 and job.run_policy.clean_pod_policy == "Running"
    assert job.scheduling.gang and job.scheduling.gang_timeout_seconds == 300
    assert job.resources.accelerator == "nvidia.com/gpu" and job.resources.num_nodes == 4
    assert job.resources.interconnect.intra_node == "nvlink"
    assert job.strategy.type == "auto" and job.strategy.pipeline_schedule == "1f1b"
    t = job.training
    assert (t.steps, t.global_batch_size, t.precision, t.learning_rate) == (100, 8, "bf16", 3e-4)
    assert t.checkpoint.every_steps == 0 and t.checkpoint.volume is None
    assert job.strategy.tensor_parallel is None and job.model.layers is None
    assert job.shape.ffn_hidden == 192 and job.dataset == "corpus"


def test_explicit_sizes_take_the_llama_ffn_width_and_plain_attention() -> None:
    job = read_spec(
        {"image": "i", "model": {"layers": 2, "hidden": 512, "heads": 8, "vocab": 100, "seqLen": 9}}
    )
    assert job.shape.ffn_hidden == 1536 and job.shape.kv_heads == 8
    assert job.dataset == "synthetic", "a vocabulary below 256 cannot hold the byte corpus"


def test_numbers_are_read_as_their_types() -> None:
    job = read_spec({**SPEC, "training": {"learningRate": 1, "maxGradNorm": 2}})
    assert isinstance(job.training.learning_rate, float) and job.training.max_grad_norm == 2.0


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"image": ""}, "spec.image"),
        ({"runPolicy": {"backoffLimit": -1}}, "spec.runPolicy.backoffLimit"),
        ({"runPolicy": {"cleanPodPolicy": "Some"}}, "spec.runPolicy.cleanPodPolicy"),
        ({"runPolicy": {"suspend": "yes"}}, "spec.runPolicy.suspend"),
        ({"scheduling": {"gangTimeoutSeconds": True}}, "spec.scheduling.gangTimeoutSeconds"),
        ({"scheduling": "fast"}, "spec.scheduling"),
        ({"resources": {"numProcPerNode": 0}}, "spec.resources.numProcPerNode"),
        ({"training": {"precison": "fp32"}}, "spec.training.precison"),
        ({"model": {"layers": 2}}, "spec.model"),
    ],
)
def test_errors_name_the_field(overrides: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError) as error:
        read_spec({**SPEC, **overrides})
    assert error.value.field == field
