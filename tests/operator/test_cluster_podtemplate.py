"""spec.podTemplate on the real API server: Kubernetes' PodTemplateSpec bounds what it stores.

A template nested thousands of levels deep once went into etcd as it was sent, and the
operator's JSON decoding (about 1,000 levels) died on every list of jobs. The CRD's schema is
the PodTemplateSpec of the Kubernetes release the project builds: the API server refuses or
prunes what lies outside it, drops nulls, and stores a template no deeper than the schema.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from operator_harness import Cluster, OperatorProcess, job_manifest
from waiting import wait_for

from meshrun.api.crd import PLURAL

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

DEPTH = 3_000
"""Levels of a hostile template: three times what Python's JSON decoder takes."""


def deep_text(depth: int) -> str:
    """``{"a": {"a": ... "bottom" ...}}`` as JSON text, written without recursion."""
    return '{"a":' * depth + '"bottom"' + "}" * depth


def with_deep(job: dict[str, Any], marker: str, depth: int = DEPTH) -> str:
    """The job as JSON text with the string ``marker`` replaced by a ``depth``-deep object."""
    return json.dumps(job).replace(json.dumps(marker), deep_text(depth))


def nesting(value: Any) -> int:
    """How deep ``value`` nests (objects and lists), without recursion."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        item, level = todo.pop()
        children = (
            item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        )
        for child in children:
            todo.append((child, level + 1))
        deepest = max(deepest, level)
    return deepest


def create(cluster: Cluster, text: str, *flags: str) -> Any:
    return cluster.kubectl("create", "-n", cluster.ns, *flags, "-f", "-", input=text, check=False)


def test_a_deep_template_is_refused_or_pruned_and_the_operator_runs_the_job(
    cluster: Cluster, operator_process: OperatorProcess
) -> None:
    side = {"name": "side", "image": "busybox"}
    # kubectl's strict field validation: the author is told which field is not a pod's
    unknown = job_manifest("deep", podTemplate={"spec": {"containers": [{**side, "x": "DEEP"}]}})
    refused = create(cluster, with_deep(unknown, "DEEP"))
    assert refused.returncode != 0
    assert 'unknown field "spec.podTemplate.spec.containers[0].x"' in refused.stderr
    # where the schema has a type (a node selector's strings, labels), no client gets it in
    for template in ({"spec": {"nodeSelector": {"a": "DEEP"}}}, {"metadata": {"labels": "DEEP"}}):
        text = with_deep(job_manifest("deep", podTemplate=template), "DEEP")
        result = create(cluster, text, "--validate=false")
        assert result.returncode != 0, template
        assert "spec.podTemplate" in result.stderr, result.stderr[:400]
    # a client that asks for no validation: the API server prunes it
    created = create(cluster, with_deep(unknown, "DEEP"), "--validate=false")
    assert created.returncode == 0, created.stderr[:400]
    raw = cluster.kubectl("get", PLURAL, "deep", "-n", cluster.ns, "-o", "json").stdout
    assert len(raw) < 20_000, "the 3,000 levels were stored"
    stored = json.loads(raw)
    assert stored["spec"]["podTemplate"] == {"spec": {"containers": [side]}}
    assert nesting(stored) < 20
    pods = wait_for(lambda: len(cluster.pods("deep")) == 2 and cluster.pods("deep"), 60, "pods")
    containers = {c["name"]: c for c in pods[0]["spec"]["containers"]}
    assert containers["side"]["image"] == "busybox" and "trainer" in containers
    assert operator_process.healthy()
    assert "Traceback" not in operator_process.log_path.read_text(errors="replace")


def test_unknown_keys_and_nulls_are_pruned_and_the_pods_built_from_the_rest(
    cluster: Cluster, operator_process: OperatorProcess
) -> None:
    template = {
        # a Go client writes creationTimestamp: null in every template it serialises
        "metadata": {"labels": {"team": "a"}, "creationTimestamp": None, "name": "ignored"},
        "spec": {
            "securityContext": {"runAsNonRoot": None, "runAsUser": 1000},
            "automountServiceAccountToken": None,
            "notAPodField": {"a": 1},
            "containers": [
                {
                    "name": "trainer",
                    "madeUp": 1,
                    "env": [{"name": "FROM_TEMPLATE", "value": "1"}],
                    "ports": [{"containerPort": 8080, "name": "web"}],
                }
            ],
        },
    }
    text = json.dumps(job_manifest("pruned", podTemplate=template))
    strict = create(cluster, text)
    assert strict.returncode != 0 and "unknown field" in strict.stderr
    assert "spec.podTemplate.spec.notAPodField" in strict.stderr
    assert create(cluster, text, "--validate=false").returncode == 0
    stored = cluster.job("pruned")["spec"]["podTemplate"]
    assert stored == {
        "metadata": {"labels": {"team": "a"}},
        "spec": {
            "securityContext": {"runAsUser": 1000},
            "containers": [
                {
                    "name": "trainer",
                    "env": [{"name": "FROM_TEMPLATE", "value": "1"}],
                    "ports": [{"containerPort": 8080, "name": "web", "protocol": "TCP"}],
                }
            ],
        },
    }
    pods = wait_for(lambda: len(cluster.pods("pruned")) == 2 and cluster.pods("pruned"), 60, "pods")
    for pod in pods:
        assert pod["metadata"]["labels"]["team"] == "a"
        trainer = next(c for c in pod["spec"]["containers"] if c["name"] == "trainer")
        assert {"name": "FROM_TEMPLATE", "value": "1"} in trainer["env"]
        assert pod["spec"]["securityContext"]["runAsUser"] == 1000
    assert "Traceback" not in operator_process.log_path.read_text(errors="replace")
