"""How well the step-time and memory models rank the layouts of published measured runs.

Run: PYTHONPATH=.:operator:trainer .venv/bin/python bench/planner_ranking.py [--groups]
Prints, over every published run the tests hold (tests/core/test_sweep.py's sweep,
tests/core/test_calibration.py's rows and its table of same-model layouts), each group's
Spearman rank correlation of predicted against measured tokens/s per GPU and the measured
speed of the layout predicted fastest over the measured fastest (a group is one model on one
machine and cluster size), the median error, and the completed runs the memory model refuses.
With --residuals, the sweep's measured step time beyond the predicted one, per block and
micro-batch, by tensor-parallel degree, without and with a pipeline.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "core"))

import test_calibration as calibration
import test_sweep as sweep

from meshrun.planner.plan import plan_job

Run = tuple[str, str, dict[str, Any], float]
"""(group, name, spec, measured tokens/s per GPU)."""


def runs() -> dict[str, list[Run]]:
    """The published runs by source."""
    found: dict[str, list[Run]] = {
        "sweep": [
            (
                f"{r['model']} {r['nodes']}n",
                f"{r['model']} {r['nodes']}n dp{r['dp']} tp{r['tp']} pp{r['pp']} "
                f"z{r['zero']} mbs{r['mbs']}",
                sweep.spec_of(r),
                r["tokens_per_s_per_gpu"],
            )
            for r in sweep.read_sweep()
        ],
        "calibration": [("", name, spec, measured) for name, spec, measured in calibration.ROWS],
    }
    grouped = getattr(calibration, "LAYOUT_ROWS", None)
    if grouped is not None:
        found["layouts"] = [(g, n, s, m) for g, n, s, m in grouped]
    return found


def spearman(xs: list[float], ys: list[float]) -> float:
    return sweep.spearman(xs, ys)


def sweep_residuals(max_nodes: int = 16, max_micro_batch: int = 4) -> None:
    """The sweep's measured step beyond the predicted one, in ms per block a pipeline rank runs
    and per micro-batch, median by TP degree and by whether the layout has a pipeline (runs
    up to ``max_nodes`` nodes, where the cluster measured steadily, at micro-batches up to
    ``max_micro_batch``, where a block's compute is short)."""
    gaps: dict[tuple[int, bool], list[float]] = defaultdict(list)
    for run in sweep.read_sweep():
        if run["nodes"] > max_nodes or run["mbs"] > max_micro_batch:
            continue
        plan = plan_job(sweep.spec_of(run), "bench")
        assert plan.estimate is not None
        gpus = run["nodes"] * 8
        measured = sweep.BATCH * sweep.SEQUENCE / (run["tokens_per_s_per_gpu"] * gpus)
        blocks = sweep.MODELS[run["model"]]["layers"] / run["pp"]
        gap = (measured - plan.estimate.step_seconds) / (run["gas"] * blocks)
        gaps[(run["tp"], run["pp"] > 1)].append(gap * 1e3)
    print(
        f"sweep, measured beyond predicted (ms per block and micro-batch, median; "
        f"<= {max_nodes} nodes, micro-batch <= {max_micro_batch}):"
    )
    for tp in sorted({tp for tp, _ in gaps}):
        cells = [
            f"{'with' if piped else 'without'} a pipeline "
            f"{statistics.median(gaps[(tp, piped)]):+6.1f} ({len(gaps[(tp, piped)])} runs)"
            for piped in (False, True)
            if gaps[(tp, piped)]
        ]
        print(f"  TP {tp:2d}: " + ", ".join(cells))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--groups", action="store_true", help="print every group")
    parser.add_argument("--rows", action="store_true", help="print every non-sweep row")
    parser.add_argument(
        "--residuals", action="store_true", help="the sweep's time beyond the model, by TP and PP"
    )
    args = parser.parse_args()
    if args.residuals:
        sweep_residuals()
        return
    start = time.perf_counter()
    for source, rows in runs().items():
        errors: list[float] = []
        refused: list[str] = []
        groups: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
        for group, name, spec, measured in rows:
            plan = plan_job(spec, "bench")
            assert plan.estimate is not None
            predicted = plan.estimate.tokens_per_second_per_gpu
            errors.append(predicted / measured - 1)
            if not plan.memory.fits:
                refused.append(f"{name} ({plan.memory.total / plan.memory.accelerator_bytes:.0%})")
            if group:
                groups[group].append((measured, predicted, name))
            if args.rows and source != "sweep":
                print(
                    f"  {name}: measured {measured:,.0f} predicted {predicted:,.0f} "
                    f"({predicted / measured - 1:+.0%}) mem "
                    f"{plan.memory.total / 2**30:.1f} GiB"
                )
        rho: dict[str, float] = {}
        pick: dict[str, float] = {}
        for key, group in groups.items():
            if len(group) >= 3:
                rho[key] = spearman([m for m, _, _ in group], [p for _, p, _ in group])
            if len(group) >= 2:
                best = max(m for m, _, _ in group)
                pick[key] = max(group, key=lambda e: e[1])[0] / best
        print(
            f"{source}: {len(rows)} runs, median |error| "
            f"{statistics.median(abs(e) for e in errors):.1%}, refused {len(refused)}"
        )
        if rho:
            print(
                f"  rank correlation: median {statistics.median(rho.values()):+.2f}, "
                f">= 0.6 in {sum(v >= 0.6 for v in rho.values())}/{len(rho)} groups"
            )
        if pick:
            print(
                f"  pick/best: median {statistics.median(pick.values()):.2f}, >= 0.9 in "
                f"{sum(v >= 0.9 for v in pick.values())}/{len(pick)} groups, "
                f"worst {min(pick.values()):.2f}"
            )
        if args.groups:
            for key in sorted(pick):
                print(
                    f"    {key}: rho {rho.get(key, float('nan')):+.2f} "
                    f"pick {pick[key]:.2f} ({len(groups[key])} runs)"
                )
        for name in refused[:20]:
            print(f"  refused: {name}")
    print(f"({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
