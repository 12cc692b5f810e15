"""Time the planner on a 16,384-GPU 3D job (targets: plan_job + to_dict under 50 ms, auto's
search of every layout with its step-time estimates under 100 ms warm).

Run: .venv/bin/python bench/planner.py [--repeat N]
Prints the median and worst of N runs for plan_job, Plan.to_dict and json.dumps, and for
the same machines with strategy auto (which searches the layouts).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

from meshrun.planner.plan import plan_job

TARGET_MS = 50.0
AUTO_TARGET_MS = 100.0
NODES, PROCS = 2048, 8
SPEC: dict[str, Any] = {
    "image": "trainer:1",
    "resources": {"numNodes": NODES, "numProcPerNode": PROCS, "acceleratorMemoryGiB": 80},
    "strategy": {
        "type": "hybrid",
        "dataParallel": 256,
        "pipelineParallel": 8,
        "tensorParallel": 8,
        "zeroStage": 1,
        "pipelineSchedule": "interleaved-1f1b",
        "virtualStages": 2,
    },
    "model": {"preset": "70b"},
    "training": {"globalBatchSize": 4096, "microBatchSize": 1},
}


def timed(action: Callable[[], object], repeat: int) -> tuple[float, float]:
    """(median, worst) wall time of ``action`` in milliseconds."""
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        action()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples), max(samples)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20, help="runs per measurement")
    repeat = parser.parse_args().repeat
    # auto as a user would write it: degrees and the micro-batch size left to the planner.
    auto_spec = {**SPEC, "strategy": {"type": "auto"}, "training": {"globalBatchSize": 4096}}
    plan = plan_job(SPEC, "bench")
    data = plan.to_dict()
    rows = [
        ("plan_job + to_dict (3D)", timed(lambda: plan_job(SPEC, "bench").to_dict(), repeat)),
        ("plan_job alone", timed(lambda: plan_job(SPEC, "bench"), repeat)),
        ("Plan.to_dict", timed(plan.to_dict, repeat)),
        ("json.dumps(to_dict)", timed(lambda: json.dumps(data), repeat)),
        ("plan_job (auto search)", timed(lambda: plan_job(auto_spec, "bench"), repeat)),
    ]
    print(
        f"{NODES * PROCS} GPUs ({NODES} pods x {PROCS}), 70b, {plan.layout.text()}, "
        f"{repeat} runs each"
    )
    for name, (median, worst) in rows:
        print(f"  {name:<26} median {median:7.2f} ms   worst {worst:7.2f} ms")
    auto = plan_job(auto_spec, "bench")  # warm: the runs above filled every cache
    est = auto.estimate
    speed = f", predicted {est.tokens_per_second_per_gpu:,.0f} tokens/s per GPU" if est else ""
    print(
        f"  auto chose {auto.strategy} {auto.layout.text()} ZeRO-{auto.layout.zero_stage} "
        f"{auto.layout.schedule} v{auto.layout.virtual_stages} mbs{auto.layout.micro_batch_size} "
        f"({auto.activation_checkpointing} recompute){speed}"
    )
    passed = True
    for (name, (median, _)), target in ((rows[0], TARGET_MS), (rows[-1], AUTO_TARGET_MS)):
        verdict = "PASS" if median < target else "FAIL"
        passed = passed and verdict == "PASS"
        print(f"{verdict}: {name} median {median:.2f} ms (target < {target:.0f} ms)")
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
