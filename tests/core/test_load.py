"""load_jobs and validate_spec: every example loads, bad files and fields are named."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshrun.api.crd import documents_of, load_jobs, validate_spec
from meshrun.api.errors import SpecError

pytestmark = pytest.mark.unit

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))
JOB = """\
apiVersion: meshrun.dev/v1alpha1
kind: ParallelTrainingJob
metadata:
  name: {name}
spec:
  image: trainer:1
  model:
    preset: tiny
"""


def test_every_example_loads() -> None:
    names = {path.stem for path in EXAMPLES}
    expected = {
        "ddp",
        "zero1",
        "zero2",
        "zero3",
        "pipeline",
        "tensor",
        "3d",
        "auto",
        "long-context",
        "moe",
    }
    assert expected | {"demo-3d-cpu"} <= names
    for path in EXAMPLES:
        jobs = load_jobs(path)
        assert len(jobs) == 1 and jobs[0]["kind"] == "ParallelTrainingJob", path


def test_several_documents(tmp_path: Path) -> None:
    path = tmp_path / "two.yaml"
    path.write_text(JOB.format(name="a") + "---\n" + JOB.format(name="b") + "---\n")
    assert [job["metadata"]["name"] for job in load_jobs(path)] == ["a", "b"]


@pytest.mark.parametrize(
    ("text", "field", "words"),
    [
        (JOB.format(name="a").replace("v1alpha1", "v1"), ".apiVersion", "meshrun.dev/v1alpha1"),
        (JOB.format(name="a").replace("kind: Parallel", "kind: Not"), ".kind", "must be"),
        ("- 1\n- 2\n", "[0]", "mapping"),
        ("kind: ParallelTrainingJob\n", ".apiVersion", "must be meshrun.dev/v1alpha1, got null"),
        ("", "", "no ParallelTrainingJob"),
        ("a: [1,\n", "", "not valid YAML"),
        (
            JOB.format(name="a") + "  resources:\n    numNodes: 1\n    numNodes: 2\n",
            "",
            "line 11, column 5: 'numNodes' is given twice in one mapping (first on line 10)",
        ),
        (
            JOB.format(name="a").replace("  model:\n    preset: tiny\n", ""),
            "spec.model",
            "required",
        ),
        (JOB.format(name="a") + "  strategy:\n    tensorParalel: 2\n", "tensorParalel", "unknown"),
        (JOB.format(name="a") + "  strategy:\n    type: fsdp\n", "spec.strategy.type", "one of"),
        (JOB.format(name="a") + "  resources:\n    numNodes: 0\n", "numNodes", "at least 1"),
        (JOB.format(name="a") + "  resources:\n    numNodes: two\n", "numNodes", "integer"),
        (
            JOB.format(name="a") + "  resources:\n    numNodes: true\n",
            "numNodes",
            "must be an integer, got true",
        ),
        (
            JOB.format(name="a") + "  training:\n    steps: 2024-01-01\n",
            "spec.training.steps",
            "must be an integer, got 2024-01-01",
        ),
        (JOB.format(name="a") + "  resources: ~\n", "spec.resources", "an object, got null"),
        (JOB.format(name="a") + "  training:\n    learningRate: 0\n", "learningRate", "greater"),
        (JOB.format(name="a") + "  strategy:\n    zeroStage: 4\n", "zeroStage", "at most 3"),
        (
            JOB.format(name="a") + "  training:\n    globalBatchSize: 2147483648\n",
            "spec.training.globalBatchSize",
            "must fit in a 32-bit integer (at most 2147483647), got 2147483648",
        ),
        (
            JOB.format(name="a") + "  training:\n    seed: 100000000000000000000\n",
            "spec.training.seed",
            "must fit in a 64-bit integer (at most 9223372036854775807)",
        ),
    ],
)
def test_bad_files_name_the_field(tmp_path: Path, text: str, field: str, words: str) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as caught:
        load_jobs(path)
    assert field in caught.value.field
    assert words in caught.value.rule
    assert str(caught.value) == f"{caught.value.field}: {caught.value.rule}"


def test_a_yaml_error_is_one_line_saying_where_and_merge_keys_still_merge() -> None:
    with pytest.raises(SpecError) as caught:
        documents_of("spec: {a: [1, 2\n", "job.yaml")
    assert str(caught.value) == (
        "job.yaml: is not valid YAML: line 2, column 1: expected ',' or ']', but got "
        "'<stream end>' (while parsing a flow sequence at line 1, column 11)"
    )
    with pytest.raises(SpecError, match="'x' is given twice in one mapping"):
        documents_of("a: {x: 1, x: 2}\n")
    # `<<: *anchor` brings keys that the mapping may give again (YAML's merge keys).
    merged = documents_of("base: &base {p: 1, q: 2}\nthis:\n  <<: *base\n  p: 3\n")
    assert merged == [{"base": {"p": 1, "q": 2}, "this": {"p": 3, "q": 2}}]


def test_missing_file_is_a_spec_error(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="cannot be read"):
        load_jobs(tmp_path / "absent.yaml")


def test_pod_template_is_a_pod_template_spec() -> None:
    """The template takes what a pod takes, a null is unset, and anything else is named."""
    validate_spec(
        {
            "image": "x",
            "model": {"preset": "tiny"},
            "podTemplate": {
                "metadata": {"labels": {"team": "a"}, "annotations": None},
                "spec": {
                    "nodeSelector": {"a": "b"},
                    "securityContext": None,
                    "containers": [{"name": "trainer", "resources": {"limits": {"cpu": 2}}}],
                },
            },
        }
    )
    with pytest.raises(SpecError) as caught:
        validate_spec(
            {
                "image": "x",
                "model": {"preset": "tiny"},
                "podTemplate": {"spec": {"nodeSelector": {"a": "b"}, "anything": [1, {"x": 2}]}},
            }
        )
    assert caught.value.field == "spec.podTemplate.spec.anything"
    assert "unknown field" in caught.value.rule
