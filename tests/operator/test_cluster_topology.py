"""spec.scheduling.topologyKey on the real scheduler: the operator chooses each pipeline stage's
rack and the pods prefer it by node affinity, so stages of jobs created together each land in one
rack, packed around what is already running, in a private pool of 16 KWOK nodes (4 racks of 4
nodes x 8 GPUs: hack/kwok/nodes.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from meshrun_operator import names
from operator_harness import Cluster, Kubectl, OperatorProcess
from waiting import wait_for

from meshrun.api.crd import API_VERSION, KIND

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
RACK = "topology.meshrun.dev/rack"
POOL_LABEL = "meshrun.dev/pool"
POOL_NODES = 16
PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"


@pytest.fixture
def pool(kubectl: Kubectl) -> Iterator[str]:
    """A private, tainted pool of fake GPU nodes in racks of 4 (``<pool>-rack-N``)."""
    name = f"topo{uuid.uuid4().hex[:6]}"
    script = ROOT / "hack" / "kwok" / "nodes.py"
    nodes = subprocess.run(
        [sys.executable, str(script), str(POOL_NODES), "--pool", name],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    kubectl("apply", "--server-side", "-f", "-", input=nodes)
    ready = '{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\\n"}{end}'

    def all_ready() -> bool:
        out = kubectl("get", "nodes", "-l", f"{POOL_LABEL}={name}", "-o", f"jsonpath={ready}")
        return out.stdout.split().count("True") >= POOL_NODES

    wait_for(all_ready, 120, f"{POOL_NODES} Ready nodes in pool {name}")
    yield name
    kubectl("delete", "nodes", "-l", f"{POOL_LABEL}={name}", "--wait=false", check=False)


def job(name: str, pool: str, pods: int, stages: int) -> dict[str, Any]:
    """``pods`` pods x 8 GPUs in ``stages`` pipeline stages, pinned to the pool, rack preferred."""
    toleration = {"key": POOL_LABEL, "operator": "Equal", "value": pool, "effect": "NoSchedule"}
    strategy = {"type": "pipeline", "pipelineParallel": stages} if stages > 1 else {"type": "ddp"}
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name},
        "spec": {
            "image": "meshrun/trainer:test",
            "resources": {"numNodes": pods, "numProcPerNode": 8},
            "strategy": strategy,
            "model": {"preset": "1b"},
            "training": {"steps": 10, "globalBatchSize": 64, "microBatchSize": 1},
            "scheduling": {"topologyKey": RACK},
            "podTemplate": {
                "spec": {"nodeSelector": {POOL_LABEL: pool}, "tolerations": [toleration]}
            },
        },
    }


def stage_racks(cluster: Cluster, name: str, racks: dict[str, str]) -> dict[int, set[str]]:
    """Stage -> the racks its pods run in; every pod prefers its stage's racks by node affinity."""
    found: dict[int, set[str]] = {}
    for pod in cluster.pods(name):
        affinity = pod["spec"]["affinity"]
        assert "podAffinity" not in affinity, affinity
        [term] = affinity["nodeAffinity"][PREFERRED]
        [expression] = term["preference"]["matchExpressions"]
        rack = racks[pod["spec"]["nodeName"]]
        assert expression["key"] == RACK and rack in expression["values"], (pod, expression)
        stage = int(pod["metadata"]["labels"][names.LABEL_STAGE])
        found.setdefault(stage, set()).add(rack)
    return found


def test_stages_of_jobs_created_together_each_land_in_one_rack(
    cluster: Cluster, kubectl: Kubectl, pool: str, operator_process: OperatorProcess
) -> None:
    listing = json.loads(kubectl("get", "nodes", "-l", f"{POOL_LABEL}={pool}", "-o", "json").stdout)
    racks = {n["metadata"]["name"]: n["metadata"]["labels"][RACK] for n in listing["items"]}
    # First a 2-pod job: half of one rack.
    cluster.apply(job("first", pool, 2, 1))
    cluster.wait_phase("first", "Running", timeout=90)
    [first_rack] = stage_racks(cluster, "first", racks)[0]
    # Then two jobs at once, before either has a pod: 8 pods in 2 stages of 4 and 6 pods in 3
    # stages of 2. Only if every stage keeps to one rack do all 16 nodes fill: the 4-pod stages
    # need two empty racks, and one 2-pod stage must take the rest of the first job's rack.
    both = {"apiVersion": "v1", "kind": "List", "items": [
        job("wide", pool, 8, 2), job("deep", pool, 6, 3),
    ]}  # fmt: skip
    cluster.apply(both)
    for name in ("wide", "deep"):
        status = cluster.wait_phase(name, "Running", timeout=120)
        assert {row["domain"] for row in status["placement"]} <= set(racks.values()), status
    wide, deep = stage_racks(cluster, "wide", racks), stage_racks(cluster, "deep", racks)
    assert all(len(r) == 1 for r in (*wide.values(), *deep.values())), (wide, deep)
    # The 4-pod stages took two whole racks; the first job's rack holds a 2-pod stage.
    assert len({rack for r in wide.values() for rack in r}) == 2
    assert first_rack in {rack for r in deep.values() for rack in r}
    assert first_rack not in {rack for r in wide.values() for rack in r}
