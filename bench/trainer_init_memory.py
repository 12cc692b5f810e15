"""Resident memory of each rank while the 1b preset is built under ZeRO-3 on 4 CPU ranks, and
during its first training step, beside the model's size and the planner's estimate.

Run: .venv/bin/python bench/trainer_init_memory.py [--step] [--seq-len N] [--checkpointing M]
(launches 4 CPU processes itself; the build needs about 2 GiB per rank; ``--step`` also runs one
optimizer step, which needs the planner's estimate per rank, about 5 GiB at seq 256 with full
checkpointing, and is skipped with a message when MemAvailable is short)

Every rank builds the model on the meta device, shards it and fills its shard one parameter at a
time (meshrun_trainer.models.materialize), so its peak during the build should stay under a quarter
of the fp32 model plus the largest single parameter (for the 1b preset the embedding, 1.27 layers)
plus the process's fixed overhead (torch and gloo, measured before the build, and a 64 MiB
allowance for the build's own bookkeeping). Peaks are the kernel's resident high-water mark
(ru_maxrss).
"""

from __future__ import annotations

import argparse
import resource
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _launch import ensure_torchrun

WORLD = 4
GIB = 2**30
BOOKKEEPING = 64 * 2**20
"""Allowance for what the build itself keeps besides the shards (meta modules, FSDP2 and
DeviceMesh objects): part of the fixed overhead, not measurable before the build."""

if __name__ == "__main__":
    ensure_torchrun(WORLD)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from meshrun_trainer.components.data.synthetic import make_stream, replica_rows  # noqa: E402
from meshrun_trainer.config.read import read_job  # noqa: E402
from meshrun_trainer.distributed.mesh import build_mesh, init_distributed, pick_device  # noqa: E402
from meshrun_trainer.local.env import layout_env  # noqa: E402
from meshrun_trainer.loop.train import build_runner, forward_backward  # noqa: E402

from meshrun.api.presets import PRESETS  # noqa: E402
from meshrun.planner.plan import plan_job  # noqa: E402


def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def resident() -> int:
    """This process's resident memory now (not its high-water mark)."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * resource.getpagesize()


def available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def gathered(value: float) -> list[float]:
    values: list[float] = [0.0] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--step", action="store_true", help="also run one optimizer step")
    parser.add_argument("--seq-len", type=int, default=256, help="sequence length of the step")
    parser.add_argument("--checkpointing", default="full", choices=("none", "selective", "full"))
    parser.add_argument(
        "--layers", type=int, default=PRESETS["1b"].layers, help="fewer blocks of the 1b width"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    device = pick_device("cpu")
    init_distributed(device)
    rank = dist.get_rank()
    model = {"preset": "1b", "seqLen": args.seq_len, "layers": args.layers}
    training = {
        "globalBatchSize": WORLD,
        "precision": "fp32",
        "dataset": "synthetic",
        "activationCheckpointing": args.checkpointing,
    }
    env = layout_env(model, training, dp=WORLD, zero_stage=3)
    job = read_job({**env, "WORLD_SIZE": str(WORLD)})
    baseline = peak_rss()
    runner = build_runner(job, build_mesh(job.plan.layout, device))
    init_peak = peak_rss()
    local = sum(p.to_local().numel() * 4 for p in runner.parameters())  # type: ignore[attr-defined]
    rows = {"baseline": gathered(baseline), "init": gathered(init_peak), "shard": gathered(local)}
    spec = {
        "image": "bench",
        "resources": {"numNodes": 1, "numProcPerNode": WORLD, "accelerator": "cpu"},
        "strategy": {"type": "zero", "zeroStage": 3},
        "model": model,
        "training": {**training, "microBatchSize": 1},
    }
    plan = plan_job(spec)
    estimate, shape = plan.memory, plan.model
    # The planner's total, the fixed overhead and half a GiB of slack, on every rank, less what
    # the ranks already hold (their shards are part of the total).
    held = gathered(resident())
    need = sum(max(0.0, estimate.total + max(rows["baseline"]) + GIB // 2 - h) for h in held)
    step_note = "not run (pass --step)"
    if args.step:
        free = gathered(float(available()))
        if min(free) >= need:
            stream = make_stream("synthetic", shape.vocab, args.seq_len, WORLD, 0)
            inputs, targets = stream.global_batch(1)
            rows_x = replica_rows(inputs, rank, WORLD)
            rows_y = replica_rows(targets, rank, WORLD)
            forward_backward(job.plan.layout, runner, rows_x, rows_y)
            for optimizer in runner.optimizers:
                optimizer.step()
            rows["step"] = gathered(peak_rss())
            step_note = f"seq {args.seq_len}, micro-batch 1, checkpointing {args.checkpointing}"
        else:
            step_note = (
                f"skipped: needs about {need / GIB:.1f} GiB free, MemAvailable is "
                f"{min(free) / GIB:.1f} GiB"
            )
    if rank == 0:
        full = shape.parameters() * 4
        layer = shape.layer_parameters() * 4
        largest = max(shape.vocab * shape.hidden, 3 * shape.hidden * shape.ffn_hidden) * 4
        bound = full / WORLD + max(layer, largest) + BOOKKEEPING
        print(
            f"1b preset, {shape.layers} layers ({shape.parameters() / 1e9:.2f}B parameters), "
            f"ZeRO-3 on {WORLD} CPU "
            f"ranks, fp32: full model {full / GIB:.2f} GiB, a quarter {full / WORLD / GIB:.2f} "
            f"GiB, one layer {layer / GIB:.2f} GiB, the largest parameter {largest / GIB:.2f} GiB"
        )
        print(
            f"{'rank':>4} {'baseline':>9} {'init peak':>10} {'shard':>7} {'init - base':>12}"
            f" {'bound':>7} {'step peak':>10}  (GiB)"
        )
        for r in range(WORLD):
            base, init = rows["baseline"][r], rows["init"][r]
            step = f"{rows['step'][r] / GIB:>10.2f}" if "step" in rows else f"{'-':>10}"
            print(
                f"{r:>4} {base / GIB:>9.2f} {init / GIB:>10.2f} {rows['shard'][r] / GIB:>7.2f}"
                f" {(init - base) / GIB:>12.2f} {bound / GIB:>7.2f} {step}"
            )
        worst = max(i - b for i, b in zip(rows["init"], rows["baseline"], strict=True))
        if "step" in rows:
            above = max(t - b for t, b in zip(rows["step"], rows["baseline"], strict=True))
            print(
                f"first step above the fixed overhead: at most {above / GIB:.2f} GiB, the planner "
                f"{estimate.total / GIB:.2f} GiB (ratio {above / estimate.total:.2f})"
            )
        verdict = "within" if worst <= bound else "ABOVE"
        print(
            f"init peak above the fixed overhead: at most {worst / GIB:.2f} GiB, {verdict} the "
            f"bound {bound / GIB:.2f} GiB (a quarter of the model + the largest parameter + "
            f"{BOOKKEEPING / 2**20:.0f} MiB); no rank ever held the whole model "
            f"({full / GIB:.2f} GiB)"
        )
        print(
            f"planner, per rank (seq {args.seq_len}, checkpointing {args.checkpointing}): "
            f"params {estimate.params / GIB:.2f}, grads {estimate.grads / GIB:.2f}, optimizer "
            f"{estimate.optimizer / GIB:.2f}, activations {estimate.activations / GIB:.2f}, "
            f"gathered unit {estimate.gathered / GIB:.2f}, "
            f"total {estimate.total / GIB:.2f} GiB; first step: {step_note}"
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
