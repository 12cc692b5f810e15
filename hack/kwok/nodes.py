#!/usr/bin/env python3
"""Print a kubectl-ready List of N fake GPU nodes for KWOK (JSON on stdout).

Each node looks like an 8-GPU HGX server: allocatable nvidia.com/gpu 8, CPUs, memory and pods,
and the topology labels a placement-aware scheduler reads. The hierarchy (all sizes in nodes):
NVLink domain 2 < rack 4 < block 16 < zone 256, so small tests already see several racks.

``nodes.py N --pool NAME`` prints a private pool instead: nodes ``NAME-node-NNNN`` labelled
``meshrun.dev/pool=NAME`` and tainted ``meshrun.dev/pool=NAME:NoSchedule``, so only pods that
tolerate the taint land there (e.g. through a Kueue ResourceFlavor), with topology values of
their own (``NAME-rack-0``). Pool nodes are not ``type=kwok``: hack/cluster.sh leaves them alone.
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
POOL_LABEL = "meshrun.dev/pool"


def node_name(index: int, pool: str | None = None) -> str:
    return f"{pool or 'gpu'}-node-{index:04d}"


def node(index: int, pool: str | None = None) -> dict[str, object]:
    resources = {
        "cpu": "192",
        "memory": "2Ti",
        "pods": "110",
        "ephemeral-storage": "30Ti",
        "nvidia.com/gpu": "8",
    }
    name = node_name(index, pool)
    domain = f"{pool}-" if pool else ""
    labels = {
        "type": "kwok-pool" if pool else "kwok",
        "kubernetes.io/arch": "amd64",
        "kubernetes.io/os": "linux",
        "kubernetes.io/hostname": name,
        "node.kubernetes.io/instance-type": INSTANCE_TYPE,
        "nvidia.com/gpu.product": "NVIDIA-H200",
        "nvidia.com/gpu.count": "8",
        "topology.kubernetes.io/region": "local",
        "topology.kubernetes.io/zone": f"{domain}zone-{index // ZONE_NODES}",
        "topology.meshrun.dev/block": f"{domain}block-{index // BLOCK_NODES}",
        "topology.meshrun.dev/rack": f"{domain}rack-{index // RACK_NODES}",
        "topology.meshrun.dev/nvlink-domain": f"{domain}nvl-{index // NVLINK_DOMAIN_NODES}",
    }
    spec: dict[str, object] = {}
    if pool:
        labels[POOL_LABEL] = pool
        spec["taints"] = [{"key": POOL_LABEL, "value": pool, "effect": "NoSchedule"}]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {
                "kwok.x-k8s.io/node": "fake",
                "node.alpha.kubernetes.io/ttl": "0",
            },
            "labels": labels,
        },
        "spec": spec,
        "status": {"allocatable": resources, "capacity": resources},
    }


def main(argv: list[str]) -> int:
    pool = argv[3] if len(argv) == 4 and argv[2] == "--pool" else None
    if len(argv) not in (2, 4) or not argv[1].isdigit() or (len(argv) == 4 and not pool):
        print("usage: nodes.py N [--pool NAME]", file=sys.stderr)
        return 2
    count = int(argv[1])
    items = [node(i, pool) for i in range(count)]
    json.dump({"apiVersion": "v1", "kind": "List", "items": items}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
