"""``--profile``'s extra measurements: the scheduler alone, the operator's CPU, the planner.

- The scheduler's share: the 128 pods meshrun built, created again by the bench in a fresh
  namespace with no operator running, alternating: as built (each stage's pods prefer the domains
  the operator chose for it, by node affinity), with the preferred inter-pod affinity the pods
  get when the operator makes no choice (same job and stage, the same topology key) instead, and
  with neither; the audit log times each binding, and the nodes' labels tell how many stages
  span more than one domain.
- Where meshrun's CPU goes in one 128-pod launch: stack samples of every thread of the operator
  (bench/_stack_sampler.py), the event loop (kopf, the handlers) apart from the API-call threads.
- The planner's own time for the 128-pod job, in this process.
"""

from __future__ import annotations

import copy
import json
import statistics
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from _scale_audit import AuditLog
from _scale_cluster import create_namespace, delete_namespace
from _scale_launch import Tally, follow, pod_running
from _scale_profile import scheduler_lags
from kubernetes import client
from meshrun_operator import names
from meshrun_operator.children.podtemplate import stage_affinity

PACKAGES = (
    "meshrun_operator",
    "meshrun",
    "kopf",
    "kubernetes",
    "aiohttp",
    "urllib3",
    "asyncio",
    "json",
    "yaml",
    "logging",
    "prometheus_client",
)


def package_of(filename: str) -> str:
    return next((p for p in PACKAGES if f"/{p}/" in filename or f"/{p}.py" in filename), "other")


def without_topology(pod: dict[str, Any]) -> dict[str, Any]:
    """The pod without the operator's topology preference (node or inter-pod affinity)."""
    pod = copy.deepcopy(pod)
    affinity = pod["spec"].get("affinity") or {}
    affinity.pop("podAffinity", None)
    affinity.pop("nodeAffinity", None)
    if not affinity:
        pod["spec"].pop("affinity", None)
    return pod


def topology_key(pod: dict[str, Any]) -> str | None:
    """The key of the node affinity the operator gave the pod, if any."""
    node = (pod["spec"].get("affinity") or {}).get("nodeAffinity") or {}
    for term in node.get("preferredDuringSchedulingIgnoredDuringExecution") or []:
        for expression in term["preference"].get("matchExpressions") or []:
            return str(expression["key"])
    return None


def with_pod_affinity(pod: dict[str, Any], key: str) -> dict[str, Any]:
    """The pod with the inter-pod preference for its stage's peers instead of the node one."""
    pod = without_topology(pod)
    labels = pod["metadata"]["labels"]
    stage = int(labels[names.LABEL_STAGE])
    stage_affinity(pod["spec"], labels[names.LABEL_JOB], stage, key)
    return pod


def spread_stages(api: client.ApiClient, ns: str, key: str) -> int:
    """Stages whose pods are in more than one domain of ``key``."""
    core = client.CoreV1Api(api)
    domain = {n.metadata.name: (n.metadata.labels or {}).get(key) for n in core.list_node().items}
    stages: dict[str, set[str | None]] = defaultdict(set)
    for pod in core.list_namespaced_pod(ns).items:
        stages[pod.metadata.labels[names.LABEL_STAGE]].add(domain.get(pod.spec.node_name))
    return sum(len(domains) > 1 for domains in stages.values())


def replay(
    api: client.ApiClient,
    audit: AuditLog,
    pods: list[dict[str, Any]],
    timeout: float,
    key: str | None = None,
) -> dict[str, float]:
    """Create ``pods`` in a fresh namespace at once; scheduler figures from the audit log."""
    ns = f"bench-replay-{int(time.time() * 1000) % 10**8}"
    create_namespace(api, ns)
    core = client.CoreV1Api(api)
    tally = Tally(len(pods), pod_running)
    stream = follow(core.list_namespaced_pod, (ns,), tally)
    time.sleep(0.5)
    start, began = time.time(), time.monotonic()
    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(lambda p: core.create_namespaced_pod(ns, p, _preload_content=False), pods))
    tally.reached.wait(timeout)
    running = None if tally.at is None else tally.at - began
    time.sleep(1)
    figures = scheduler_lags(audit.in_namespace(ns, start, time.time()), start)
    figures["running"] = float("nan") if running is None else running
    figures["spread"] = float("nan") if key is None else spread_stages(api, ns, key)
    stream.stop()
    delete_namespace(api, ns)
    return figures


def scheduler_share(
    api: client.ApiClient, audit: AuditLog, pods: list[dict[str, Any]], rounds: int = 2
) -> list[str]:
    key = topology_key(pods[0])
    if key is None:
        return ["  not measured: the pods as built carry no node affinity (no domains chosen)"]
    variants = {
        "as built (node affinity, the stage's chosen domains)": pods,
        "with the inter-pod affinity instead": [with_pod_affinity(p, key) for p in pods],
        "with neither": [without_topology(p) for p in pods],
    }
    found: dict[str, list[dict[str, float]]] = defaultdict(list)
    for _ in range(rounds):
        for name, variant in variants.items():
            found[name].append(replay(api, audit, variant, timeout=120, key=key))
    stages = len({p["metadata"]["labels"][names.LABEL_STAGE] for p in pods})
    lines = [
        f"  {len(pods)} pods created by the bench at once (16 at a time), no operator; stages "
        f"over more than one {key} of {stages}:"
    ]
    for name, results in found.items():

        def mean(key: str, results: list[dict[str, float]] = results) -> float:
            return statistics.fmean(r[key] for r in results)

        lines.append(
            f"    {name}: last create +{mean('last_create'):.2f} s, last binding "
            f"+{mean('last_binding'):.2f} s, all Running +{mean('running'):.2f} s; create to "
            f"binding median {mean('lag_median') * 1e3:.0f} ms, max {mean('lag_max') * 1e3:.0f} "
            f"ms; {mean('spread'):.1f} stages spread"
        )
    return lines


def _short(where: str) -> str:
    filename, line, function = where.rsplit(":", 2)
    return f"{'/'.join(Path(filename).parts[-2:])}:{line} {function}"


ROLES = (("loop", "event-loop thread (kopf, handlers)"), ("other", "other threads (API calls)"))


def _percent(pairs: list[tuple[str, int]], busy: int, sep: str) -> str:
    return sep.join(f"{name} {100 * count / busy:.0f}%" for name, count in pairs)


def _ours(where: str) -> bool:
    """meshrun's own code, or a deep copy (the profile's usual suspect)."""
    package = package_of(where.rsplit(":", 2)[0])
    return package in ("meshrun_operator", "meshrun") or where.endswith(":deepcopy")


def cpu_profile(path: Path, process_cpu: float, top: int = 12) -> list[str]:
    """Busy samples of the operator's threads: by package, innermost functions, and steps."""
    data = json.loads(path.read_text())
    interval, samples = data["interval"], data["samples"]
    lines = [
        f"  operator CPU in the launch: {process_cpu:.2f} s; stack samples every "
        f"{interval * 1e3:.0f} ms, busy (not waiting) out of all, per thread kind:"
    ]
    for role, title in ROLES:
        busy, seen = samples.get(f"{role} busy", 0), samples.get(role, 0)
        own: dict[str, int] = data["own"][role]
        if not busy:
            lines.append(f"    {title}: no busy samples of {seen}")
            continue
        lines.append(f"    {title}: {busy} busy of {seen} (~{busy * interval:.1f} s busy)")
        by_package: dict[str, int] = defaultdict(int)
        for where, count in own.items():
            by_package[package_of(where.rsplit(":", 2)[0])] += count
        ranked = sorted(by_package.items(), key=lambda kv: -kv[1])
        shares = [(name, count) for name, count in ranked if count >= busy / 100]
        lines.append("      own, by package: " + _percent(shares, busy, ", "))
        innermost = [(_short(w), c) for w, c in list(own.items())[: top // 2]]
        lines.append("      innermost functions: " + _percent(innermost, busy, "; "))
        inclusive: dict[str, int] = data["inclusive"][role]
        lines.append("      meshrun's functions on the stack (share of busy samples):")
        for where, count in [(w, c) for w, c in inclusive.items() if _ours(w)][:top]:
            lines.append(f"        {100 * count / busy:5.1f}%  {_short(where)}")
    return lines


def planner_time(spec: dict[str, Any], repeat: int = 20) -> list[str]:
    """plan_job and the status dict for the 128-pod job, as the operator computes them."""
    from meshrun.planner.plan import plan_job

    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        json.dumps(plan_job(spec, "big").to_dict())
        samples.append(time.perf_counter() - started)
    return [
        f"  planner, 128-pod job: plan_job + to_dict + json {statistics.median(samples) * 1e3:.1f} "
        f"ms median of {repeat} (worst {max(samples) * 1e3:.1f} ms)"
    ]
