"""The trainer's configuration, read from the job document (``MESHRUN_JOB``, meshrun.jobdoc)
the operator (or the local launcher) sets.

The document holds the defaulted spec and the plan, read back into the core's own types by the
planner's reader, so the trainer has no schema or defaults of its own. The rules are the
planner's (:mod:`meshrun.rules`), so a job that ``meshrun plan`` accepts starts without a
configuration error; an error names the spec field and the rule.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, fields

from meshrun.api.errors import SpecError
from meshrun.api.presets import ModelShape
from meshrun.api.spec import JobSpec
from meshrun.api.userspec import Data, LRSchedule, Optimizer
from meshrun.jobdoc import JOB_VARIABLE, JobDocument, read_document
from meshrun.planner.plan import Plan
from meshrun.rules.inputs import check_data_source, check_warmup
from meshrun.rules.strategy import check_data, check_layout, check_model
from meshrun_trainer.config.layout import ConfigError, Layout, check_stage_layers


@dataclass(frozen=True)
class Training:
    """Optimisation and I/O settings."""

    steps: int
    """Optimizer steps to run (in total, counting steps restored from a checkpoint)."""
    global_batch_size: int
    """Sequences per optimizer step over all data-parallel replicas."""
    micro_batch_size: int
    """Sequences per forward pass on one rank."""
    precision: str
    """fp32, or bf16 compute over fp32 master weights (docs/trainer.md)."""
    activation_checkpointing: str
    """none, selective or full (meshrun_trainer.distributed.blocks); the planner's choice."""
    compile: bool
    """torch.compile each transformer block."""
    learning_rate: float
    """AdamW learning rate."""
    seed: int
    """Seed for the weights and the data order (identical for every layout)."""
    dataset: str
    """synthetic (a learnable deterministic stream) or corpus (the shipped text, bytes)."""
    max_grad_norm: float
    """Global gradient-norm clipping threshold."""
    checkpoint_dir: str | None
    """Directory of distributed checkpoints; None disables checkpointing."""
    checkpoint_every: int
    """Save every this many steps (0: only the final step)."""
    checkpoint_keep: int
    """Complete checkpoints to keep, newest first (0 keeps all)."""
    optimizer: Optimizer
    """AdamW's betas and weight decay (the peak learning rate is ``learning_rate``)."""
    lr_schedule: LRSchedule
    """Warmup and decay of the learning rate."""
    data: Data | None
    """The job's own data (then ``dataset`` is not read), or None."""
    export_path: str | None
    """Write the trained model here as a Hugging Face folder at the end, or None."""


@dataclass(frozen=True)
class TrainConfig:
    """Everything one trainer process needs."""

    model: ModelShape
    """Transformer shape."""
    preset: str
    """Preset name the shape came from ("custom" when given explicitly)."""
    hf_path: str | None
    """The Hugging Face folder the model comes from (meshrun_trainer.config.userrun), or None."""
    layout: Layout
    """Parallel layout."""
    training: Training
    """Optimisation settings."""
    job_name: str
    """ParallelTrainingJob name (labels metrics)."""
    namespace: str
    """Kubernetes namespace of the job."""
    attempt: int
    """Whole-job restart attempt, 0 for the first run."""
    metrics_port: int
    """Port of rank 0's /metrics and /progress server (0 disables it)."""
    termination_log: str
    """File that receives the final JSON summary (the pod's termination message)."""
    accelerator: str
    """What the pod asked for: nvidia.com/gpu (CUDA is then required) or cpu."""
    spec: JobSpec
    """The job's whole defaulted spec, as the planner read it (a new spec field is here)."""

    @property
    def tokens_per_step(self) -> int:
        return self.training.global_batch_size * self.model.seq_len


@contextmanager
def _as_config_errors() -> Iterator[None]:
    """A broken rule, reported as the trainer's ConfigError naming the spec field."""
    try:
        yield
    except ConfigError:
        raise
    except SpecError as error:
        raise ConfigError(error.field, error.rule) from None


def _training(document: JobDocument) -> Training:
    training, pod = document.spec.training, document.pod
    same = {field.name for field in fields(Training)} & {field.name for field in fields(training)}
    return Training(
        **{
            name: getattr(training, name)
            for name in same - {"activation_checkpointing", "dataset", "micro_batch_size"}
        },
        # the plan's, not the spec's: auto chooses them where the spec leaves them unset
        activation_checkpointing=document.plan.activation_checkpointing,
        micro_batch_size=document.plan.micro_batch_size,
        dataset=document.spec.dataset,
        checkpoint_dir=pod.checkpoint_dir,
        checkpoint_every=training.checkpoint.every_steps,
        checkpoint_keep=pod.checkpoint_keep,
        export_path=training.export.path if training.export is not None else None,
    )


def _layout(plan: Plan) -> Layout:
    """The plan's layout with each stage's layers, in stage order (virtual * pp + pp rank)."""
    pp = plan.layout.pp
    stages = sorted(plan.stages, key=lambda stage: stage.virtual * pp + stage.pp)
    return Layout(
        **{field.name: getattr(plan.layout, field.name) for field in fields(plan.layout)},
        stage_layers=tuple((stage.first, stage.last) for stage in stages),
    )


def from_env(env: Mapping[str, str] | None = None) -> TrainConfig:
    """Read the job document from ``env`` (default: ``os.environ``) and check it with the
    planner's rules; a broken one is a ConfigError naming the spec field."""
    env = os.environ if env is None else env
    text = env.get(JOB_VARIABLE)
    if not text:
        raise ConfigError(
            JOB_VARIABLE, "is required but not set (meshrun.envcontract.pod_env sets it)"
        )
    world = env.get("WORLD_SIZE")  # set by torchrun for every process
    with _as_config_errors():
        document = read_document(text)
        spec, plan = document.spec, document.plan
        model, layout, training = plan.model, _layout(plan), _training(document)
        check_model(model)
        check_layout(
            layout,
            model,
            global_batch_size=training.global_batch_size,
            micro_batch_size=training.micro_batch_size,
            world_size=int(world) if world and world.isdigit() else None,
        )
        if training.data is None:
            check_data(training.dataset, model)
        else:
            check_data_source(
                training.data.format, training.data.text_field, spec.model.hf is not None
            )
        check_warmup(training.lr_schedule.warmup_steps, training.steps)
    check_stage_layers(layout, model.layers)
    return TrainConfig(
        model=model,
        preset=plan.preset or "custom",
        hf_path=spec.model.hf.path if spec.model.hf is not None else None,
        layout=layout,
        training=training,
        job_name=document.pod.job_name,
        namespace=document.pod.namespace,
        attempt=document.pod.attempt,
        metrics_port=document.pod.metrics_port,
        termination_log=document.pod.termination_log,
        accelerator=spec.resources.accelerator,
        spec=spec,
    )
