"""The Kueue objects the Kueue tests share, exactly as docs/user-guide.md shows them.

A private pool of fake GPU nodes (hack/kwok/nodes.py --pool kueue: tainted, so no other test's
pods land there), one ResourceFlavor for it with the block / rack / host Topology, a
ClusterQueue with a GPU quota of half the pool, two WorkloadPriorityClasses, and a LocalQueue
per team namespace.
"""

from __future__ import annotations

from typing import Any

API = "kueue.x-k8s.io/v1beta2"
POOL = "kueue"
POOL_NODES = 8  # 2 racks of 4 nodes, 8 GPUs each: 64 GPUs
POOL_LABEL = "meshrun.dev/pool"
TOPOLOGY = "meshrun-topology"
FLAVOR = "h200-pool"
CLUSTER_QUEUE = "meshrun-gpus"
GPU_QUOTA = 32
RACK_LABEL = "topology.meshrun.dev/rack"
BLOCK_LABEL = "topology.meshrun.dev/block"
HOST_LABEL = "kubernetes.io/hostname"
PRIORITIES = {"meshrun-low": 100, "meshrun-high": 1000}
TEAMS = ("team-a", "team-b")


def cluster_objects() -> list[dict[str, Any]]:
    """Topology, ResourceFlavor, ClusterQueue and WorkloadPriorityClasses (cluster-scoped)."""
    topology = {
        "apiVersion": API,
        "kind": "Topology",
        "metadata": {"name": TOPOLOGY},
        "spec": {
            "levels": [
                {"nodeLabel": BLOCK_LABEL},
                {"nodeLabel": RACK_LABEL},
                {"nodeLabel": HOST_LABEL},
            ]
        },
    }
    flavor = {
        "apiVersion": API,
        "kind": "ResourceFlavor",
        "metadata": {"name": FLAVOR},
        "spec": {
            "nodeLabels": {POOL_LABEL: POOL},
            "tolerations": [
                {"key": POOL_LABEL, "operator": "Equal", "value": POOL, "effect": "NoSchedule"}
            ],
            "topologyName": TOPOLOGY,
        },
    }
    cluster_queue = {
        "apiVersion": API,
        "kind": "ClusterQueue",
        "metadata": {"name": CLUSTER_QUEUE},
        "spec": {
            "namespaceSelector": {},
            "preemption": {"withinClusterQueue": "LowerPriority"},
            "resourceGroups": [
                {
                    "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                    "flavors": [
                        {
                            "name": FLAVOR,
                            "resources": [
                                {"name": "cpu", "nominalQuota": "768"},
                                {"name": "memory", "nominalQuota": "8Ti"},
                                {"name": "nvidia.com/gpu", "nominalQuota": str(GPU_QUOTA)},
                            ],
                        }
                    ],
                }
            ],
        },
    }
    priorities = [
        {
            "apiVersion": API,
            "kind": "WorkloadPriorityClass",
            "metadata": {"name": name},
            "value": value,
            "description": f"meshrun training jobs, priority {value}",
        }
        for name, value in PRIORITIES.items()
    ]
    return [topology, flavor, cluster_queue, *priorities]


def local_queue(name: str, namespace: str) -> dict[str, Any]:
    """The LocalQueue ``name`` of a team's namespace, feeding the shared ClusterQueue."""
    return {
        "apiVersion": API,
        "kind": "LocalQueue",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"clusterQueue": CLUSTER_QUEUE},
    }
