"""The pod entrypoint: ``python -m torch.distributed.run -m meshrun_trainer`` (torchrun)."""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import torch.distributed as dist

from meshrun_trainer.config import ConfigError, TrainConfig, from_env
from meshrun_trainer.mesh import build_mesh, init_distributed, pick_device
from meshrun_trainer.parallel import data_parallel_kind
from meshrun_trainer.progress import Reporter
from meshrun_trainer.train import TrainResult, peak_memory, train


def summarize(cfg: TrainConfig, result: TrainResult, peaks: list[int]) -> dict[str, Any]:
    records = result.records
    timed = records[1:] or records  # the first step pays one-off warm-up costs
    tokens_per_s = (
        cfg.tokens_per_step * len(timed) / sum(r.step_time_s for r in timed) if timed else 0.0
    )
    layout = dataclasses.asdict(cfg.layout)
    layout["dataParallel"] = data_parallel_kind(cfg.layout)
    return {
        "status": "Succeeded",
        "steps": cfg.training.steps,
        "resumedFromStep": result.resumed_from,
        "finalLoss": records[-1].loss if records else None,
        "losses": [r.loss for r in records],
        "tokensPerSecond": tokens_per_s,
        "peakMemoryBytes": peaks,
        "peakMemoryKind": peak_memory()[1],
        "layout": layout,
    }


def main() -> int:
    try:
        cfg = from_env()
    except ConfigError as error:
        print(f"meshrun-trainer: invalid configuration: {error}", file=sys.stderr)
        return 2
    device = pick_device()
    init_distributed(device)
    mesh = build_mesh(cfg.layout, device)
    reporter = Reporter(cfg) if dist.get_rank() == 0 else None
    result = train(cfg, mesh, on_step=reporter.on_step if reporter else None)
    peaks: list[int] = [0] * dist.get_world_size()
    dist.all_gather_object(peaks, peak_memory()[0])
    if reporter is not None:
        reporter.finish(summarize(cfg, result, peaks))
    dist.barrier()
    dist.destroy_process_group()
    return 0
