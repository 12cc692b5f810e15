"""status.placement: a row per pod up to 512 pods, compact rows beyond (pure, no cluster)."""

from __future__ import annotations

import json

import pytest
from meshrun_operator.lifecycle.evaluation import evaluate
from meshrun_operator.lifecycle.summary import MAX_ROWS, PER_POD_ROWS, placement
from meshrun_operator.seen.views import PodView
from operator_harness import job_manifest

from meshrun.planner.plan import Plan

pytestmark = pytest.mark.unit


def plan_of(nodes: int, strategy: dict[str, object] | None = None) -> Plan:
    spec = job_manifest(
        "big",
        resources={"numNodes": nodes, "numProcPerNode": 8},
        training={"steps": 10, "globalBatchSize": nodes * 8, "microBatchSize": 1},
        **({"strategy": strategy} if strategy else {}),
    )["spec"]
    plan = evaluate(spec, "big").plan
    assert plan is not None
    return plan


def pods(count: int, phase: str = "Running") -> list[PodView]:
    return [PodView(f"big-{i}", i, 0, phase, node=f"n{i}") for i in range(count)]


def test_a_row_per_pod_up_to_the_limit() -> None:
    rows = placement(plan_of(PER_POD_ROWS), pods(PER_POD_ROWS), {"n1": "rack-a"})
    assert len(rows) == PER_POD_ROWS
    assert rows[1] == {
        "pod": "big-1",
        "node": "n1",
        "firstRank": 8,
        "lastRank": 15,
        "stage": 0,
        "phase": "Running",
        "domain": "rack-a",
    }


def test_beyond_it_runs_of_alike_pods_share_a_row() -> None:
    count = PER_POD_ROWS + 1
    domains = {f"n{i}": f"rack-{i // 100}" for i in range(count)}
    running = pods(count)
    running[300] = PodView("big-300", 300, 0, "Pending")  # not bound yet: no domain
    rows = placement(plan_of(count), running, domains)
    assert [(r["pods"], r["count"], r.get("domain"), r["phase"]) for r in rows] == [
        ("0-99", 100, "rack-0", "Running"),
        ("100-199", 100, "rack-1", "Running"),
        ("200-299", 100, "rack-2", "Running"),
        ("300", 1, None, "Pending"),
        ("301-399", 99, "rack-3", "Running"),
        ("400-499", 100, "rack-4", "Running"),
        ("500-512", 13, "rack-5", "Running"),
    ]
    assert rows[1]["firstRank"] == 800 and rows[1]["lastRank"] == 1599
    assert all("node" not in r and "pod" not in r for r in rows)


def test_too_many_runs_fall_back_to_coarser_rows_and_counts_always_add_up() -> None:
    count = 4096
    plan = plan_of(count)
    # Every pod in a domain of its own: runs of stage and domain would be a row per pod.
    domains = {f"n{i}": f"rack-{i}" for i in range(count)}
    rows = placement(plan, pods(count), domains)
    assert len(rows) == 1 and rows[0]["count"] == count and rows[0]["domains"] == count
    assert (rows[0]["pods"], rows[0]["firstRank"], rows[0]["lastRank"]) == ("0-4095", 0, 32767)
    # Phases alternating pod by pod: no run longer than one pod, so one row per phase.
    mixed = [PodView(f"big-{i}", i, 0, ("Running", "Pending")[i % 2]) for i in range(count)]
    rows = placement(plan, mixed, domains)
    assert rows == [{"phase": "Pending", "count": 2048}, {"phase": "Running", "count": 2048}]
    for rows in (placement(plan, pods(count), domains), placement(plan, mixed)):
        assert len(rows) <= MAX_ROWS and sum(r["count"] for r in rows) == count


def test_compact_rows_stay_small_at_the_largest_job() -> None:
    count = 65536
    mixed = [
        PodView(f"big-{i}", i, 0, "Pending" if i % 7 == 0 else "Running", node=f"n{i}")
        for i in range(count)
    ]
    rows = placement(plan_of(count), mixed, {f"n{i}": f"rack-{i // 3}" for i in range(count)})
    assert len(rows) <= MAX_ROWS and sum(r["count"] for r in rows) == count
    assert len(json.dumps(rows)) < 64 * 1024
