"""Tokens per second of the small preset with and without ``torch.compile`` per block.

Run: .venv/bin/python bench/trainer_compile.py [--preset small] [--steps 4] [--micro-batch 1]
(one process on the CPU, or the GPU when there is one; a few minutes on a 2-core CPU, most of it
the one-off compilation)

Each variant builds the model the trainer builds (``spec.training.compile`` false, then true),
runs one warm-up step (which pays the compilation), then times ``--steps`` optimizer steps of
forward, backward and AdamW.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from meshrun_trainer.components.optim import make_optimizer
from meshrun_trainer.distributed.blocks import apply_compile
from meshrun_trainer.models.llama import build_model
from meshrun_trainer.models.loss import cross_entropy

from meshrun.api.presets import PRESETS


def run(preset: str, compiled: bool, steps: int, micro_batch: int) -> tuple[float, float, float]:
    """(warm-up seconds, median step seconds, last loss)."""
    shape = PRESETS[preset]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = build_model(shape, 0).to(device)
    if compiled:
        apply_compile(list(model.layers.values()))
    optimizer = make_optimizer(model.parameters(), 3e-4)
    generator = torch.Generator().manual_seed(0)
    times, loss = [], 0.0
    for _ in range(steps + 1):
        tokens = torch.randint(0, shape.vocab, (micro_batch, shape.seq_len), generator=generator)
        tokens = tokens.to(device)
        started = time.perf_counter()
        value = cross_entropy(model(tokens), tokens)
        value.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss = value.item()  # waits for the device
        times.append(time.perf_counter() - started)
    return times[0], statistics.median(times[1:]), loss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small", choices=sorted(PRESETS))
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--micro-batch", type=int, default=1)
    args = parser.parse_args()
    shape = PRESETS[args.preset]
    tokens = args.micro_batch * shape.seq_len
    where = "cuda" if torch.cuda.is_available() else f"cpu, {torch.get_num_threads()} threads"
    print(f"torch.compile per block, preset {args.preset}, {tokens} tokens per step, {where}")
    print(f"{'variant':10} {'warm-up s':>10} {'step s':>8} {'tokens/s':>10} {'loss':>8}")
    eager = 0.0
    for compiled in (False, True):
        warmup, step, loss = run(args.preset, compiled, args.steps, args.micro_batch)
        name = "compiled" if compiled else "eager"
        eager = eager or step
        print(f"{name:10} {warmup:>10.1f} {step:>8.2f} {tokens / step:>10,.0f} {loss:>8.4f}")
    print(f"speed-up of the compiled step: {eager / step:.2f}x (the warm-up includes compilation)")


if __name__ == "__main__":
    main()
