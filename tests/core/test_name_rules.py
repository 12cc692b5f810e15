"""The rules for the names derived from a job's name and queue name, at plan time."""

from __future__ import annotations

from typing import Any

import pytest

from meshrun.api.errors import SpecError
from meshrun.planner.plan import plan_job
from meshrun.rules import names

pytestmark = pytest.mark.unit


def spec(num_nodes: int = 1, queue: str | None = None) -> dict[str, Any]:
    job: dict[str, Any] = {
        "image": "meshrun/trainer:test",
        "resources": {"numNodes": num_nodes, "numProcPerNode": 1, "accelerator": "cpu"},
        "strategy": {"type": "ddp"},
        "model": {"preset": "tiny"},
        "training": {"steps": 2, "globalBatchSize": 2 * num_nodes, "microBatchSize": 1},
    }
    if queue is not None:
        job["scheduling"] = {"queueName": queue}
    return job


@pytest.mark.parametrize(
    ("name", "num_nodes", "rule"),
    [
        ("a" * 61, 10, None),  # a...a-9: 63 characters
        ("a" * 61, 11, names.JOB_NAME_LENGTH),  # a...a-10: 64
        ("a" * 58, 10_000, None),  # a...a-9999: 63
        ("a" * 59, 10_000, names.JOB_NAME_LENGTH),
        ("a" * 62, 1, names.JOB_NAME_LENGTH),  # a...a-0: 64, even for one pod
        ("9lives", 1, names.JOB_NAME),  # a Service name starts with a letter
        ("job-", 1, names.JOB_NAME),
        ("Job", 1, names.JOB_NAME),
        ("a.b", 1, names.JOB_NAME),  # a valid object name, not a DNS label
    ],
)
def test_every_pod_name_fits_a_dns_label(name: str, num_nodes: int, rule: Any) -> None:
    if rule is None:
        assert plan_job(spec(num_nodes), name).name == name
        return
    with pytest.raises(SpecError) as error:
        plan_job(spec(num_nodes), name)
    assert error.value.field == "metadata.name"
    assert error.value.rule.startswith(rule.message.removeprefix("metadata.name "))


@pytest.mark.parametrize(
    ("queue", "ok"),
    [
        ("team-a", True),
        ("team.a-gpus", True),  # a LocalQueue name is a DNS subdomain
        ("q" * 63, True),
        ("q" * 64, False),  # a label value has at most 63
        ("Team_A", False),
        ("-team", False),
    ],
)
def test_the_queue_name_fits_its_label_and_a_local_queue(queue: str, ok: bool) -> None:
    if ok:
        plan_job(spec(queue=queue), "job")
        return
    with pytest.raises(SpecError) as error:
        plan_job(spec(queue=queue), "job")
    assert error.value.field == "spec.scheduling.queueName"
    assert "DNS-1123 subdomain of at most 63 characters" in str(error.value)
