"""MoE layouts in one launch of 4 processes, each against a single-process reference.

Usage (under torchrun, 4 processes): moe_check.py OUT.json CHECKPOINT_DIR -- each run of
:data:`RUNS` trains a tiny mixture of experts (4 experts, top 2, a shared expert, a first dense
layer) for a few steps and records its losses, gradient norms, the auxiliary loss of each step
(summed over the MoE layers, averaged over the replicas) and every expert's gradient on the
first step (gathered whole). Rank 0 trains the plain model on the whole global batch for each
model and writes {run: {"losses", "gradNorms", "aux", "biases", "resumedFrom", "reference":
{...}}} to OUT.json and the expert gradients, {run: {"got": {tensor: gradient}, "want": {...}}},
to :func:`grads_file` beside it (binary: 440 thousand numbers per run, which as JSON lists took
two thirds of the launch's CPU to write, gather and read). The last run resumes at ep 2 from the
ep 4 run's step-2 checkpoint. Launched by test_moe.py.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import layout_check  # the dense layouts' training settings (same folder)
import torch
import torch.distributed as dist
from meshrun_trainer.components import checkpoint
from meshrun_trainer.components.data.synthetic import make_stream
from meshrun_trainer.components.optim import clip_grad_norm, make_optimizer
from meshrun_trainer.config.read import read_job
from meshrun_trainer.distributed.mesh import build_mesh, init_distributed, pick_device
from meshrun_trainer.local.env import layout_env
from meshrun_trainer.loop import train as train_module
from meshrun_trainer.models.llama import build_model
from meshrun_trainer.models.loss import cross_entropy
from meshrun_trainer.models.moe import moe_layers, set_aux_passes
from torch.distributed.tensor import DTensor

from meshrun.jobdoc import JobDocument

STEPS = layout_check.STEPS
SOFTMAX = {"experts": 4, "expertsPerToken": 2, "sharedExperts": 1, "firstDenseLayers": 1}
SIGMOID = {**SOFTMAX, "router": "sigmoid", "biasBalancing": True, "auxLossCoefficient": 0.001}
TRAINING = {**layout_check.TRAINING, "checkpoint": {"everySteps": 1}}
RUNS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "ep4-ddp4": (SOFTMAX, {"dp": 4, "ep": 4}),
    "ep2-zero3-dp4-acc2": (SOFTMAX, {"dp": 4, "ep": 2, "zero_stage": 3, "grad_accumulation": 2}),
    "ep2-pp2-dp2": (
        SOFTMAX,
        {"dp": 2, "pp": 2, "ep": 2, "schedule": "1f1b", "micro_batches": 2, "grad_accumulation": 2},
    ),
    "ep1-zero2-dp4": (SOFTMAX, {"dp": 4, "zero_stage": 2}),
    "ep2-zero1-dp4": (SOFTMAX, {"dp": 4, "ep": 2, "zero_stage": 1}),
    "ep1-zero1-dp4": (SOFTMAX, {"dp": 4, "zero_stage": 1}),
    "ep4-tp2-dp2": (SOFTMAX, {"dp": 2, "tp": 2, "ep": 4}),
    "ep2-tp2-zero3-dp2": (SIGMOID, {"dp": 2, "tp": 2, "ep": 2, "zero_stage": 3}),
    "sigmoid-bias-ep4": (SIGMOID, {"dp": 4, "ep": 4}),
    "ep2-cp2-dp2": (SOFTMAX, {"dp": 2, "cp": 2, "ep": 2}),  # each EP group is a cp group
    "ep4-cp2-zero1-dp2": (SOFTMAX, {"dp": 2, "cp": 2, "ep": 4, "zero_stage": 1}),
    "ep4-cp2-tp2": (SOFTMAX, {"cp": 2, "tp": 2, "ep": 4}),
    "sigmoid-bias-ep2-cp4": (SIGMOID, {"cp": 4, "ep": 2}),  # EP inside the cp group alone
    "saved-ep4": (SOFTMAX, {"dp": 4, "ep": 4}),
    "resumed-ep2": (SOFTMAX, {"dp": 4, "ep": 2, "zero_stage": 3}),
}
"""{run: (spec.model.moe, layout_env's layout)}."""


def reference_run(job: JobDocument) -> dict[str, Any]:
    """The plain single-process run: whole global batch, no parallelism."""
    t, shape = job.spec.training, job.plan.model
    model = build_model(shape, t.seed)
    optimizer = make_optimizer(model.parameters(), t.learning_rate)
    stream = make_stream(job.spec.dataset, shape.vocab, shape.seq_len, t.global_batch_size, t.seed)
    set_aux_passes(1)
    result: dict[str, Any] = {"losses": [], "gradNorms": [], "aux": []}
    params = list(model.parameters())
    for step in range(1, t.steps + 1):
        inputs, targets = stream.global_batch(step)
        loss = cross_entropy(model(inputs), targets)
        loss.backward()
        if step == 1:
            result["expertGrads"] = expert_grads(model)
        result["gradNorms"].append(clip_grad_norm(params, t.max_grad_norm).item())
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        layers = moe_layers(model)
        result["aux"].append(sum(layer.aux_sum for layer in layers))
        for layer in layers:
            layer.aux_sum = 0.0
            layer.update_bias(None)
        result["losses"].append(loss.item())
    result["biases"] = biases([model])
    return result


def biases(parts: list[torch.nn.Module]) -> list[list[float]]:
    """Each MoE layer's balancing bias, in layer order."""
    found = {
        name: module.get_buffer("expert_bias").tolist()
        for part in parts
        for name, module in part.named_modules()
        if module in moe_layers(part)
    }
    return [found[name] for name in sorted(found)]


def grads_file(out: str | Path) -> Path:
    """Where the expert gradients of the runs written to ``out`` are (torch.save's format)."""
    return Path(out).with_suffix(".grads.pt")


def expert_grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """{layer's expert tensor: its whole gradient, flattened} (collective under EP)."""
    grads: dict[str, torch.Tensor] = {}
    for name, param in model.named_parameters():
        if ".experts." in name and param.grad is not None:
            grad = param.grad
            whole = grad.full_tensor() if isinstance(grad, DTensor) else grad
            grads[name.removeprefix("module.")] = whole.detach().flatten().clone()
    return grads


class Observed:
    """What a run's ranks see: the auxiliary loss of each step (this rank's layers and rows) and
    every expert gradient of the first step once reduced (the training loop's own functions,
    wrapped while the run lasts)."""

    def __init__(self) -> None:
        self.aux: list[float] = []
        self.grads: dict[str, torch.Tensor] | None = None
        self.parts: list[torch.nn.Module] = []

    @contextmanager
    def watching(self) -> Iterator[None]:
        reduce, build = train_module.reduce_expert_grads, train_module.build_runner  # type: ignore[attr-defined]

        def reduce_and_keep(parts: list[torch.nn.Module], layout: Any) -> None:
            reduce(parts, layout)
            if self.grads is None:
                self.grads = {k: v for p in parts for k, v in expert_grads(p).items()}

        def build_and_keep(*args: Any, **kwargs: Any) -> Any:
            runner = build(*args, **kwargs)
            self.parts.extend(runner.parts)
            return runner

        train_module.reduce_expert_grads = reduce_and_keep  # type: ignore[attr-defined]
        train_module.build_runner = build_and_keep
        try:
            yield
        finally:
            train_module.reduce_expert_grads = reduce  # type: ignore[attr-defined]
            train_module.build_runner = build

    def on_step(self, _: Any) -> None:
        local = 0.0
        for part in self.parts:
            for layer in moe_layers(part):
                local += layer.aux_sum
                layer.aux_sum = 0.0
        self.aux.append(local)


def main(out: str, folder: str) -> None:
    device = pick_device()
    init_distributed(device)
    world = dist.get_world_size()
    results: dict[str, Any] = {}
    references: dict[str, dict[str, Any]] = {}
    for name, (moe, layout) in RUNS.items():
        model = {"preset": "tiny", "moe": moe}
        checkpoint_dir = folder if name in ("saved-ep4", "resumed-ep2") else None
        env = layout_env(model, TRAINING, checkpoint_dir=checkpoint_dir, **layout)
        job = read_job({**env, "WORLD_SIZE": str(world)})
        key = json.dumps(moe)
        if key not in references and dist.get_rank() == 0:
            references[key] = reference_run(job)
        observed = Observed()
        with observed.watching():
            result = train_module.train(
                job, build_mesh(job.plan.layout, device), on_step=observed.on_step
            )
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, (observed.aux, observed.grads, biases(observed.parts)))
        dp = job.plan.layout.dp  # each rank holds 1/(cp x tp) of its replica's
        aux = [sum(rank[0][i] for rank in gathered) / dp for i in range(len(observed.aux))]
        grads: dict[str, torch.Tensor] = {}
        for _, rank_grads, _ in gathered:
            grads.update(rank_grads or {})
        lay = job.plan.layout
        stage_ranks = range(0, world, lay.dp * lay.cp * lay.tp)  # the first rank of each stage
        held = [bias for first in stage_ranks for bias in gathered[first][2]]
        results[name] = {
            "losses": [r.loss for r in result.records],
            "gradNorms": [r.grad_norm for r in result.records],
            "aux": aux,
            "expertGrads": grads,
            "resumedFrom": result.resumed_from,
            "biases": held,
            "reference": references.get(key),
        }
        if name == "saved-ep4" and dist.get_rank() == 0:
            shutil.rmtree(checkpoint.step_dir(folder, STEPS))  # resume from step 2
        dist.barrier()
    if dist.get_rank() == 0:
        torch.save(
            {
                name: {"got": run.pop("expertGrads"), "want": run["reference"]["expertGrads"]}
                for name, run in results.items()
            },
            grads_file(out),
        )
        for reference in references.values():
            del reference["expertGrads"]
        with open(out, "w", encoding="utf-8") as handle:
            json.dump(results, handle)
    dist.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(sys.argv[1], sys.argv[2])
