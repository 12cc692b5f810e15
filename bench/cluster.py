"""Local control plane figures: cold build time of each Go-built tool (as recorded when it was
built), the time to start a control plane, and the time to create 1,000 fake GPU nodes and
see them all Ready.

It runs a second, throwaway cluster (its own folder and name) so a running test cluster is left
alone. Usage: python bench/cluster.py [--nodes 1000]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("MESHRUN_CACHE", Path.home() / ".cache" / "meshrun"))
KUBECTL = ROOT / ".cluster" / "bin" / "kubectl"


def build_times() -> list[tuple[str, str]]:
    versions = dict(
        re.findall(r"^(\w+)=(\S+)$", (ROOT / "hack" / "versions.env").read_text(), re.M)
    )
    rows = []
    for tool, key in (
        ("kubernetes", "KUBE_VERSION"),
        ("etcd", "ETCD_VERSION"),
        ("kwok", "KWOK_VERSION"),
        ("helm", "HELM_VERSION"),
    ):
        record = CACHE / f"{tool}-{versions[key]}" / ".build-seconds"
        seconds = f"{int(record.read_text()):>5d} s" if record.exists() else "not recorded"
        rows.append((f"{tool} {versions[key]}", seconds))
    return rows


def ready_nodes(kubeconfig: str) -> int:
    out = subprocess.run(
        [str(KUBECTL), "--kubeconfig", kubeconfig, "get", "nodes", "-o", "json"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    count = 0
    for node in json.loads(out)["items"]:
        conditions = node.get("status", {}).get("conditions") or []
        if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
            count += 1
    return count


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=1000)
    args = parser.parse_args()

    print("cold build time (recorded by hack/build-tools.sh when it built):")
    for name, seconds in build_times():
        print(f"  {name:<24} {seconds}")

    state = tempfile.mkdtemp(prefix="meshrun-bench-")
    env = dict(
        os.environ,
        MESHRUN_CLUSTER_DIR=state,
        MESHRUN_CLUSTER_NAME="meshrun-bench",
        NODES="0",
        REAL_NODE="0",
    )
    script = str(ROOT / "hack" / "cluster.sh")
    try:
        t0 = time.monotonic()
        subprocess.run([script, "up"], env=env, check=True, capture_output=True, text=True)
        start_s = time.monotonic() - t0
        print(
            f"control plane start (etcd, apiserver, controller-manager, scheduler, kwok): "
            f"{start_s:.1f} s"
        )

        kubeconfig = str(Path(state) / "kubeconfig")
        nodes = subprocess.run(
            ["python3", str(ROOT / "hack" / "kwok" / "nodes.py"), str(args.nodes)],
            capture_output=True,
            text=True,
            check=True,
        )
        t0 = time.monotonic()
        subprocess.run(
            [str(KUBECTL), "--kubeconfig", kubeconfig, "create", "-f", "-"],
            input=nodes.stdout,
            check=True,
            capture_output=True,
            text=True,
        )
        created_s = time.monotonic() - t0
        deadline = time.monotonic() + 600
        ready = 0
        while time.monotonic() < deadline:
            ready = ready_nodes(kubeconfig)
            if ready >= args.nodes:
                break
            time.sleep(1)
        ready_s = time.monotonic() - t0
        print(
            f"{args.nodes} fake GPU nodes: created in {created_s:.1f} s, "
            f"{ready} Ready after {ready_s:.1f} s"
        )
        return 0 if ready >= args.nodes else 1
    finally:
        subprocess.run([script, "down"], env=env, capture_output=True)


if __name__ == "__main__":
    raise SystemExit(main())
