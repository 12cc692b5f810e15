"""Typed trainer configuration, read from the environment the operator (or the local launcher) sets.

Every variable is written by ``meshrun.envcontract.pod_env`` and documented in
docs/env-contract.md. The trainer has no defaults of its own: a missing variable is a
:class:`ConfigError`, and so is a value that breaks a rule. The rules are the planner's own
(:mod:`meshrun.rules`), so a job that ``meshrun plan`` accepts starts without a configuration
error; the error names the variable, the spec field it carries and the rule.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import get_args

from meshrun.api.errors import SpecError
from meshrun.api.presets import ModelShape
from meshrun.api.spec import Accelerator, Checkpointing, Dataset, Precision, Schedule
from meshrun.api.userspec import Data, DataFormat, LRDecay, LRSchedule, Optimizer, Validation
from meshrun.envcontract import ENV_OF_FIELD
from meshrun.rules.inputs import check_data_source, check_warmup
from meshrun.rules.strategy import check_data, check_layout, check_model
from meshrun_trainer.config.layout import (
    ConfigError,
    Layout,
    check_stage_layers,
    parse_stage_layers,
)


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

    @property
    def tokens_per_step(self) -> int:
        return self.training.global_batch_size * self.model.seq_len


class _Env:
    """Typed reads of required variables; each failure names the variable."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = env

    def text(self, name: str, *, empty: bool = False) -> str:
        value = self.env.get(name)
        if value is None or (value == "" and not empty):
            raise ConfigError(name, "is required but not set (meshrun.envcontract.pod_env sets it)")
        return value

    def int(self, name: str, minimum: int = 1) -> int:
        raw = self.text(name)
        try:
            value = int(raw)
        except ValueError:
            raise ConfigError(name, f"must be an integer, got {raw!r}") from None
        if value < minimum:
            raise ConfigError(name, f"must be >= {minimum}, got {value}")
        return value

    def number(self, name: str, high: float | None = None) -> float:
        """A number in [0, high] (``high`` None: no upper bound)."""
        raw = self.text(name)
        try:
            value = float(raw)
        except ValueError:
            raise ConfigError(name, f"must be a number, got {raw!r}") from None
        if not value >= 0 or (high is not None and value > high):
            most = f" and <= {high}" if high is not None else ""
            raise ConfigError(name, f"must be >= 0{most}, got {raw}")
        return value

    def betas(self, name: str) -> list[float]:
        """Two comma-separated numbers in [0, 1)."""
        raw = self.text(name)
        try:
            values = [float(part) for part in raw.split(",")]
        except ValueError:
            values = []
        if len(values) != 2 or not all(0 <= value < 1 for value in values):
            raise ConfigError(name, f"must be two numbers in [0, 1) like 0.9,0.95, got {raw!r}")
        return values

    def float(self, name: str) -> float:
        raw = self.text(name)
        try:
            value = float(raw)
        except ValueError:
            raise ConfigError(name, f"must be a number, got {raw!r}") from None
        if not value > 0:
            raise ConfigError(name, f"must be greater than 0, got {raw}")
        return value

    def choice(self, name: str, choices: tuple[str, ...]) -> str:
        value = self.text(name)
        if value not in choices:
            raise ConfigError(name, f"must be one of {', '.join(choices)}, got {value!r}")
        return value


@contextmanager
def _as_config_errors() -> Iterator[None]:
    """A broken rule, reported with the variable that carries the field it names."""
    try:
        yield
    except ConfigError:
        raise
    except SpecError as error:
        variable = ENV_OF_FIELD.get(error.field, error.field)
        raise ConfigError(variable, f"{error.field}: {error.rule}") from None


def _model(env: _Env) -> ModelShape:
    def dim(name: str) -> int:
        return env.int(f"MESHRUN_MODEL_{name}")

    return ModelShape(
        layers=dim("LAYERS"),
        hidden=dim("HIDDEN"),
        heads=dim("HEADS"),
        vocab=dim("VOCAB"),
        seq_len=dim("SEQ_LEN"),
        ffn_hidden=dim("FFN_HIDDEN"),
        kv_heads=dim("KV_HEADS"),
    )


def _layout(env: _Env) -> Layout:
    return Layout(
        dp=env.int("MESHRUN_DP"),
        pp=env.int("MESHRUN_PP"),
        tp=env.int("MESHRUN_TP"),
        zero_stage=env.int("MESHRUN_ZERO_STAGE", minimum=0),
        schedule=env.choice("MESHRUN_PIPELINE_SCHEDULE", get_args(Schedule)),
        micro_batches=env.int("MESHRUN_MICRO_BATCHES"),
        virtual_stages=env.int("MESHRUN_VIRTUAL_STAGES"),
        grad_accumulation=env.int("MESHRUN_GRAD_ACCUMULATION"),
        stage_layers=parse_stage_layers(env.text("MESHRUN_STAGE_LAYERS")),
    )


def _training(env: _Env) -> Training:
    return Training(
        steps=env.int("MESHRUN_STEPS"),
        global_batch_size=env.int("MESHRUN_GLOBAL_BATCH_SIZE"),
        micro_batch_size=env.int("MESHRUN_MICRO_BATCH_SIZE"),
        precision=env.choice("MESHRUN_PRECISION", get_args(Precision)),
        activation_checkpointing=env.choice(
            "MESHRUN_ACTIVATION_CHECKPOINTING", get_args(Checkpointing)
        ),
        compile=env.choice("MESHRUN_COMPILE", ("true", "false")) == "true",
        learning_rate=env.float("MESHRUN_LEARNING_RATE"),
        seed=env.int("MESHRUN_SEED", minimum=0),
        dataset=env.choice("MESHRUN_DATASET", get_args(Dataset)),
        max_grad_norm=env.float("MESHRUN_MAX_GRAD_NORM"),
        checkpoint_dir=env.text("MESHRUN_CHECKPOINT_DIR", empty=True) or None,
        checkpoint_every=env.int("MESHRUN_CHECKPOINT_EVERY", minimum=0),
        checkpoint_keep=env.int("MESHRUN_CHECKPOINT_KEEP", minimum=0),
        optimizer=Optimizer(
            betas=env.betas("MESHRUN_OPTIMIZER_BETAS"),
            weight_decay=env.number("MESHRUN_OPTIMIZER_WEIGHT_DECAY"),
        ),
        lr_schedule=LRSchedule(
            warmup_steps=env.int("MESHRUN_LR_WARMUP_STEPS", minimum=0),
            decay=env.choice("MESHRUN_LR_DECAY", get_args(LRDecay)),  # type: ignore[arg-type]
            min_ratio=env.number("MESHRUN_LR_MIN_RATIO", high=1.0),
        ),
        data=_data(env),
        export_path=env.text("MESHRUN_EXPORT_PATH", empty=True) or None,
    )


def _data(env: _Env) -> Data | None:
    """The job's own data; MESHRUN_DATA_FORMAT empty means none (every DATA variable empty)."""
    names = ("FORMAT", "PATH", "TEXT_FIELD", "VALIDATION_PATH")
    values = {name: env.text(f"MESHRUN_DATA_{name}", empty=True) for name in names}
    every = env.int("MESHRUN_DATA_EVAL_EVERY_STEPS", minimum=0)
    if not values["FORMAT"]:
        return None
    validation = values["VALIDATION_PATH"]
    return Data(
        format=env.choice("MESHRUN_DATA_FORMAT", get_args(DataFormat)),  # type: ignore[arg-type]
        path=env.text("MESHRUN_DATA_PATH"),
        text_field=env.text("MESHRUN_DATA_TEXT_FIELD"),
        validation=Validation(path=validation) if validation else None,
        eval_every_steps=every,
    )


def from_env(env: Mapping[str, str] | None = None) -> TrainConfig:
    """Build and check the configuration from ``env`` (default: ``os.environ``)."""
    read = _Env(os.environ if env is None else env)
    model, layout, training = _model(read), _layout(read), _training(read)
    world = read.env.get("WORLD_SIZE")  # set by torchrun for every process
    with _as_config_errors():
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
            hf = read.text("MESHRUN_MODEL_HF_PATH", empty=True)
            check_data_source(training.data.format, training.data.text_field, bool(hf))
        check_warmup(training.lr_schedule.warmup_steps, training.steps)
    check_stage_layers(layout, model.layers)
    return TrainConfig(
        model=model,
        preset=read.text("MESHRUN_MODEL_PRESET"),
        hf_path=read.text("MESHRUN_MODEL_HF_PATH", empty=True) or None,
        layout=layout,
        training=training,
        job_name=read.text("MESHRUN_JOB_NAME"),
        namespace=read.text("MESHRUN_NAMESPACE"),
        attempt=read.int("MESHRUN_ATTEMPT", minimum=0),
        metrics_port=read.int("MESHRUN_METRICS_PORT", minimum=0),
        termination_log=read.text("MESHRUN_TERMINATION_LOG"),
        accelerator=read.choice("MESHRUN_ACCELERATOR", get_args(Accelerator)),
    )
