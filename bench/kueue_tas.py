"""Pipeline neighbours across racks, with and without Kueue's topology-aware scheduling.

On the local cluster (started when down, Kueue added by hack/kueue/up.sh), a private pool of
``--nodes`` fake 8-GPU nodes (racks of 4, blocks of 16: hack/kwok/nodes.py) is filled with one
mix of pipeline jobs (2 x 16 pods in 4 stages, 2 x 8 pods in 2 stages, 4 x 4 pods in 2 stages:
64 whole nodes), queued through Kueue and run by the operator, three times:

- ``kube-scheduler``: no queue, no spec.scheduling.topologyKey (the pods select the pool through
  spec.podTemplate), so the default scheduler alone places them;
- ``pod affinity``: the same with topologyKey, the operator run without its node watch
  (``--no-watch-nodes``), so the pods prefer their stage's other pods (inter-pod affinity);
- ``node affinity``: the same, the operator as it runs by default: it chooses each stage's rack
  from the nodes' free GPUs and the pods prefer it (node affinity);
- ``Kueue TAS``: queued through Kueue on a flavor with the block / rack / host Topology, jobs
  with topologyKey (one preferred topology request per stage; the pods go to the admitted
  hosts).

For each it prints, from the jobs' status.placement and the nodes' rack labels, the pod pairs
in different racks: pipeline neighbours (a pod and the pod of the next stage holding the same
pipelines' ranks: activations), stage neighbours (consecutive pods of one stage: its
data-parallel all-reduce ring) and stages spread over more than one rack.

    python bench/kueue_tas.py                # 64 nodes, one round
    python bench/kueue_tas.py --rounds 3     # mean over three rounds of each

Everything it adds (nodes, namespace, Kueue objects) is removed at the end.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from meshrun.api.layout import coordinates_of, rank_at
from meshrun.localnet import free_port
from meshrun.planner.plan import plan_job

ROOT = Path(__file__).resolve().parents[1]
KUBECONFIG = ROOT / ".cluster" / "kubeconfig"
KUBECTL = ROOT / ".cluster" / "bin" / "kubectl"
API = "kueue.x-k8s.io/v1beta2"
POOL = "tasbench"
POOL_LABEL = "meshrun.dev/pool"
RACK = "topology.meshrun.dev/rack"
LEVELS = ["topology.meshrun.dev/block", RACK, "kubernetes.io/hostname"]
RACK_NODES = 4  # hack/kwok/nodes.py
MIX = [(16, 4)] * 2 + [(8, 2)] * 2 + [(4, 2)] * 4  # (pods, stages): 64 pods of 8 GPUs


@dataclass(frozen=True)
class Scenario:
    label: str
    queue: str | None
    topology: bool
    flags: tuple[str, ...] = ()
    """The operator's extra flags."""


SCENARIOS = [
    Scenario("kube-scheduler", None, topology=False),
    Scenario("pod affinity", None, topology=True, flags=("--no-watch-nodes",)),
    Scenario("node affinity", None, topology=True),
    Scenario("Kueue TAS", "tas", topology=True),
]
TOLERATION = {"key": POOL_LABEL, "operator": "Equal", "value": POOL, "effect": "NoSchedule"}


def kubectl(*args: str, input: str | None = None, check: bool = True) -> str:
    proc = subprocess.run(
        [str(KUBECTL), "--kubeconfig", str(KUBECONFIG), *args],
        input=input,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if check and proc.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)}: {proc.stderr}")
    return proc.stdout


def apply(*objects: dict[str, Any]) -> None:
    items = {"apiVersion": "v1", "kind": "List", "items": list(objects)}
    kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps(items))


def wait(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up waiting for {what}")
        time.sleep(0.5)


def kueue_objects(namespace: str, nodes: int) -> list[dict[str, Any]]:
    """The Topology, a flavor of the pool with it, a ClusterQueue and a LocalQueue."""
    name = "tas-bench"
    flavor = {"nodeLabels": {POOL_LABEL: POOL}, "tolerations": [TOLERATION], "topologyName": name}
    quota = {"name": "nvidia.com/gpu", "nominalQuota": str(nodes * 8)}
    group = {"coveredResources": [quota["name"]], "flavors": [{"name": name, "resources": [quota]}]}
    specs = [
        ("Topology", name, {"levels": [{"nodeLabel": level} for level in LEVELS]}),
        ("ResourceFlavor", name, flavor),
        ("ClusterQueue", name, {"namespaceSelector": {}, "resourceGroups": [group]}),
        ("LocalQueue", "tas", {"clusterQueue": name}),
    ]
    return [
        {"apiVersion": API, "kind": kind, "metadata": {"name": obj}, "spec": spec}
        | ({"metadata": {"name": obj, "namespace": namespace}} if kind == "LocalQueue" else {})
        for kind, obj, spec in specs
    ]


def job_spec(pods: int, stages: int, queue: str | None, topology: bool) -> dict[str, Any]:
    scheduling: dict[str, Any] = {"queueName": queue} if queue else {}
    if topology:
        scheduling["topologyKey"] = RACK
    # Without Kueue the pods select the pool themselves (with Kueue its flavor does).
    pinned = {"spec": {"nodeSelector": {POOL_LABEL: POOL}, "tolerations": [TOLERATION]}}
    return {
        **({} if queue else {"podTemplate": pinned}),
        "image": "meshrun/trainer:bench",
        "resources": {"numNodes": pods, "numProcPerNode": 8},
        "strategy": {"type": "pipeline", "pipelineParallel": stages},
        "model": {"preset": "1b"},
        "training": {"steps": 10, "globalBatchSize": 512, "microBatchSize": 1},
        "scheduling": scheduling,
    }


def neighbours(spec: dict[str, Any], name: str) -> set[tuple[int, int]]:
    """Pod index pairs (stage s, stage s + 1) that hold the same pipeline's ranks."""
    plan = plan_job(spec, name=name)
    layout, per_pod = plan.layout, plan.num_proc_per_node
    pairs = set()
    for rank in range(plan.world_size):
        c = coordinates_of(rank, layout.degrees)
        if c["pp"] + 1 < layout.pp:
            peer = rank_at({**c, "pp": c["pp"] + 1}, layout.degrees)
            pairs.add((rank // per_pod, peer // per_pod))
    return pairs


KINDS = ("pipeline neighbours", "stage neighbours", "stages over racks")
"""Pod pairs in different racks: a pod and the next stage's pod of the same pipelines
(activations), consecutive pods of one stage (its data-parallel ring); and whole stages."""
Counts = dict[str, list[int]]  # kind -> [in different racks, all]


def measure(spec: dict[str, Any], name: str, placement: list[Any], racks: dict[str, str]) -> Counts:
    counts: Counts = {kind: [0, 0] for kind in KINDS}
    rows = {int(r["pod"].rsplit("-", 1)[1]): r for r in placement}
    rack_of = {index: racks[row["node"]] for index, row in rows.items()}
    stages: dict[int, list[int]] = {}
    for index in sorted(rows):
        stages.setdefault(rows[index]["stage"], []).append(index)
    pairs = {
        KINDS[0]: sorted(neighbours(spec, name)),
        KINDS[1]: [p for pods in stages.values() for p in itertools.pairwise(pods)],
    }
    for kind, found in pairs.items():
        counts[kind] = [sum(rack_of[a] != rack_of[b] for a, b in found), len(found)]
    spread = [len({rack_of[i] for i in pods}) > 1 for pods in stages.values()]
    counts[KINDS[2]] = [sum(spread), len(spread)]
    return counts


def unavoidable() -> int:
    """Pipeline neighbour pairs that cross racks wherever each stage keeps to one rack: two
    consecutive stages that together outgrow a rack cannot share one."""
    total = 0
    for pods, stages in MIX:
        per_stage = pods // stages
        if 2 * per_stage > RACK_NODES:
            total += per_stage * (stages - 1)
    return total


def run_scenario(namespace: str, scenario: Scenario, racks: dict[str, str]) -> Counts:
    """Run the mix, measure the placement, delete the jobs."""
    jobs = {}
    for pods, stages in MIX:
        name = f"j{uuid.uuid4().hex[:6]}"
        jobs[name] = job_spec(pods, stages, scenario.queue, scenario.topology)
        manifest = {"apiVersion": "meshrun.dev/v1alpha1", "kind": "ParallelTrainingJob"}
        manifest["metadata"] = {"name": name, "namespace": namespace}
        apply({**manifest, "spec": jobs[name]})

    def all_running() -> bool:
        found = json.loads(kubectl("get", "ptj", "-n", namespace, "-o", "json"))["items"]
        return len(found) == len(jobs) and all(
            (j.get("status") or {}).get("phase") == "Running" for j in found
        )

    wait(all_running, 600, f"{len(jobs)} jobs Running ({scenario.label})")
    counts: Counts = {kind: [0, 0] for kind in KINDS}
    for job in json.loads(kubectl("get", "ptj", "-n", namespace, "-o", "json"))["items"]:
        name = job["metadata"]["name"]
        for kind, (cross, total) in measure(
            jobs[name], name, job["status"]["placement"], racks
        ).items():
            counts[kind] = [counts[kind][0] + cross, counts[kind][1] + total]
    kubectl("delete", "ptj", "--all", "-n", namespace, "--wait=true")
    wait(lambda: not kubectl("get", "pods", "-n", namespace, "-o", "name"), 300, "pods gone")
    wait(
        lambda: not kubectl("get", "workloads", "-n", namespace, "-o", "name"),
        300,
        "Workloads gone",
    )
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=64, help="fake 8-GPU nodes in the pool (64)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of each scenario (1)")
    args = parser.parse_args()
    if subprocess.run(
        [str(ROOT / "hack" / "cluster.sh"), "status"], capture_output=True
    ).returncode:
        subprocess.run([str(ROOT / "hack" / "cluster.sh"), "up"], check=True)
    subprocess.run([str(ROOT / "hack" / "kueue" / "up.sh")], check=True)
    namespace = f"tas-bench-{uuid.uuid4().hex[:5]}"
    nodes = subprocess.run(
        [sys.executable, str(ROOT / "hack" / "kwok" / "nodes.py"), str(args.nodes), "--pool", POOL],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    kubectl("apply", "--server-side", "-f", "-", input=nodes)
    selector = f"{POOL_LABEL}={POOL}"
    ready = '{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\\n"}{end}'
    wait(
        lambda: (
            kubectl("get", "nodes", "-l", selector, "-o", f"jsonpath={ready}").split().count("True")
            >= args.nodes
        ),
        120,
        f"{args.nodes} Ready nodes in pool {POOL}",
    )
    operator: subprocess.Popen[bytes] | None = None
    try:
        kubectl("create", "namespace", namespace)
        objects = kueue_objects(namespace, args.nodes)
        apply(*objects)
        listing = json.loads(kubectl("get", "nodes", "-l", f"{POOL_LABEL}={POOL}", "-o", "json"))
        racks = {n["metadata"]["name"]: n["metadata"]["labels"][RACK] for n in listing["items"]}
        print(f"{args.nodes} fake nodes in racks of {RACK_NODES}; jobs (pods, stages): {MIX}")
        print("pod pairs in different racks (mean over rounds):")
        print(f"{'placement':<16}" + "".join(f"{kind:>22}" for kind in KINDS))
        flags: tuple[str, ...] | None = None
        for scenario in SCENARIOS:
            if scenario.flags != flags:
                _stop(operator)
                operator, flags = _start_operator(namespace, scenario.flags), scenario.flags
            rounds = [run_scenario(namespace, scenario, racks) for _ in range(args.rounds)]
            print(_row(scenario.label, rounds))
        bound = unavoidable()
        print(f"{bound} pipeline neighbour pairs cross wherever each stage keeps to one rack")
    finally:
        _stop(operator)
        kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        for kind in ("clusterqueues", "resourceflavors", "topologies"):
            kubectl("delete", kind, "tas-bench", "--wait=false", check=False)
        kubectl("delete", "nodes", "-l", f"{POOL_LABEL}={POOL}", "--wait=false", check=False)
    return 0


def _start_operator(namespace: str, flags: tuple[str, ...]) -> subprocess.Popen[bytes]:
    health = free_port()
    env = {**os.environ, "KUBECONFIG": str(KUBECONFIG)}
    command = [sys.executable, "-m", "meshrun", "operator", "--namespace", namespace]
    command += ["--metrics-port", "0", "--health-port", str(health), "--resync-seconds", "0.5"]
    command += ["--no-progress-http", *flags]
    log = open(Path("/tmp") / f"{namespace}-operator.log", "ab")  # noqa: SIM115
    operator = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    wait(lambda: _healthy(health), 60, "the operator's /healthz")
    return operator


def _stop(operator: subprocess.Popen[bytes] | None) -> None:
    if operator is not None:
        operator.terminate()
        operator.wait(timeout=30)


def _row(label: str, rounds: list[Counts]) -> str:
    """One line of the table: means over the rounds."""
    cells = []
    for kind in KINDS:
        cross, total = (sum(r[kind][k] for r in rounds) for k in (0, 1))
        share = 100 * cross / total if total else 0.0
        cells.append(f"{cross / len(rounds):.1f} of {total // len(rounds)} ({share:.0f} %)")
    return f"{label:<16}" + "".join(f"{cell:>22}" for cell in cells)


def _healthy(port: int) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2):
            return True
    except OSError:
        return False


if __name__ == "__main__":
    sys.exit(main())
