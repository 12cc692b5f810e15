"""Operator at scale on fake GPU nodes: one 1,024-GPU 3D job, then 200 concurrent 8-GPU jobs.

Prints, for each scenario, the time from creating the job(s) to every pod bound and Running and
to every job reporting phase Running, the API requests the operator sent per job (its own
``meshrun_operator_api_requests_total``; kopf's watches excluded), and the operator's peak RSS.

By default it starts a second, throwaway cluster with 1,000 KWOK nodes (its own folder and name,
so the test cluster is left alone) and removes it afterwards. ``--kubeconfig`` uses an existing
cluster instead (it must have enough free GPUs).

Usage: python bench/operator_scale.py [--nodes 1000] [--jobs 200] [--kubeconfig PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
KUBECTL = ROOT / ".cluster" / "bin" / "kubectl"
CRD = ROOT / "crds" / "meshrun.dev_paralleltrainingjobs.yaml"

BIG_JOB = {  # 128 pods x 8 GPUs = 1,024 GPUs, dp 8 x pp 16 x tp 8, the 70b preset
    "image": "meshrun/trainer:bench",
    "resources": {"numNodes": 128, "numProcPerNode": 8},
    "strategy": {
        "type": "hybrid",
        "dataParallel": 8,
        "pipelineParallel": 16,
        "tensorParallel": 8,
        "microBatches": 16,
    },
    "model": {"preset": "70b"},
    "training": {"globalBatchSize": 1024, "microBatchSize": 1},
    "scheduling": {"topologyKey": "topology.meshrun.dev/rack"},
}
SMALL_JOB = {  # one pod x 8 GPUs, DDP
    "image": "meshrun/trainer:bench",
    "resources": {"numNodes": 1, "numProcPerNode": 8},
    "strategy": {"type": "ddp"},
    "model": {"preset": "tiny"},
    "training": {"globalBatchSize": 64, "microBatchSize": 1},
}


def kubectl(kubeconfig: str, *args: str, stdin: str | None = None) -> str:
    return subprocess.run(
        [str(KUBECTL), "--kubeconfig", kubeconfig, *args],
        input=stdin,
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return str(response.read().decode())


def api_requests(port: int) -> float:
    return sum(
        float(v)
        for v in re.findall(
            r"^meshrun_operator_api_requests_total\{[^}]*\} (\S+)$", scrape(port), re.M
        )
    )


def peak_rss_mib(pid: int) -> float:
    text = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"^VmHWM:\s+(\d+) kB", text, re.M)
    return int(match.group(1)) / 1024 if match else float("nan")


def manifest(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "meshrun.dev/v1alpha1",
        "kind": "ParallelTrainingJob",
        "metadata": {"name": name},
        "spec": spec,
    }


def running_counts(kubeconfig: str, ns: str) -> tuple[int, int, int]:
    """(pods Running with a node, jobs in phase Running, pods in total) in the namespace."""
    pods = json.loads(kubectl(kubeconfig, "get", "pods", "-n", ns, "-o", "json"))["items"]
    running = sum(
        1
        for p in pods
        if p.get("spec", {}).get("nodeName") and p.get("status", {}).get("phase") == "Running"
    )
    jobs = json.loads(kubectl(kubeconfig, "get", "paralleltrainingjobs", "-n", ns, "-o", "json"))[
        "items"
    ]
    phases = sum(1 for j in jobs if (j.get("status") or {}).get("phase") == "Running")
    return running, phases, len(pods)


def scenario(
    kubeconfig: str,
    port: int,
    title: str,
    jobs: dict[str, dict[str, Any]],
    pods_expected: int,
    timeout: float,
) -> dict[str, Any]:
    ns = f"bench-{uuid.uuid4().hex[:6]}"
    kubectl(kubeconfig, "create", "namespace", ns)
    while "default" not in kubectl(kubeconfig, "get", "serviceaccounts", "-n", ns, "-o", "name"):
        time.sleep(0.2)
    before = api_requests(port)
    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=16) as pool:
        list(
            pool.map(
                lambda item: kubectl(
                    kubeconfig, "create", "-n", ns, "-f", "-", stdin=json.dumps(manifest(*item))
                ),
                jobs.items(),
            )
        )
    created = time.monotonic() - start
    pods_at = jobs_at = None
    while time.monotonic() - start < timeout:
        running, phases, _ = running_counts(kubeconfig, ns)
        now = time.monotonic() - start
        if pods_at is None and running >= pods_expected:
            pods_at = now
        if jobs_at is None and phases >= len(jobs):
            jobs_at = now
        if pods_at is not None and jobs_at is not None:
            break
        time.sleep(0.5)
    settled = api_requests(port) - before
    time.sleep(10)  # ten idle seconds: resyncs of running jobs should cost no request
    idle = api_requests(port) - before - settled
    kubectl(kubeconfig, "delete", "namespace", ns, "--wait=false")
    return {
        "title": title,
        "jobs": len(jobs),
        "pods": pods_expected,
        "create_s": created,
        "pods_running_s": pods_at,
        "jobs_running_s": jobs_at,
        "requests_per_job": settled / len(jobs),
        "idle_requests": idle,
    }


def start_cluster(nodes: int) -> tuple[str, dict[str, str]]:
    state = tempfile.mkdtemp(prefix="meshrun-opbench-")
    env = dict(
        os.environ,
        MESHRUN_CLUSTER_DIR=state,
        MESHRUN_CLUSTER_NAME="meshrun-opbench",
        NODES=str(nodes),
        REAL_NODE="0",
    )
    t0 = time.monotonic()
    subprocess.run(
        [str(ROOT / "hack" / "cluster.sh"), "up"],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    print(f"throwaway cluster with {nodes} nodes Ready in {time.monotonic() - t0:.0f} s")
    return str(Path(state) / "kubeconfig"), env


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--kubeconfig", help="use this cluster instead of a throwaway one")
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args()
    env: dict[str, str] | None = None
    kubeconfig = args.kubeconfig
    if kubeconfig is None:
        kubeconfig, env = start_cluster(args.nodes)
    operator = None
    try:
        kubectl(kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", str(CRD))
        kubectl(
            kubeconfig,
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/paralleltrainingjobs.meshrun.dev",
        )
        port, health = 18080, 18081
        log = open(tempfile.mktemp(prefix="operator-scale-", suffix=".log"), "wb")  # noqa: SIM115
        operator = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "meshrun_operator",
                "--metrics-port",
                str(port),
                "--health-port",
                str(health),
                "--no-progress-http",
            ],
            env=dict(os.environ, KUBECONFIG=kubeconfig),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                scrape(port)
                break
            except OSError:
                time.sleep(0.5)
        time.sleep(2)  # the initial listing of pods and nodes fills kopf's indexes
        results = [
            scenario(
                kubeconfig,
                port,
                "one 1,024-GPU 3D job (128 pods)",
                {"big": BIG_JOB},
                128,
                args.timeout,
            ),
            scenario(
                kubeconfig,
                port,
                f"{args.jobs} concurrent 8-GPU jobs",
                {f"small-{i}": SMALL_JOB for i in range(args.jobs)},
                args.jobs,
                args.timeout,
            ),
        ]
        rss = peak_rss_mib(operator.pid)
    finally:
        if operator is not None:
            operator.terminate()
            operator.wait(timeout=30)
        if env is not None:
            subprocess.run(
                [str(ROOT / "hack" / "cluster.sh"), "down"], env=env, capture_output=True, text=True
            )
    print(
        f"\n{'scenario':<36} {'create':>8} {'pods Running':>13} {'jobs Running':>13} "
        f"{'API req/job':>12} {'idle req':>9}"
    )
    for r in results:
        pods = f"{r['pods_running_s']:.1f} s" if r["pods_running_s"] is not None else "timeout"
        jobs = f"{r['jobs_running_s']:.1f} s" if r["jobs_running_s"] is not None else "timeout"
        print(
            f"{r['title']:<36} {r['create_s']:>6.1f} s {pods:>13} {jobs:>13} "
            f"{r['requests_per_job']:>12.1f} {r['idle_requests']:>9.0f}"
        )
    print(f"operator peak RSS: {rss:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
