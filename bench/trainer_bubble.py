"""Measured pipeline bubble for p = 2, 4 and m = 4, 8 beside (p - 1) / (m + p - 1).

Run: .venv/bin/python bench/trainer_bubble.py [--schedule 1f1b|gpipe]  (launches 4 processes)

Bubble fraction (Narayanan et al. 2021, arXiv 2104.04473, section 2.2): the share of a pipeline
step a stage sits idle, (p - 1) / (m + p - 1) for GPipe and 1F1B. Measured per rank as
1 - busy / step. step: wall time of one schedule step (torch.distributed.pipelining, real
point-to-point sends), the slowest rank's, since the step ends when it does. busy: m x (forward
+ backward of one micro-batch). The tables show the mean over ranks. Two measurements:

- timed stages: each stage's forward/backward sleeps a fixed time (busy is known exactly and
  sleeping ranks do not compete for cores), so this isolates the schedule's own bubble plus the
  per-message overhead of the sends;
- model stages: the meshrun transformer split evenly, busy timed on each rank alone. With fewer
  cores than ranks (this CI box: 2 cores, 4 ranks) the ranks slow each other unevenly and the
  figure is only indicative; on one accelerator per rank it approaches the formula.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _launch import ensure_torchrun
from meshrun_trainer.local.env import layout_env

WORLD = 4

if __name__ == "__main__":
    ensure_torchrun(WORLD)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from meshrun_trainer.config.read import read_job  # noqa: E402
from meshrun_trainer.distributed.mesh import build_mesh, init_distributed, pick_device  # noqa: E402
from meshrun_trainer.loop.train import build_runner, forward_backward  # noqa: E402
from meshrun_trainer.models.llama import build_model  # noqa: E402
from torch import nn  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.pipelining import PipelineStage  # noqa: E402
from torch.distributed.pipelining.schedules import Schedule1F1B, ScheduleGPipe  # noqa: E402

MICRO_BATCH = 2
FORWARD_S, BACKWARD_S = 0.02, 0.04
"""Timed stages: backward costs about twice the forward, as in a transformer."""
REPEATS = 5
MODEL = {"layers": 8, "hidden": 256, "heads": 4, "vocab": 256, "seqLen": 128, "ffnHidden": 768}
TRAINING = {"precision": "fp32", "learningRate": 1e-3, "dataset": "synthetic"}


class _Sleep(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):  # type: ignore[no-untyped-def,override]
        time.sleep(FORWARD_S)
        return x.clone()

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def,override]
        time.sleep(BACKWARD_S)
        return grad


class TimedStage(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Sleep.apply(self.linear(x))  # type: ignore[no-any-return]


def timed_bubbles(schedule_name: str, p: int, m: int, device: torch.device) -> list[float]:
    mesh = init_device_mesh(device.type, (p, WORLD // p), mesh_dim_names=("pp", "dp"))
    pp_rank = mesh.get_local_rank("pp")
    stage = PipelineStage(TimedStage(), pp_rank, p, device, group=mesh["pp"].get_group())
    kind = ScheduleGPipe if schedule_name == "gpipe" else Schedule1F1B
    schedule = kind(stage, n_microbatches=m, loss_fn=lambda out, _: out.pow(2).mean())
    x = torch.randn(m * MICRO_BATCH, 8)

    def step() -> None:
        if pp_rank == 0:
            schedule.step(x)
        elif pp_rank == p - 1:
            schedule.step(target=x, losses=[])
        else:
            schedule.step()

    step()  # warm-up (shape inference)
    times = []
    for _ in range(3):
        dist.barrier()
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    bubble = torch.tensor([1 - m * (FORWARD_S + BACKWARD_S) / pipeline_time(times)])
    gathered = [torch.zeros_like(bubble) for _ in range(WORLD)]
    dist.all_gather(gathered, bubble)
    return [float(g) for g in gathered]


def pipeline_time(times: list[float]) -> float:
    """The step ends when the slowest rank ends: the median step time, maximised over ranks."""
    step = torch.tensor([statistics.median(times)], dtype=torch.float64)
    dist.all_reduce(step, op=dist.ReduceOp.MAX)
    return float(step)


def stage_busy_time(job, stage_layers: tuple[int, int], first: bool, m: int) -> float:  # type: ignore[no-untyped-def]
    """Forward + backward of m micro-batches through this stage alone (no communication)."""
    model = build_model(job.plan.model, 0, stage_layers)
    shape = (MICRO_BATCH, job.plan.model.seq_len)
    x = (
        torch.randint(0, job.plan.model.vocab, shape)
        if first
        else torch.randn(*shape, job.plan.model.hidden, requires_grad=True)
    )
    out = model(x)
    out.float().pow(2).mean().backward()  # warm-up
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        for _ in range(m):
            model(x).float().pow(2).mean().backward()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def step_time(job, mesh, m: int) -> float:  # type: ignore[no-untyped-def]
    runner = build_runner(job, mesh)
    batch = m * MICRO_BATCH
    x = torch.randint(0, job.plan.model.vocab, (batch, job.plan.model.seq_len))
    forward_backward(job.plan.layout, runner, x, x)  # warm-up (shape inference)
    times = []
    for _ in range(REPEATS):
        dist.barrier()
        start = time.perf_counter()
        forward_backward(job.plan.layout, runner, x, x)
        times.append(time.perf_counter() - start)
        for opt in runner.optimizers:
            opt.zero_grad(set_to_none=True)
    return pipeline_time(times)


def main() -> None:
    schedule = sys.argv[sys.argv.index("--schedule") + 1] if "--schedule" in sys.argv else "1f1b"
    device = pick_device()
    init_distributed(device)
    rank = dist.get_rank()
    timed = [(p, m, timed_bubbles(schedule, p, m, device)) for p in (2, 4) for m in (4, 8)]
    rows = []
    for p in (2, 4):
        for m in (4, 8):
            env = layout_env(
                MODEL,
                {**TRAINING, "globalBatchSize": m * MICRO_BATCH * (WORLD // p)},
                pp=p,
                dp=WORLD // p,
                schedule=schedule,
                micro_batches=m,
            )
            job = read_job(env)
            mesh = build_mesh(job.plan.layout, device)
            # Data parallel replicas run their own pipelines side by side; each rank's bubble
            # is measured against its own stage.
            step = step_time(job, mesh, m)
            layers = job.plan.stage_layers[mesh.pp_rank]
            busy = stage_busy_time(job, layers, mesh.pp_rank == 0, m)
            bubble = torch.tensor([1.0 - busy / step], dtype=torch.float64)
            gathered = [torch.zeros_like(bubble) for _ in range(WORLD)]
            dist.all_gather(gathered, bubble)
            rows.append((p, m, [float(g) for g in gathered], step))
    if rank == 0:
        print(f"pipeline bubble, schedule {schedule}, {WORLD} processes (dp = 4 / p)")
        print(f"timed stages (forward {FORWARD_S}s, backward {BACKWARD_S}s per micro-batch)")
        print(f"{'p':>2} {'m':>2} {'measured':>9} {'formula':>8}  per-rank")
        for p, m, bubbles in timed:
            formula = (p - 1) / (m + p - 1)
            per_rank = " ".join(f"{b:.3f}" for b in bubbles)
            print(f"{p:>2} {m:>2} {statistics.mean(bubbles):>9.3f} {formula:>8.3f}  {per_rank}")
        print("model stages (transformer, 8 layers split evenly)")
        print(f"{'p':>2} {'m':>2} {'measured':>9} {'formula':>8} {'step s':>7}  per-rank")
        for p, m, bubbles, step in rows:
            formula = (p - 1) / (m + p - 1)
            mean = statistics.mean(bubbles)
            per_rank = " ".join(f"{b:.2f}" for b in bubbles)
            print(f"{p:>2} {m:>2} {mean:>9.3f} {formula:>8.3f} {step:>7.3f}  {per_rank}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
