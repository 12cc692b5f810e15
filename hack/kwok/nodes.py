#!/usr/bin/env python3
"""Print a kubectl-ready List of N fake GPU nodes for KWOK (JSON on stdout).

Each node looks like an 8-GPU HGX server: allocatable nvidia.com/gpu 8, CPUs, memory and pods,
and the topology labels a placement-aware scheduler reads. The hierarchy (all sizes in nodes):
NVLink domain 2 < rack 4 < block 16 < zone 256, so small tests already see several racks.
Standard library only: it runs before the project's virtualenv exists.
"""

from __future__ import annotations

import json
import sys

NVLINK_DOMAIN_NODES = 2
RACK_NODES = 4
BLOCK_NODES = 16
ZONE_NODES = 256
INSTANCE_TYPE = "sim-hgx-h200-8gpu"


def node_name(index: int) -> str:
    return f"gpu-node-{index:04d}"


def node(index: int) -> dict[str, object]:
    resources = {
        "cpu": "192",
        "memory": "2Ti",
        "pods": "110",
        "ephemeral-storage": "30Ti",
        "nvidia.com/gpu": "8",
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": node_name(index),
            "annotations": {
                "kwok.x-k8s.io/node": "fake",
                "node.alpha.kubernetes.io/ttl": "0",
            },
            "labels": {
                "type": "kwok",
                "kubernetes.io/arch": "amd64",
                "kubernetes.io/os": "linux",
                "kubernetes.io/hostname": node_name(index),
                "node.kubernetes.io/instance-type": INSTANCE_TYPE,
                "nvidia.com/gpu.product": "NVIDIA-H200",
                "nvidia.com/gpu.count": "8",
                "topology.kubernetes.io/region": "local",
                "topology.kubernetes.io/zone": f"zone-{index // ZONE_NODES}",
                "topology.meshrun.dev/block": f"block-{index // BLOCK_NODES}",
                "topology.meshrun.dev/rack": f"rack-{index // RACK_NODES}",
                "topology.meshrun.dev/nvlink-domain": f"nvl-{index // NVLINK_DOMAIN_NODES}",
            },
        },
        "spec": {},
        "status": {"allocatable": resources, "capacity": resources},
    }


def main(argv: list[str]) -> int:
    if len(argv) != 2 or not argv[1].isdigit():
        print("usage: nodes.py N", file=sys.stderr)
        return 2
    count = int(argv[1])
    json.dump(
        {"apiVersion": "v1", "kind": "List", "items": [node(i) for i in range(count)]}, sys.stdout
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
