"""The operator's API client against the alternatives, in memory: what each costs a process that
runs kopf, at start and with a list of many nodes in hand.

Run: .venv/bin/python bench/api_client_memory.py [--nodes 1000] [--lightkube-path DIR]
[--write-docs]

Each client runs in a fresh process on top of the same base (Python, kopf, aiohttp, with the
``kubernetes`` package kept bare as the operator keeps it, process.py):

- meshrun: the operator's own client (client/rest.py, kube.py) and the ``kubernetes`` config
  loader it logs in with, the generated models unloaded; a node list is the JSON's dicts;
- kubernetes, models loaded: the same, with ``kubernetes`` imported the usual way (every
  generated API class and model, which kopf then imports too);
- lightkube: a maintained async client that loads its models by API group (``--lightkube-path``:
  a site-packages folder where it is installed, e.g. a throwaway venv's), with the resources
  the operator sends (Pod, Service, Event, Node, NetworkPolicy, Lease, and generic resources for
  its own kind, Kueue's Workload and the PodGroup); a node list is what its ``list`` yields
  (one model object per node).

Prints each process's resident memory after the base, after the client's imports (MiB), and
its peak with a list of ``--nodes`` nodes (of the size a kubelet's node object has) in hand as
the client hands it over.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from datetime import date
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CLIENTS = ("meshrun", "kubernetes, models loaded", "lightkube")


def fake_node(i: int) -> dict[str, Any]:
    """A node as the API server lists it: labels, conditions, capacity, addresses, images."""
    labels = {f"example.com/label-{k}": f"value-{i}-{k}" for k in range(12)}
    labels |= {"kubernetes.io/hostname": f"node-{i}", "nvidia.com/gpu.product": "NVIDIA-H100"}
    conditions = [
        {"type": t, "status": "False", "reason": f"No{t}", "message": f"node has no {t}",
         "lastHeartbeatTime": "2026-12-01T00:00:00Z", "lastTransitionTime": "2026-12-01T00:00:00Z"}
        for t in ("MemoryPressure", "DiskPressure", "PIDPressure", "NetworkUnavailable")
    ] + [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "ready",
          "lastHeartbeatTime": "2026-12-01T00:00:00Z",
          "lastTransitionTime": "2026-12-01T00:00:00Z"}]  # fmt: skip
    resources = {"cpu": "96", "memory": "2000Gi", "nvidia.com/gpu": "8", "pods": "110"}
    images = [
        {"names": [f"registry.example.com/team/image-{k}@sha256:{k:064x}"], "sizeBytes": 10**9}
        for k in range(10)
    ]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": f"node-{i}",
            "uid": f"{i:08d}-0000-0000-0000-000000000000",
            "resourceVersion": str(1000 + i),
            "creationTimestamp": "2026-12-01T00:00:00Z",
            "labels": labels,
            "annotations": {"node.alpha.kubernetes.io/ttl": "0", "kwok.x-k8s.io/node": "fake"},
        },
        "spec": {"podCIDR": f"10.{i // 256 % 256}.{i % 256}.0/24", "taints": []},
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": conditions,
            "addresses": [{"type": "InternalIP", "address": f"10.0.{i // 256}.{i % 256}"}],
            "nodeInfo": {
                "architecture": "amd64",
                "kubeletVersion": "v1.33.0",
                "osImage": "Ubuntu",
                "containerRuntimeVersion": "containerd://2.0",
                "kernelVersion": "6.8",
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
                "operatingSystem": "linux",
                "kubeProxyVersion": "",
            },
            "images": images,
        },
    }


def rss_mib() -> tuple[float, float]:
    """(resident now, peak) of this process, MiB."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def child(client: str, nodes: int) -> dict[str, float]:
    """Import the base, measure; import ``client``, measure; parse a list of ``nodes`` nodes as
    the client hands it over, measure the peak."""
    if client != "kubernetes, models loaded":
        from meshrun_operator.process import lean_kubernetes

        lean_kubernetes()
    else:
        import kubernetes  # every generated API class and model
    import aiohttp  # noqa: F401
    import kopf  # noqa: F401
    import prometheus_client  # noqa: F401
    from meshrun_operator import kinds, names  # noqa: F401

    base = rss_mib()[0]
    loader = base
    parse: Any = None
    if client == "lightkube":
        import lightkube
        from lightkube.generic_resource import create_namespaced_resource
        from lightkube.resources.coordination_v1 import Lease  # noqa: F401
        from lightkube.resources.core_v1 import Event, Node, Pod, Service  # noqa: F401
        from lightkube.resources.networking_v1 import NetworkPolicy  # noqa: F401

        for group, version, kind, plural in (
            ("meshrun.dev", "v1alpha1", "ParallelTrainingJob", "paralleltrainingjobs"),
            ("kueue.x-k8s.io", "v1beta1", "Workload", "workloads"),
            ("scheduling.x-k8s.io", "v1alpha1", "PodGroup", "podgroups"),
        ):
            create_namespaced_resource(group, version, kind, plural)
        assert lightkube.AsyncClient is not None and lightkube.KubeConfig is not None
        parse = Node.from_dict  # what AsyncClient.list(Node) yields, one per node
    else:
        import kubernetes.client.configuration
        import kubernetes.config  # noqa: F401

        loader = rss_mib()[0]
        from meshrun_operator.client import credentials, kube, login, rest  # noqa: F401

        parse = dict  # the operator's client hands the JSON's dicts over as they are
    imported = rss_mib()[0]
    text = json.dumps({"kind": "NodeList", "items": [fake_node(i) for i in range(nodes)]})
    listed = [parse(item) for item in json.loads(text)["items"]]
    del text
    peak = rss_mib()[1]
    return {"base": base, "loader": loader, "imported": imported, "peak": peak, "held": len(listed)}


def measure(client: str, nodes: int, lightkube_path: str | None) -> dict[str, float]:
    paths = [str(ROOT), str(ROOT / "operator"), str(ROOT / "trainer")]
    if lightkube_path:
        paths.append(lightkube_path)  # after the project's: kopf and aiohttp stay the same
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    argv = [sys.executable, __file__, "--child", client, "--nodes", str(nodes)]
    out = subprocess.run(argv, env=env, check=True, capture_output=True, text=True).stdout
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=3, help="fresh processes per client")
    parser.add_argument("--lightkube-path", help="a site-packages folder holding lightkube")
    parser.add_argument("--write-docs", action="store_true")
    parser.add_argument("--child", choices=CLIENTS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.nodes)))
        return
    rows = []
    loaders: list[float] = []
    for client in CLIENTS:
        runs = [measure(client, args.nodes, args.lightkube_path) for _ in range(args.runs)]

        def median(key: str, runs: list[dict[str, float]] = runs) -> float:
            return sorted(r[key] for r in runs)[len(runs) // 2]

        base, imported, peak = median("base"), median("imported"), median("peak")
        rows.append((client, base, imported, peak))
        loaders.append(median("loader") - base)
        print(
            f"{client:26s} base {base:6.1f} MiB, with the client {imported:6.1f} MiB "
            f"(+{imported - base:.1f}), peak with {args.nodes} nodes listed {peak:6.1f} MiB"
        )
        if client == "meshrun":
            loader = median("loader") - base
            print(f"{'':26s} of the client: the kubernetes config loader {loader:.1f} MiB")
    if args.write_docs:
        write_docs(rows, loaders[0], args)


def write_docs(
    rows: list[tuple[str, float, float, float]], loader: float, args: argparse.Namespace
) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _docsection import write_section

    version = "?"
    if args.lightkube_path:
        found = sorted(Path(args.lightkube_path).glob("lightkube-*.dist-info"))
        version = found[-1].name.removesuffix(".dist-info").split("-")[1] if found else "?"
    lines = [
        f"## The operator's API client: memory against the alternatives ({date.today()})",
        "",
        f"Produced by `python bench/api_client_memory.py --nodes {args.nodes} "
        "--lightkube-path DIR --write-docs`: each client in a fresh process on the same base "
        "(Python, kopf, aiohttp), median of "
        f"{args.runs} processes; lightkube {version}. The node list is parsed as each client "
        "hands it over (meshrun: the JSON's dicts; lightkube: one model object per node).",
        "",
        f"| client | base MiB | with the client MiB | the client's own MiB | peak MiB, "
        f"{args.nodes} nodes listed |",
        "|---|---:|---:|---:|---:|",
        *(
            f"| {client} | {base:.1f} | {imported:.1f} | {imported - base:.1f} | {peak:.1f} |"
            for client, base, imported, peak in rows
        ),
        "",
        f"Of meshrun's {rows[0][2] - rows[0][1]:.1f} MiB, the `kubernetes` config loader (what it "
        "names for OIDC and basic auth imported only when used) is "
        f"{loader:.1f} MiB and the operator's own client "
        f"{rows[0][2] - rows[0][1] - loader:.1f} MiB. The base of the second row is "
        f"{rows[1][1] - rows[0][1]:.1f} MiB higher: the generated models, which neither the "
        "operator nor lightkube loads.",
    ]
    print(f"wrote {write_section('api_client_memory', lines)}")


if __name__ == "__main__":
    main()
