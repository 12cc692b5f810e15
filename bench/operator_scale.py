"""meshrun and Kubeflow's training-operator side by side on one cluster of fake GPU nodes.

Starts a throwaway local control plane (its own folder and name, so the test cluster is left
alone) with ``--nodes`` KWOK nodes of 8 GPUs and the API server's audit log, then runs each
operator as a plain process, one at a time, alternating (ABBA over the runs). Each run launches,
``--launches`` times each, one 128-pod x 8-GPU job (meshrun: a ParallelTrainingJob of 128 nodes;
training-operator: a PyTorchJob with 1 master and 127 workers) and ``--jobs`` concurrent 1-pod
8-GPU jobs. Figures: seconds from the first create until every pod is bound and Running (and until
every job's status says Running); the operator's API requests, counted by the API server's audit
log under the operator's own user; its CPU time per launch and peak RSS. training-operator is
built from its Go module on first use (hack/build-tools.sh training-operator).

    python bench/operator_scale.py                         # 1,000 nodes, 200 jobs, 2 x 2
    python bench/operator_scale.py --nodes 100 --jobs 20   # quick look
    python bench/operator_scale.py --profile               # also where the time goes
    python bench/operator_scale.py --write-docs            # and the table into docs/benchmarks.md
    python bench/operator_scale.py --operators meshrun,meshrun@c2006ac  # beside an earlier commit

``meshrun@COMMIT`` runs meshrun's operator as it was at that commit (a git worktree, its own
CRD installed while it runs) in the place of training-operator: "no slower than before" then
comes from one run, ABBA, on one cluster, rather than from two runs minutes apart.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _scale_audit import AuditLog
from _scale_cluster import ROOT, Cluster, start_cluster
from _scale_launch import Launch, launch
from _scale_operators import Meshrun, MeshrunAt, Operator, TrainingOperator
from _scale_probe import cpu_profile, planner_time, scheduler_share
from _scale_profile import requests_by_kind, timeline
from _scale_report import BIG, SMALL, Run, Setup, caption, table, write_docs
from kubernetes import client

OPERATORS = {"meshrun": Meshrun, "training-operator": TrainingOperator}
EARLIER = "meshrun@"
"""``meshrun@REV``: meshrun's operator at commit REV (``_scale_operators.MeshrunAt``)."""


def make_operator(name: str, cluster: Cluster) -> Operator:
    if name.startswith(EARLIER):
        return MeshrunAt(cluster, name.removeprefix(EARLIER))
    return OPERATORS[name](cluster)


def user_of(name: str) -> str:
    user: str = (MeshrunAt if name.startswith(EARLIER) else OPERATORS[name]).user
    return user


def is_commit(revision: str) -> bool:
    found = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}"],
        capture_output=True,
    )  # fmt: skip
    return bool(revision) and found.returncode == 0


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=1000, help="fake GPU nodes (default 1000)")
    parser.add_argument("--jobs", type=int, default=200, help="concurrent 1-pod jobs (200)")
    parser.add_argument("--runs", type=int, default=2, help="runs of each operator (2)")
    parser.add_argument("--launches", type=int, default=2, help="launches per scenario (2)")
    parser.add_argument(
        "--operators",
        default="meshrun,training-operator",
        help="comma-separated, the first is the ratio's numerator (default: both)",
    )
    parser.add_argument("--timeout", type=float, default=600, help="seconds per launch (600)")
    parser.add_argument("--settle", type=float, default=5, help="seconds counted after Running")
    parser.add_argument("--idle", type=float, default=10, help="idle seconds counted after that")
    parser.add_argument("--cluster-dir", help="keep (or reuse) the throwaway cluster here")
    parser.add_argument("--profile", action="store_true", help="also print where the time goes")
    parser.add_argument("--write-docs", action="store_true", help="write docs/benchmarks.md")
    args = parser.parse_args()
    names = args.operators.split(",")
    earlier = [n for n in names if n.startswith(EARLIER) and is_commit(n.removeprefix(EARLIER))]
    unknown = [n for n in names if n not in OPERATORS and n not in earlier]
    if unknown or not names:
        choices = ", ".join([*OPERATORS, f"{EARLIER}COMMIT"])
        parser.error(f"--operators: unknown {unknown}; choose from {choices}")
    if args.write_docs and any(n.startswith(EARLIER) for n in names):
        parser.error("--write-docs: the documented table compares meshrun with training-operator")
    if args.nodes < max(128, args.jobs):  # every pod takes a whole node's 8 GPUs
        parser.error(f"--nodes: {args.nodes} nodes cannot hold 128 pods or {args.jobs} jobs")
    return args


def one_run(
    operator: Operator, index: int, args: argparse.Namespace, api: client.ApiClient, audit: AuditLog
) -> Run:
    """Start the operator, launch each scenario ``--launches`` times, stop it."""
    run = Run(operator=operator.name, index=index)
    operator.start()
    try:
        for _ in range(args.launches):
            for scenario, jobs, pods in ((BIG, 1, 128), (SMALL, args.jobs, 1)):
                result = launch(
                    api, audit, operator, scenario, jobs, pods,
                    args.timeout, args.settle, args.idle,
                )  # fmt: skip
                run.launches.append(result)
                report(index, result)
        run.peak_rss_mib = operator.peak_rss_mib()
    finally:
        operator.stop()
    print(f"run {index + 1} {operator.name}: peak RSS {run.peak_rss_mib:.0f} MiB", flush=True)
    return run


def report(index: int, x: Launch) -> None:
    def s(v: float | None) -> str:
        return "timeout" if v is None else f"{v:5.1f} s"

    print(
        f"run {index + 1} {x.operator:<17} {x.jobs:>4} job(s) x {x.pods // x.jobs:>3} pod(s): "
        f"created {x.create_s:4.1f} s, pods Running {s(x.pods_running_s)}, jobs Running "
        f"{s(x.jobs_running_s)}, {len(x.requests)} requests ({x.per_job:.1f}/job), "
        f"{len(x.idle)} idle, CPU {x.cpu_s:.1f} s",
        flush=True,
    )


def profile(
    args: argparse.Namespace,
    runs: list[Run],
    meshrun: Operator | None,
    api: client.ApiClient,
    audit: AuditLog,
) -> list[str]:
    launches = [x for run in runs for x in run.launches]
    lines = ["", "== where the time goes", "", "the last 128-pod launch of each operator:"]
    for name in dict.fromkeys(run.operator for run in runs):
        last = [x for run in runs if run.operator == name for x in run.launches]
        big = [x for x in last if x.scenario == BIG]
        if big:
            lines += timeline(big[-1], user_of(name))
    for scenario, title in ((BIG, "the 128-pod job"), (SMALL, f"{args.jobs} 1-pod jobs")):
        lines += ["", f"requests by verb and resource, {title} (per job, mean of launches):"]
        lines += requests_by_kind(launches, scenario)
    if meshrun is not None:
        for scenario, jobs, pods in ((SMALL, args.jobs, 1), (BIG, 1, 128)):
            stats = Path(tempfile.mktemp(prefix="opbench-meshrun-", suffix=".samples.json"))
            meshrun.start(profile=stats)
            try:
                x = launch(
                    api, audit, meshrun, scenario, jobs, pods, args.timeout, args.settle, 0, True
                )
            finally:
                meshrun.stop()
            lines += [
                "",
                f"meshrun's CPU in one extra launch of {jobs} {pods}-pod job(s), sampled:",
            ]
            lines += cpu_profile(stats, x.cpu_s)
        lines += planner_time(meshrun.job("big", 128)["spec"])
        lines += ["", "the scheduler's share (128 pods, no operator running):"]
        if len(x.pod_specs) == 128:
            lines += scheduler_share(api, audit, x.pod_specs)
        else:
            lines.append(f"  not measured: the profiled launch left {len(x.pod_specs)} pods")
    return lines


def revision() -> str:
    """The checkout's commit, and whether the operator or core had uncommitted changes."""
    git = ["git", "-C", str(ROOT)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(
        [*git, "status", "--porcelain", "--", "operator", "meshrun", "crds"],
        capture_output=True,
        text=True,
    )
    commit = head.stdout.strip() or "an unknown commit"
    return commit + (" with uncommitted changes" if dirty.stdout.strip() else "")


def main() -> int:
    args = parse_args()
    names = args.operators.split(",")
    command = "python bench/operator_scale.py " + shlex.join(sys.argv[1:])
    setup = Setup(args.nodes, args.jobs, args.runs, args.launches, command.strip())
    setup.load = (os.getloadavg()[0], 0.0)
    setup.revision = revision()
    cluster = start_cluster(args.nodes, args.cluster_dir)
    operators: list[Operator] = []
    try:
        api = cluster.api()
        audit = AuditLog(cluster.audit_log)
        operators += [make_operator(n, cluster) for n in names]
        for operator in operators:
            operator.install()
        runs: list[Run] = []
        for index in range(args.runs):
            order = operators if index % 2 == 0 else operators[::-1]
            for operator in order:
                runs.append(one_run(operator, index, args, api, audit))
                audit.forget_before(time.time())
        meshrun = next((o for o in operators if o.name == "meshrun"), None)
        extra = profile(args, runs, meshrun, api, audit) if args.profile else []
    finally:
        cluster.down()
        for earlier in [o for o in operators if isinstance(o, MeshrunAt)]:
            earlier.remove()
    setup.load = (setup.load[0], os.getloadavg()[0])
    lines = [*caption(setup, names), "", *table(runs, setup, names)]
    print("", *lines, *extra, sep="\n")
    if args.write_docs:
        print(f"\nwrote {write_docs(lines, setup)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
