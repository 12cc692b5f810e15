"""Training throughput (tokens/s) of each strategy on 4 processes, one launch for all.

Run: .venv/bin/python bench/trainer_throughput.py [--tables strategies context]
     (launches 4 processes; CPU unless CUDA)

Each layout trains the same ~3.9M-parameter model on the same global batch for STEPS steps; the
figure is global tokens per second over steps 2..STEPS (step 1 pays one-off set-up costs such as
pipeline shape inference). On a 2-core CPU box the ranks share cores, so the comparison shows
communication and scheduling overheads rather than scaling.

The context table trains a model of 2,048-token sequences (4 sequences per step) with each
sequence split over 2 or 4 ranks (context parallelism) beside the same job without it (dp 4):
every layout holds the same tokens per rank, so the gap is what splitting a sequence costs (the
keys' and values' all-gather and its backward, per attention layer, and the smaller matrices).
The losses are printed too: every layout computes the same exact attention over the same batch.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _launch import ensure_torchrun
from meshrun_trainer.local.env import layout_env

WORLD = 4

if __name__ == "__main__":
    ensure_torchrun(WORLD)

import torch.distributed as dist  # noqa: E402
from meshrun_trainer.config.read import read_job  # noqa: E402
from meshrun_trainer.distributed.mesh import build_mesh, init_distributed, pick_device  # noqa: E402
from meshrun_trainer.loop.train import train  # noqa: E402

STEPS = 6
MODEL = {"layers": 4, "hidden": 256, "heads": 4, "vocab": 1024, "seqLen": 64, "ffnHidden": 768}
TRAINING = {
    "globalBatchSize": 16,
    "steps": STEPS,
    "precision": "fp32",
    "learningRate": 1e-3,
    "dataset": "synthetic",
}
LAYOUTS: dict[str, dict[str, Any]] = {
    "DDP (dp4)": {"dp": 4},
    "ZeRO-1 (dp4)": {"dp": 4, "zero_stage": 1},
    "ZeRO-2 (dp4)": {"dp": 4, "zero_stage": 2},
    "ZeRO-3 (dp4)": {"dp": 4, "zero_stage": 3},
    "PP4 1F1B m4": {"pp": 4, "micro_batches": 4},
    "PP2 x DP2 1F1B m4": {"pp": 2, "dp": 2, "micro_batches": 4},
    "PP2 interleaved v2 x DP2": {
        "pp": 2,
        "dp": 2,
        "micro_batches": 4,
        "schedule": "interleaved-1f1b",
        "virtual_stages": 2,
    },
    "TP4 + SP": {"tp": 4},
    "DP2 x TP2": {"dp": 2, "tp": 2},
    "PP2 x TP2": {"pp": 2, "tp": 2, "micro_batches": 4},
}
CONTEXT_STEPS = 4
CONTEXT_MODEL = {
    "layers": 4,
    "hidden": 256,
    "heads": 8,
    "kvHeads": 2,
    "vocab": 1024,
    "seqLen": 2048,
    "ffnHidden": 768,
}
CONTEXT_TRAINING = {**TRAINING, "globalBatchSize": 4, "steps": CONTEXT_STEPS}
CONTEXT_LAYOUTS: dict[str, dict[str, Any]] = {
    "DP4 (no cp)": {"dp": 4},
    "DP2 x CP2": {"dp": 2, "cp": 2},
    "CP4": {"cp": 4},
    "CP2 x TP2": {"cp": 2, "tp": 2},
}
TABLES = ("strategies", "context")


Row = tuple[str, float, float, float]
"""(layout, tokens/s, median step seconds, last loss)."""


def measure(
    layouts: dict[str, dict[str, Any]], model: dict[str, Any], training: dict[str, Any]
) -> list[Row]:
    """Train each layout; its tokens/s over steps 2.. (median step)."""
    device = pick_device()
    rows = []
    for name, layout in layouts.items():
        job = read_job(layout_env(model, training, **layout))
        result = train(job, build_mesh(job.plan.layout, device))
        timed = result.records[1:]
        seconds = statistics.median(r.step_time_s for r in timed)
        rows.append((name, job.spec.tokens_per_step / seconds, seconds, result.records[-1].loss))
    return rows


def report(title: str, rows: list[Row], model: dict[str, Any], training: dict[str, Any]) -> None:
    base = read_job(layout_env(model, training, dp=WORLD))
    print(
        f"{title}, {WORLD} processes on {pick_device().type}, "
        f"{base.plan.model.parameters():,} parameters, seq {model['seqLen']}, "
        f"{base.spec.tokens_per_step} tokens per step"
    )
    print(f"{'layout':28} {'tokens/s':>10} {'step s':>8} {'loss':>8}")
    for name, tps, seconds, loss in rows:
        print(f"{name:28} {tps:>10,.0f} {seconds:>8.3f} {loss:>8.4f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", nargs="+", choices=TABLES, default=list(TABLES))
    args = parser.parse_args()
    init_distributed(pick_device())
    tables = []
    if "strategies" in args.tables:
        tables.append(("throughput", measure(LAYOUTS, MODEL, TRAINING), MODEL, TRAINING))
    if "context" in args.tables:
        rows = measure(CONTEXT_LAYOUTS, CONTEXT_MODEL, CONTEXT_TRAINING)
        tables.append(("context parallelism", rows, CONTEXT_MODEL, CONTEXT_TRAINING))
    if dist.get_rank() == 0:
        for title, rows, model, training in tables:
            report(title, rows, model, training)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
