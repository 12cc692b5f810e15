"""An admission turned into what each pod needs (kueue_admission): flavors, topology domains,
admission check updates, and the merge into a pod."""

from __future__ import annotations

from typing import Any

import pytest
from kueue_factories import condition, make_plan, make_pod, make_workload
from meshrun_operator import kueue
from meshrun_operator.kueue import (
    AdmissionError,
    PodAdmission,
    admit_pods,
    apply_admission,
    topology_domains,
)

pytestmark = pytest.mark.unit

HOST = "kubernetes.io/hostname"
BLOCK, RACK = "cloud.provider.com/topology-block", "cloud.provider.com/topology-rack"
POOL_TAINT = {
    "key": "meshrun.dev/pool",
    "operator": "Equal",
    "value": "kueue",
    "effect": "NoSchedule",
}
FLAVORS = {
    "h200": {
        "metadata": {"name": "h200"},
        "spec": {"nodeLabels": {"meshrun.dev/pool": "kueue"}, "tolerations": [POOL_TAINT]},
    },
    "cpu": {"metadata": {"name": "cpu"}, "spec": {}},
}


def test_topology_domains_decode_kueues_documented_examples() -> None:
    # Examples 1 and 2 of TopologyAssignment in Kueue's v1beta2 API: the same assignment.
    example_1 = {
        "levels": [BLOCK, RACK],
        "slices": [
            {
                "domainCount": 2,
                "valuesPerLevel": [
                    {"individual": {"roots": ["block-1", "block-1"]}},
                    {"individual": {"roots": ["rack-1", "rack-2"]}},
                ],
                "podCounts": {"individual": [4, 2]},
            }
        ],
    }
    example_2 = {
        "levels": [BLOCK, RACK],
        "slices": [
            {
                "domainCount": 2,
                "valuesPerLevel": [
                    {"universal": "block-1"},
                    {"individual": {"prefix": "rack-", "roots": ["1", "2"]}},
                ],
                "podCounts": {"individual": [4, 2]},
            }
        ],
    }
    expected = [
        ({BLOCK: "block-1", RACK: "rack-1"}, 4),
        ({BLOCK: "block-1", RACK: "rack-2"}, 2),
    ]
    assert topology_domains(example_1) == expected
    assert topology_domains(example_2) == expected
    # Example 4: hostnames in two slices, common prefixes, one pod each.
    example_4 = {
        "levels": [HOST],
        "slices": [
            {
                "domainCount": 4,
                "valuesPerLevel": [
                    {
                        "individual": {
                            "prefix": "block-1-rack-1-node-",
                            "roots": ["1", "2", "3", "4"],
                        }
                    }
                ],
                "podCounts": {"universal": 1},
            },
            {
                "domainCount": 2,
                "valuesPerLevel": [
                    {"individual": {"prefix": "block-1-rack-2-node-", "roots": ["1", "2"]}}
                ],
                "podCounts": {"universal": 1},
            },
        ],
    }
    hosts = [selector[HOST] for selector, count in topology_domains(example_4)]
    assert hosts == [f"block-1-rack-1-node-{i}" for i in (1, 2, 3, 4)] + [
        "block-1-rack-2-node-1",
        "block-1-rack-2-node-2",
    ]
    assert topology_domains(
        {
            "levels": [HOST],
            "slices": [
                {
                    "domainCount": 1,
                    "valuesPerLevel": [{"individual": {"roots": ["n"], "suffix": "-x"}}],
                    "podCounts": {"universal": 2},
                }
            ],
        }
    ) == [({HOST: "n-x"}, 2)]


def _assignment(name: str, hosts: list[str] | None = None, flavor: str = "h200") -> dict[str, Any]:
    assignment: dict[str, Any] = {
        "name": name,
        "flavors": {"nvidia.com/gpu": flavor, "cpu": flavor},
        "count": 2,
    }
    if hosts is not None:
        assignment["topologyAssignment"] = {
            "levels": [HOST],
            "slices": [
                {
                    "domainCount": len(hosts),
                    "valuesPerLevel": [{"individual": {"roots": hosts}}],
                    "podCounts": {"universal": 1},
                }
            ],
        }
    return assignment


def _admitted(*assignments: dict[str, Any], required: str | None = None) -> dict[str, Any]:
    pod_sets = [
        {
            "name": a["name"],
            "count": 2,
            **({"topologyRequest": {"required": required}} if required else {}),
        }
        for a in assignments
    ]
    return make_workload(
        condition("QuotaReserved", True, "QuotaReserved"),
        condition("Admitted", True, "Admitted"),
        admission={"clusterQueue": "gpus", "podSetAssignments": list(assignments)},
        pod_sets=pod_sets,
    )


def test_each_pod_gets_its_flavor_and_its_own_node_in_pod_index_order() -> None:
    sets = kueue.pod_sets(make_plan())
    workload = _admitted(
        _assignment("stage-0", ["kueue-node-0001", "kueue-node-0000"]),
        _assignment("stage-1", ["kueue-node-0004", "kueue-node-0005"]),
        required="topology.meshrun.dev/rack",
    )
    pods = admit_pods(workload, FLAVORS, sets)
    assert sorted(pods) == [0, 1, 2, 3]
    assert [pods[i].node_selector[HOST] for i in range(4)] == [
        "kueue-node-0001",
        "kueue-node-0000",
        "kueue-node-0004",
        "kueue-node-0005",
    ]
    first = pods[0]
    assert first.pod_set == "stage-0"
    assert first.node_selector["meshrun.dev/pool"] == "kueue"
    assert first.tolerations == [POOL_TAINT]
    assert first.labels == {kueue.PODSET_LABEL: "stage-0"}
    assert first.annotations == {
        kueue.WORKLOAD_ANNOTATION: "paralleltrainingjob-train-1a2b3",
        kueue.REQUIRED_TOPOLOGY_ANNOTATION: "topology.meshrun.dev/rack",
    }
    # Each pod's admission is its own copy.
    first.node_selector["x"] = "y"
    assert "x" not in pods[1].node_selector


def test_without_a_topology_request_the_pods_count_as_unconstrained_tas_pods() -> None:
    sets = kueue.pod_sets(make_plan())
    workload = _admitted(_assignment("stage-0", ["a", "b"]), _assignment("stage-1", ["c", "d"]))
    pods = admit_pods(workload, FLAVORS, sets)
    assert pods[3].annotations[kueue.UNCONSTRAINED_TOPOLOGY_ANNOTATION] == "true"
    # Without topology-aware scheduling at all: the flavor alone, no topology annotation.
    plain = admit_pods(_admitted(_assignment("stage-0"), _assignment("stage-1")), FLAVORS, sets)
    assert plain[2].node_selector == {"meshrun.dev/pool": "kueue"}
    assert set(plain[2].annotations) == {kueue.WORKLOAD_ANNOTATION}


def test_admission_check_updates_of_a_ready_check_are_merged() -> None:
    sets = kueue.pod_sets(make_plan())
    workload = _admitted(_assignment("stage-0"), _assignment("stage-1"))
    update = {
        "name": "stage-1",
        "labels": {"provreq": "yes"},
        "annotations": {"note": "1"},
        "nodeSelector": {"cloud/pool": "reserved"},
        "tolerations": [{"key": "reserved", "operator": "Exists"}],
    }
    workload["status"]["admissionChecks"] = [
        {"name": "prov", "state": "Ready", "podSetUpdates": [update]},
        {"name": "other", "state": "Pending", "podSetUpdates": [{**update, "labels": {"no": "1"}}]},
    ]
    pods = admit_pods(workload, FLAVORS, sets)
    assert pods[2].labels["provreq"] == "yes" and "no" not in pods[2].labels
    assert pods[2].annotations["note"] == "1"
    assert pods[2].node_selector == {"meshrun.dev/pool": "kueue", "cloud/pool": "reserved"}
    assert pods[2].tolerations == [POOL_TAINT, {"key": "reserved", "operator": "Exists"}]
    assert "provreq" not in pods[0].labels


@pytest.mark.parametrize(
    ("workload", "flavors", "message"),
    [
        (make_workload(), FLAVORS, "is not admitted"),
        (_admitted(_assignment("stage-0")), FLAVORS, "no assignment for pod set stage-1"),
        (
            _admitted(_assignment("stage-0"), _assignment("stage-1", flavor="gone")),
            FLAVORS,
            "ResourceFlavor gone not found",
        ),
        (
            _admitted(_assignment("stage-0", ["only-one"]), _assignment("stage-1", ["a", "b"])),
            FLAVORS,
            "places 1 of 2 pods",
        ),
    ],
)
def test_an_admission_the_pods_cannot_follow_is_an_error(
    workload: dict[str, Any], flavors: dict[str, Any], message: str
) -> None:
    with pytest.raises(AdmissionError, match=message):
        admit_pods(workload, flavors, kueue.pod_sets(make_plan()))


def test_apply_admission_merges_into_a_copy_of_the_pod() -> None:
    pod = make_pod(
        0, nodeSelector={"nvidia.com/gpu.product": "NVIDIA-H200"}, tolerations=[POOL_TAINT]
    )
    admission = PodAdmission(
        pod_set="stage-0",
        node_selector={"meshrun.dev/pool": "kueue", HOST: "kueue-node-0003"},
        tolerations=[POOL_TAINT],
        labels={kueue.PODSET_LABEL: "stage-0"},
        annotations={kueue.WORKLOAD_ANNOTATION: "wl"},
    )
    admitted = apply_admission(pod, admission)
    assert admitted["spec"]["nodeSelector"] == {
        "nvidia.com/gpu.product": "NVIDIA-H200",
        "meshrun.dev/pool": "kueue",
        HOST: "kueue-node-0003",
    }
    assert admitted["spec"]["tolerations"] == [POOL_TAINT]
    assert admitted["metadata"]["labels"][kueue.PODSET_LABEL] == "stage-0"
    assert admitted["metadata"]["annotations"] == {kueue.WORKLOAD_ANNOTATION: "wl"}
    assert "annotations" not in pod["metadata"] and len(pod["spec"]["nodeSelector"]) == 1


def test_a_pod_that_selects_another_node_than_its_admission_is_a_conflict() -> None:
    pod = make_pod(0, nodeSelector={HOST: "gpu-node-0000"})
    with pytest.raises(AdmissionError, match=r"node label kubernetes\.io/hostname"):
        apply_admission(pod, PodAdmission(pod_set="stage-0", node_selector={HOST: "other"}))
