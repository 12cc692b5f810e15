"""A mixture of experts on 4 processes: measured tokens/s and the all-to-alls' share of the step
beside the step-time model's, at expert parallelism 1, 2 and 4, one launch for all.

Run: .venv/bin/python bench/trainer_moe.py  (launches 4 processes; CPU unless CUDA)

Each layout trains the same MoE model (8 experts, top 2) on the same global batch for STEPS
steps under data parallelism 4; the figures are medians over steps 2..STEPS. The all-to-alls'
share is the time torch's profiler records in the all-to-all collectives (forward and backward,
the split-size exchange included) over the profiled steps' wall time, on rank 0; the estimate's
is ``breakdown.expertParallel`` over ``stepSeconds`` of the plan. On a 2-core CPU box the ranks
share cores, so an all-to-all also waits for the slowest rank's compute.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _launch import ensure_torchrun
from meshrun_trainer.local.env import layout_env

WORLD = 4

if __name__ == "__main__":
    ensure_torchrun(WORLD)

import torch.distributed as dist  # noqa: E402
import trainer_throughput as throughput  # noqa: E402  (the dense bench's model and batch)
from meshrun_trainer.config.read import read_job  # noqa: E402
from meshrun_trainer.distributed.mesh import build_mesh, init_distributed, pick_device  # noqa: E402
from meshrun_trainer.loop.train import train  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

STEPS = 5
MODEL = {
    **throughput.MODEL,
    "moe": {"experts": 8, "expertsPerToken": 2, "expertFfnHidden": 384},
}
TRAINING = {**throughput.TRAINING, "steps": STEPS}
LAYOUTS: dict[str, dict[str, Any]] = {
    "dp4 ep1": {"dp": 4},
    "dp4 ep2": {"dp": 4, "ep": 2},
    "dp4 ep4": {"dp": 4, "ep": 4},
}


def all_to_all_seconds(prof: Any) -> float:
    """Seconds the profiler saw in all-to-all collectives on this rank: their own time (self
    time, so an event nested in another is not counted twice), waiting included."""
    events = [e for e in prof.key_averages() if "all_to_all" in e.key or "alltoall" in e.key]
    return sum(e.self_cpu_time_total for e in events) / 1e6


def main() -> None:
    device = pick_device()
    init_distributed(device)
    rows = []
    for name, layout in LAYOUTS.items():
        job = read_job(layout_env(MODEL, TRAINING, **layout))
        started = time.perf_counter()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            result = train(job, build_mesh(job.plan.layout, device))
        wall = time.perf_counter() - started
        timed = result.records[1:]
        seconds = statistics.median(r.step_time_s for r in timed)
        share = all_to_all_seconds(prof) / wall
        estimate = job.plan.estimate
        assert estimate is not None
        predicted = estimate.breakdown.get("expertParallel", 0.0) / estimate.step_seconds
        rows.append((name, job.spec.tokens_per_step / seconds, seconds, share, predicted))
    if dist.get_rank() == 0:
        base = read_job(layout_env(MODEL, TRAINING, dp=WORLD))
        shape = base.plan.model
        print(
            f"mixture of experts, {WORLD} processes on {device.type}, {shape.parameters():,} "
            f"parameters ({shape.parameters(active=True):,} active per token), "
            f"{base.spec.tokens_per_step} tokens per step"
        )
        print(f"{'layout':10} {'tokens/s':>10} {'step s':>8} {'all-to-all':>11} {'estimate':>9}")
        for name, tps, seconds, share, predicted in rows:
            print(f"{name:10} {tps:>10,.0f} {seconds:>8.3f} {share:>11.1%} {predicted:>9.1%}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
