"""``--profile``: where a launch's time and requests go, for each operator.

From the audit log of the launches already measured: the requests per job by verb and resource,
what each write to a job object carried (kopf's progress annotations, its last-handled
configuration, status...), and the timeline of a 128-pod launch (first request, the creates and
their rate, the status writes, the scheduler's bindings, the fake kubelets' Running).
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence

from _scale_audit import Request, by_key, job_write_kind
from _scale_launch import Launch

JOB_RESOURCES = ("paralleltrainingjobs", "pytorchjobs")


def _ms(seconds: Sequence[float]) -> str:
    if not seconds:
        return "-"
    ordered = sorted(seconds)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    return f"median {statistics.median(ordered) * 1e3:.0f} ms, p90 {p90 * 1e3:.0f} ms"


def requests_by_kind(launches: Sequence[Launch], scenario: str) -> list[str]:
    """Requests per job by verb and resource, mean over the launches, one column per operator."""
    operators = list(dict.fromkeys(x.operator for x in launches))
    per_op: dict[str, Counter[str]] = {}
    for op in operators:
        mine = [x for x in launches if x.operator == op and x.scenario == scenario]
        total: Counter[str] = Counter()
        for x in mine:
            total.update(by_key(x.requests))
        per_op[op] = Counter({k: v / sum(x.jobs for x in mine) for k, v in total.items()})
        writes: Counter[str] = Counter()
        for x in mine:
            writes.update(f"  {_label(r)}" for r in x.requests if _label(r) != r.key)
        per_op[op].update({k: v / sum(x.jobs for x in mine) for k, v in writes.items()})
    keys = sorted({k for c in per_op.values() for k in c}, key=lambda k: (k.startswith("  "), k))
    width = max([len(k) for k in keys] + [24])
    lines = [f"  {'per job':<{width}} " + " ".join(f"{op:>18}" for op in operators)]
    for key in sorted(keys, key=lambda k: -max(c.get(k, 0) for c in per_op.values())):
        cells = " ".join(f"{per_op[op].get(key, 0):>18.2f}" for op in operators)
        lines.append(f"  {key:<{width}} {cells}")
    totals = " ".join(
        f"{sum(v for k, v in per_op[op].items() if not k.startswith('  ')):>18.2f}"
        for op in operators
    )
    lines.append(f"  {'total':<{width}} {totals}")
    return lines


def _label(r: Request) -> str:
    """``verb resource``, and for a write to a job object what it carried."""
    if r.resource.split("/")[0] in JOB_RESOURCES and r.verb in ("patch", "update"):
        return f"{r.key} [{job_write_kind(r)}]"
    return r.key


def timeline(launch: Launch, user: str) -> list[str]:
    """When each kind of request began and ended in one launch, from the first create."""
    t0 = launch.start
    mine = [r for r in launch.window if r.user == user]
    lines = [f"  {launch.operator}: {len(mine)} requests; operator CPU {launch.cpu_s:.2f} s"]
    groups: dict[str, list[Request]] = {}
    for r in sorted(mine, key=lambda r: r.received):
        groups.setdefault(_label(r), []).append(r)
    for label, group in groups.items():
        first, last = group[0].received - t0, group[-1].done - t0
        if len(group) == 1:
            lines.append(f"    +{first:6.2f} s            {label}")
            continue
        rate = len(group) / max(last - first, 1e-3)
        latency = _ms([r.done - r.received for r in group])
        lines.append(
            f"    +{first:6.2f} to +{last:6.2f} s  {label} x{len(group)} "
            f"({rate:.0f}/s; each {latency})"
        )
    created = {r.name: r.done for r in launch.window if r.key == "create pods" and r.user == user}
    binds = [r for r in launch.window if r.resource == "pods/binding"]  # only the scheduler binds
    lags = [b.done - created[b.name] for b in binds if b.name in created]
    statuses = [r for r in launch.window if r.resource == "pods/status" and r.verb == "patch"]
    running = [r.done - t0 for r in statuses]
    if binds:
        lines.append(
            f"    scheduler: first binding +{min(b.done for b in binds) - t0:.2f} s, last "
            f"+{max(b.done for b in binds) - t0:.2f} s; pod create to binding {_ms(lags)}"
        )
    if running:
        lines.append(f"    fake kubelets: last pod status write +{max(running):.2f} s")
    lines.append(
        f"    every pod Running (watch) +{_s(launch.pods_running_s)}, "
        f"job status Running +{_s(launch.jobs_running_s)}"
    )
    return lines


def _s(seconds: float | None) -> str:
    return "timeout" if seconds is None else f"{seconds:.2f} s"


def scheduler_lags(window: Sequence[Request], t0: float) -> dict[str, float]:
    """From a namespace's requests: last create, last binding, and the create-to-binding lags."""
    created = {r.name: r.done for r in window if r.key == "create pods"}
    binds = [r for r in window if r.resource == "pods/binding"]
    lags = [b.done - created[b.name] for b in binds if b.name in created]
    return {
        "last_create": max(created.values(), default=t0) - t0,
        "last_binding": max((b.done for b in binds), default=t0) - t0,
        "lag_median": statistics.median(lags) if lags else float("nan"),
        "lag_max": max(lags, default=float("nan")),
    }
