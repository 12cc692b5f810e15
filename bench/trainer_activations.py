"""Activation memory of the small preset with none, selective and full checkpointing, measured
beside the planner's estimate.

Run: .venv/bin/python bench/trainer_activations.py [--preset small] [--micro-batch 1]
(one CPU process, fp32; about two minutes for the small preset on a 2-core machine)

"Measured" is the peak, over one forward and backward pass, of the bytes of every tensor the
step allocated and still holds, parameters and gradients excluded: what the forward keeps for
backward plus the temporaries of backward (a dispatch-level tracker sees every allocation,
including what selective checkpointing caches). The estimate is the planner's
``memory.activations`` for the same job on one process (meshrun/planner/memory.py).
"""

from __future__ import annotations

import argparse
import time
import weakref
from typing import Any

import torch
from meshrun_trainer.distributed.blocks import CHECKPOINTING, apply_activation_checkpointing
from meshrun_trainer.models.llama import Transformer, build_model
from meshrun_trainer.models.loss import cross_entropy
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from meshrun.api.presets import PRESETS
from meshrun.planner.plan import plan_job

TOLERANCE = 0.15
"""The estimate must be within 15% of the measurement."""


class LiveBytes(TorchDispatchMode):
    """Bytes of the storages created under this mode and still alive, less the gradients."""

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.existing = {
            t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())
        }
        self.sizes: dict[int, int] = {}
        self.live = self.grads = self.peak = 0
        for param in model.parameters():
            param.register_post_accumulate_grad_hook(self._grad)

    def _grad(self, param: torch.Tensor) -> None:
        assert param.grad is not None
        self.grads += param.grad.untyped_storage().nbytes()

    def _drop(self, key: int) -> None:
        self.live -= self.sizes.pop(key, 0)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for tensor in tree_flatten(out)[0]:
            if not isinstance(tensor, torch.Tensor):
                continue
            storage = tensor.untyped_storage()
            key = storage.data_ptr()
            if key in self.sizes or key in self.existing or not storage.nbytes():
                continue
            self.sizes[key] = storage.nbytes()
            self.live += storage.nbytes()
            weakref.finalize(storage, self._drop, key)
        self.peak = max(self.peak, self.live - self.grads)
        return out


def estimate(preset: str, micro_batch: int, mode: str) -> int:
    spec = {
        "image": "bench",
        "resources": {"numNodes": 1, "numProcPerNode": 1, "accelerator": "cpu"},
        "strategy": {"type": "ddp"},
        "model": {"preset": preset},
        "training": {
            "globalBatchSize": micro_batch,
            "microBatchSize": micro_batch,
            "precision": "fp32",
            "activationCheckpointing": mode,
        },
    }
    return plan_job(spec).memory.activations


def measure(preset: str, micro_batch: int, mode: str) -> tuple[int, float]:
    shape = PRESETS[preset]
    model = build_model(shape, 0)
    apply_activation_checkpointing(list(model.layers.values()), mode)
    tokens = torch.randint(0, shape.vocab, (micro_batch, shape.seq_len))
    tracker = LiveBytes(model)
    started = time.perf_counter()
    with tracker:
        cross_entropy(model(tokens), tokens).backward()
    return tracker.peak, time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small", choices=sorted(PRESETS))
    parser.add_argument("--micro-batch", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    shape = PRESETS[args.preset]
    print(
        f"activation memory, preset {args.preset} ({shape.parameters() / 1e6:.0f}M parameters, "
        f"{shape.layers} layers, seq {shape.seq_len}), micro-batch {args.micro_batch}, fp32, CPU"
    )
    print(f"{'mode':10} {'measured MiB':>13} {'planner MiB':>12} {'ratio':>6} {'step s':>7}")
    worst = 0.0
    for mode in CHECKPOINTING:
        measured, seconds = measure(args.preset, args.micro_batch, mode)
        planned = estimate(args.preset, args.micro_batch, mode)
        ratio = planned / measured
        worst = max(worst, abs(ratio - 1))
        print(
            f"{mode:10} {measured / 2**20:>13.1f} {planned / 2**20:>12.1f} {ratio:>6.3f}"
            f" {seconds:>7.1f}"
        )
    verdict = "within" if worst <= TOLERANCE else "OUTSIDE"
    print(f"largest gap {worst:.1%}: {verdict} the {TOLERANCE:.0%} target")
    return 0 if worst <= TOLERANCE else 1


if __name__ == "__main__":
    raise SystemExit(main())
