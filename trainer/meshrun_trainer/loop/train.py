"""Build the parallel model for a layout and run the training loop, put together from its parts
(meshrun_trainer.components): the data stream, the learning-rate schedules, the tied-embedding
gradients, the validator, the checkpoints and the weights in and out."""

from __future__ import annotations

import math
import resource
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from meshrun.api.layout import Layout
from meshrun.files.hf import HFModel
from meshrun.jobdoc import JobDocument
from meshrun_trainer.components import checkpoint
from meshrun_trainer.components.data.synthetic import replica_rows
from meshrun_trainer.components.data.training import DataStream
from meshrun_trainer.components.evaluate import Validator
from meshrun_trainer.components.optim import LRSchedules, clip_grad_norm, make_optimizer
from meshrun_trainer.components.tied import TiedGradients
from meshrun_trainer.components.weights import export_weights, weight_source
from meshrun_trainer.config.files import open_files
from meshrun_trainer.distributed.experts import (
    expert_grad_square,
    own_params,
    reduce_expert_grads,
    update_biases,
)
from meshrun_trainer.distributed.mesh import Mesh
from meshrun_trainer.distributed.parallel import (
    DataParallel,
    PartOptions,
    build_parts,
    data_parallel_kind,
    gradient_sync,
    gradients_in_buckets,
    plain,
)
from meshrun_trainer.distributed.stagemap import loss_scale, stages_of_rank
from meshrun_trainer.models.context import sequence_share
from meshrun_trainer.models.loss import cross_entropy
from meshrun_trainer.models.materialize import WeightSource
from meshrun_trainer.models.moe import set_aux_passes
from meshrun_trainer.runner import Runner, StepRecord, TrainResult


def peak_memory() -> tuple[int, str]:
    """(bytes, kind): CUDA allocator peak on GPU, else the process RSS high-water mark."""
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated(), "cuda.max_memory_allocated"
    # ru_maxrss is in KiB on Linux (getrusage(2)).
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "ru_maxrss"


def build_runner(
    job: JobDocument,
    mesh: Mesh,
    options: PartOptions | None = None,
    source: WeightSource | None = None,
) -> Runner:
    """This rank's model parts (initial values from ``source``, default the seeded random
    initialisation), optimizers and pipeline schedule; ``options`` default to the job's (the
    plan's activation checkpointing: auto chooses it where the spec leaves it unset)."""
    layout, training = job.plan.layout, job.spec.training
    options = options or PartOptions(
        activation_checkpointing=job.plan.activation_checkpointing,
        compile=training.compile,
    )
    stage_ids = stages_of_rank(mesh.pp_rank, layout) if layout.pp > 1 else [0]
    parts = build_parts(job, mesh, stage_ids, options, source)
    set_aux_passes(loss_scale(layout))
    zero1 = mesh.gradient_group() if data_parallel_kind(layout) is DataParallel.DDP_ZERO1 else None
    optimizers = [
        make_optimizer(part.parameters(), training.learning_rate, training.optimizer, zero1)
        for part in parts
    ]
    schedule = None
    context = mesh.group("cp") if layout.cp > 1 else None
    if layout.pp > 1:
        # imported here: torch.distributed.pipelining costs every process 0.65 s (stagemap.py)
        from meshrun_trainer.distributed.pipeline import build_schedule

        scale = loss_scale(layout)

        def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            return cross_entropy(output, target, context) / scale

        schedule = build_schedule(parts, stage_ids, layout, mesh, loss_fn)
    return Runner(
        parts=parts,
        optimizers=optimizers,
        schedule=schedule,
        is_first=0 in stage_ids,
        is_last=layout.num_stages - 1 in stage_ids,
        loss_parallel=options.loss_parallel and layout.tp > 1,
        context=context,
    )


def forward_backward(
    layout: Layout, runner: Runner, inputs: torch.Tensor, targets: torch.Tensor
) -> torch.Tensor:
    """Accumulate gradients over this replica's rows; return its mean loss.

    Ranks without the last pipeline stage return 0 (they never see the loss).
    """
    accumulation = layout.grad_accumulation
    total = torch.zeros((), device=inputs.device)
    stages = runner.pipeline_stages()
    chunks = zip(inputs.chunk(accumulation), targets.chunk(accumulation), strict=True)
    for index, (x, y) in enumerate(chunks):
        last = index == accumulation - 1
        if runner.schedule is None:
            with gradient_sync(runner.parts, layout, last), runner.loss_context():
                loss = cross_entropy(runner.parts[0](x), y, runner.context) / accumulation
                torch.autograd.backward(loss)
            total += plain(loss.detach())
            continue
        for stage in stages:
            stage.last_run = last
        losses: list[torch.Tensor] = []
        args = (x,) if runner.is_first else ()
        with runner.loss_context():
            runner.schedule.step(*args, target=y if runner.is_last else None, losses=losses)
        # Each micro-batch loss is already divided by micro_batches * accumulation.
        total += sum((plain(loss.detach()) for loss in losses), torch.zeros_like(total))
    return total


class LossNotFinite(Exception):
    """The loss of a step is NaN or infinite: training stops (a permanent failure)."""

    def __init__(self, step: int, loss: float) -> None:
        super().__init__(f"the training loss is {loss} at step {step}")
        self.step, self.loss = step, loss


def global_loss(layout: Layout, mesh: Mesh, local: torch.Tensor) -> float:
    """Average the replicas' losses (over dp x cp: a context-parallel rank's loss is its share
    of the mean times cp); the last pipeline stage shares its value with the others."""
    loss = local.detach().float().clone()
    if layout.pp > 1:
        dist.all_reduce(loss, group=mesh.group("pp"))  # only the last stage is non-zero
    replicas = layout.dp * layout.cp
    if replicas > 1:
        dist.all_reduce(loss, group=mesh.gradient_group())
        loss /= replicas
    return float(loss.item())


def rank_rows(batch: torch.Tensor, layout: Layout, mesh: Mesh) -> torch.Tensor:
    """This rank's part of a global batch: its replica's rows, its share of each sequence."""
    rows = replica_rows(batch, mesh.dp_rank, layout.dp)
    return sequence_share(rows, mesh.cp_rank, layout.cp).to(mesh.device)


def train(
    job: JobDocument,
    mesh: Mesh,
    on_step: Callable[[StepRecord], None] | None = None,
    hf: HFModel | None = None,
    on_eval: Callable[[int, float], None] | None = None,
) -> TrainResult:
    """Run (or resume) training to ``job.spec.training.steps``; every rank calls this.

    ``hf``: the job's Hugging Face folder, opened (default: opened here when the spec names one).
    ``on_eval(step, loss)``: called after each validation.
    """
    training, layout, folder = job.spec.training, job.plan.layout, job.pod.checkpoint_dir
    hf = hf if hf is not None else open_files(job)
    runner = build_runner(job, mesh, source=weight_source(hf, job.plan.model))
    data = DataStream(job, hf)
    schedules = LRSchedules(runner.optimizers, training.lr_schedule, training.steps)
    tied = TiedGradients(job, mesh, runner)
    validator = Validator(job, hf, mesh, runner)
    result = TrainResult()
    if folder:
        result.resumed_from = checkpoint.restore_latest(folder, runner)
        if result.resumed_from:
            saved = checkpoint.read_extra(folder, result.resumed_from)
            data.load_state_dict(result.resumed_from, saved.get("data"))
            schedules.load_state_dict(saved.get("schedulers", []))
            validator.load_state_dict(saved.get("evals", []))
    if result.resumed_from == 0:
        _report(0, validator.validate(0), on_eval)
    pp_group = mesh.group("pp") if layout.pp > 1 else None
    params = runner.parameters()
    experts = own_params(runner.parts, layout)
    # DDP's gradients are views into its all-reduce buckets, which stay allocated: zeroing them
    # in place keeps it that way (set to None, each first micro-step under no_sync would
    # allocate a second set of gradients beside the buckets). Except after this process's
    # first step: DDP then rebuilds its buckets in the order that backward produced the
    # gradients, and gradients still pointing into the old buckets would be copied over,
    # holding both sets at once.
    buckets = gradients_in_buckets(layout)
    first = result.resumed_from + 1
    for step in range(first, training.steps + 1):
        started = time.perf_counter()
        inputs, targets = data.global_batch(step)
        inputs, targets = rank_rows(inputs, layout, mesh), rank_rows(targets, layout, mesh)
        local = forward_backward(layout, runner, inputs, targets)
        tied.sync()
        reduce_expert_grads(runner.parts, layout)
        norm = clip_grad_norm(
            params,
            training.max_grad_norm,
            pp_group,
            tied.duplicates,
            experts,
            expert_grad_square(runner.parts, layout),
        )
        learning_rate = float(runner.optimizers[0].param_groups[0]["lr"])
        for optimizer in runner.optimizers:
            optimizer.step()
            optimizer.zero_grad(set_to_none=not buckets or step == first)
        update_biases(runner.parts)
        loss = global_loss(layout, mesh, local)  # the same value on every rank
        if not math.isfinite(loss):
            # Stopped before this step is reported or checkpointed: every checkpoint stays
            # finite, and a restart would only diverge again.
            raise LossNotFinite(step, loss)
        elapsed = time.perf_counter() - started
        record = StepRecord(
            step=step,
            loss=loss,
            grad_norm=float(norm.item()),
            learning_rate=learning_rate,
            step_time_s=elapsed,
            tokens_per_s=job.spec.tokens_per_step / elapsed,
            peak_memory_bytes=peak_memory()[0],
        )
        result.records.append(record)
        if on_step is not None:
            on_step(record)
        schedules.step()
        _report(step, validator.after_step(step), on_eval)
        every = training.checkpoint.every_steps
        if folder and ((every and step % every == 0) or step == training.steps):
            extra = {
                "data": data.state_dict(step),
                "schedulers": schedules.state_dict(),
                "evals": validator.state_dict(),
            }
            checkpoint.save(folder, step, runner, keep=job.pod.checkpoint_keep, extra=extra)
    _report(training.steps, validator.finish(training.steps), on_eval)
    export_weights(job, hf, runner)
    result.evals = validator.evals
    return result


def _report(step: int, loss: float | None, on_eval: Callable[[int, float], None] | None) -> None:
    """Hand a validation loss (None: none ran) to ``on_eval``."""
    if loss is not None and on_eval is not None:
        on_eval(step, loss)
