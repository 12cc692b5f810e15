"""Per-rank model-state memory of DDP vs ZeRO-1/2/3 on 4 ranks, beside the ZeRO formulas.

Run: .venv/bin/python bench/trainer_memory.py   (launches 4 CPU processes itself)

"Measured" is the bytes of the tensors each rank really holds after a backward pass: its
parameters (local shards for FSDP2), its gradients and its AdamW state (ZeRO-1: only its shard).
The formulas are the ZeRO paper's (Rajbhandari et al. 2020, arXiv 1910.02054, Figure 1) with
fp32 training: 4 B weights + 4 B grads + 8 B Adam moments = 16 B per parameter, N = 4:
DDP 16psi, ZeRO-1 8psi + 8psi/N, ZeRO-2 4psi + 12psi/N, ZeRO-3 16psi/N.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _launch import ensure_torchrun
from meshrun_trainer.local.env import layout_env

WORLD = 4

if __name__ == "__main__":
    ensure_torchrun(WORLD)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from meshrun_trainer.components.data.synthetic import make_stream, replica_rows  # noqa: E402
from meshrun_trainer.config.read import read_job  # noqa: E402
from meshrun_trainer.distributed.mesh import build_mesh, init_distributed, pick_device  # noqa: E402
from meshrun_trainer.loop.train import build_runner  # noqa: E402
from meshrun_trainer.models.loss import cross_entropy  # noqa: E402
from torch.distributed.optim import ZeroRedundancyOptimizer  # noqa: E402
from torch.distributed.tensor import DTensor  # noqa: E402

# ~3.4M parameters: large enough that fixed overheads vanish, small enough for 2 CPU cores.
MODEL = {"layers": 4, "hidden": 256, "heads": 4, "vocab": 1024, "seqLen": 32, "ffnHidden": 768}
TRAINING = {"globalBatchSize": 8, "precision": "fp32", "learningRate": 1e-3, "dataset": "synthetic"}
FORMULA = {  # bytes per parameter, fp32 Adam, N = WORLD
    0: 16,
    1: 8 + 8 / WORLD,
    2: 4 + 12 / WORLD,
    3: 16 / WORLD,
}
NAMES = {0: "DDP", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3"}


def local_bytes(tensor: torch.Tensor) -> int:
    local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    return local.numel() * local.element_size()


def model_state_bytes(runner) -> tuple[int, int, int]:  # type: ignore[no-untyped-def]
    params = runner.parameters()
    weights = sum(local_bytes(p) for p in params)
    grads = sum(local_bytes(p.grad) for p in params if p.grad is not None)
    optim = 0
    for opt in runner.optimizers:
        inner = opt.optim if isinstance(opt, ZeroRedundancyOptimizer) else opt
        for state in inner.state.values():
            optim += sum(local_bytes(v) for v in state.values() if torch.is_tensor(v) and v.dim())
    return weights, grads, optim


def main() -> None:
    device = pick_device()
    init_distributed(device)
    rows = []
    for stage in range(4):
        job = read_job(layout_env(MODEL, TRAINING, dp=WORLD, zero_stage=stage))
        mesh = build_mesh(job.plan.layout, device)
        runner = build_runner(job, mesh)
        t = job.spec.training
        shape = job.plan.model
        x, y = make_stream("synthetic", shape.vocab, shape.seq_len, 8, 0).global_batch(1)
        dp = job.plan.layout.dp
        model = runner.parts[0]
        logits = model(replica_rows(x, mesh.dp_rank, dp))
        # Between forward and backward: FSDP2 with reshard_after_forward=False (ZeRO-2) still
        # holds whole parameters here, ZeRO-3 has resharded them.
        in_step = sum(local_bytes(p) for p in model.parameters())
        cross_entropy(logits, replica_rows(y, mesh.dp_rank, dp)).backward()
        for opt in runner.optimizers:
            opt.step()  # creates the Adam moments; grads are still held (no zero_grad yet)
        measured = torch.tensor([*model_state_bytes(runner), in_step], dtype=torch.float64)
        gathered = [torch.zeros_like(measured) for _ in range(WORLD)]
        dist.all_gather(gathered, measured)
        psi = job.plan.model.parameters()
        rows.append((stage, psi, [g.tolist() for g in gathered], t))
        del runner
    if dist.get_rank() == 0:
        psi = rows[0][1]
        print(f"model-state bytes per rank, {WORLD} ranks, psi = {psi:,} parameters, fp32 + AdamW")
        print(
            f"{'strategy':8} {'rank':>4} {'params':>11} {'step params':>11} {'grads':>11}"
            f" {'optimizer':>11} {'peak states':>11} {'formula':>11} {'ratio':>6}"
        )
        for stage, psi, per_rank, _ in rows:
            formula = FORMULA[stage] * psi
            for rank, (w, g, o, live) in enumerate(per_rank):
                peak = max(w, live) + g + o
                print(
                    f"{NAMES[stage]:8} {rank:>4} {w:>11,.0f} {live:>11,.0f} {g:>11,.0f}"
                    f" {o:>11,.0f} {peak:>11,.0f} {formula:>11,.0f} {peak / formula:>6.3f}"
                )
        print(
            "params, grads, optimizer: bytes held after the optimizer step; step params: held"
            "\n  between forward and backward; peak states = max(params, step params) + grads +"
            "\n  optimizer, compared with the formula. FSDP2 with reshard_after_forward=False"
            "\n  (our ZeRO-2) holds whole parameters only within the step and reshards them after"
            "\n  backward, so at rest it holds 16psi/N like ZeRO-3. ZeRO-3 keeps the final norm and"
            "\n  the head (one FSDP unit) gathered from forward to backward, which needs them at"
            "\n  once (the planner's 'gathered' term). ZeRO-1 optimizer shares differ by rank:"
            "\n  ZeroRedundancyOptimizer assigns whole tensors to ranks."
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
