"""Typed trainer configuration, read from the environment the operator (or the local launcher) sets.

Every variable is documented in docs/env-contract.md and written by
``meshrun.envcontract.pod_env``. Bad values raise :class:`ConfigError` naming the variable and the
rule, so a misconfigured pod fails with one readable line instead of a traceback.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from meshrun.presets import PRESETS, ModelShape
from meshrun_trainer.layout import (
    SCHEDULES,
    ConfigError,
    Layout,
    even_stage_layers,
    parse_stage_layers,
    validate_layout,
)

__all__ = [
    "ConfigError",
    "Layout",
    "TrainConfig",
    "Training",
    "even_stage_layers",
    "from_env",
    "parse_stage_layers",
    "validate_layout",
]

DATASETS = ("synthetic", "corpus")
PRECISIONS = ("fp32", "bf16")


@dataclass(frozen=True)
class Training:
    """Optimisation and I/O settings."""

    steps: int
    """Optimizer steps to run (in total, counting steps restored from a checkpoint)."""
    global_batch_size: int
    """Sequences per optimizer step over all data-parallel replicas."""
    micro_batch_size: int
    """Sequences per micro-batch (informational: the layout's counts decide the split)."""
    precision: str
    """fp32, or bf16 autocast over fp32 master weights."""
    learning_rate: float
    """AdamW learning rate."""
    seed: int
    """Seed for the weights and the data order (identical for every layout)."""
    dataset: str
    """synthetic (a learnable deterministic stream) or corpus (the shipped text, bytes)."""
    max_grad_norm: float
    """Global gradient-norm clipping threshold (0 disables clipping)."""
    checkpoint_dir: str | None
    """Directory of distributed checkpoints; None disables checkpointing."""
    checkpoint_every: int
    """Save every this many steps (0: only the final step)."""
    checkpoint_keep: int
    """Complete checkpoints to keep, newest first (0 keeps all)."""


@dataclass(frozen=True)
class TrainConfig:
    """Everything one trainer process needs."""

    model: ModelShape
    """Transformer shape."""
    preset: str
    """Preset name the shape came from ("custom" when given explicitly)."""
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

    @property
    def tokens_per_step(self) -> int:
        return self.training.global_batch_size * self.model.seq_len


def _get(env: Mapping[str, str], name: str, default: str | None = None) -> str:
    value = env.get(name, default)
    if value is None or value == "":
        raise ConfigError(name, "is required but not set")
    return value


def _int(env: Mapping[str, str], name: str, default: int | None = None, minimum: int = 1) -> int:
    raw = _get(env, name, None if default is None else str(default))
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(name, f"must be an integer, got {raw!r}") from None
    if value < minimum:
        raise ConfigError(name, f"must be >= {minimum}, got {value}")
    return value


def _float(env: Mapping[str, str], name: str, default: float, minimum: float = 0.0) -> float:
    raw = _get(env, name, str(default))
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(name, f"must be a number, got {raw!r}") from None
    if not value >= minimum:
        raise ConfigError(name, f"must be >= {minimum}, got {raw}")
    return value


def _choice(env: Mapping[str, str], name: str, default: str, choices: tuple[str, ...]) -> str:
    value = _get(env, name, default).lower()
    if value not in choices:
        raise ConfigError(name, f"must be one of {', '.join(choices)}, got {value!r}")
    return value


def _model(env: Mapping[str, str]) -> tuple[str, ModelShape]:
    preset = env.get("MESHRUN_MODEL_PRESET", "") or "custom"
    base = PRESETS.get(preset)
    if base is None and preset != "custom":
        raise ConfigError(
            "MESHRUN_MODEL_PRESET", f"unknown preset {preset!r}; use one of {sorted(PRESETS)}"
        )

    def dim(name: str, fallback: int | None) -> int:
        return _int(env, f"MESHRUN_MODEL_{name}", fallback)

    heads = dim("HEADS", base.heads if base else None)
    hidden = dim("HIDDEN", base.hidden if base else None)
    shape = ModelShape(
        layers=dim("LAYERS", base.layers if base else None),
        hidden=hidden,
        heads=heads,
        vocab=dim("VOCAB", base.vocab if base else None),
        seq_len=dim("SEQ_LEN", base.seq_len if base else None),
        ffn_hidden=dim("FFN_HIDDEN", base.ffn_hidden if base else 4 * hidden),
        kv_heads=dim("KV_HEADS", base.kv_heads if base else heads),
    )
    if shape.hidden % shape.heads:
        raise ConfigError("MESHRUN_MODEL_HIDDEN", f"{shape.hidden} must divide by heads={heads}")
    if shape.heads % shape.kv_heads:
        raise ConfigError("MESHRUN_MODEL_KV_HEADS", f"{shape.kv_heads} must divide heads={heads}")
    if shape.head_dim % 2:
        raise ConfigError("MESHRUN_MODEL_HIDDEN", "hidden/heads must be even for rotary embeddings")
    return preset, shape


def _layout(env: Mapping[str, str], model: ModelShape) -> Layout:
    dp, pp, tp = (_int(env, f"MESHRUN_{d}", 1) for d in ("DP", "PP", "TP"))
    schedule = _choice(env, "MESHRUN_PIPELINE_SCHEDULE", "1f1b", SCHEDULES)
    virtual = _int(env, "MESHRUN_VIRTUAL_STAGES", 1)
    if pp > 1 and schedule == "interleaved-1f1b" and virtual < 2:
        raise ConfigError("MESHRUN_VIRTUAL_STAGES", "interleaved-1f1b needs >= 2 stages per rank")
    if pp == 1 or schedule != "interleaved-1f1b":
        virtual = 1
    raw_stages = env.get("MESHRUN_STAGE_LAYERS", "")
    stages = parse_stage_layers(raw_stages) if raw_stages else ()
    if len(stages) != pp * virtual:
        # The planner lists one range per pipeline rank; interleaving needs pp * v chunks in
        # stage order (rank r holds chunks r, r + pp, ...), so re-split evenly.
        stages = even_stage_layers(model.layers, pp * virtual)
    layout = Layout(
        dp=dp,
        pp=pp,
        tp=tp,
        zero_stage=_int(env, "MESHRUN_ZERO_STAGE", 0, minimum=0),
        schedule=schedule,
        micro_batches=_int(env, "MESHRUN_MICRO_BATCHES", 1) if pp > 1 else 1,
        virtual_stages=virtual,
        grad_accumulation=_int(env, "MESHRUN_GRAD_ACCUMULATION", 1),
        stage_layers=stages,
    )
    validate_layout(layout, model)
    return layout


def _training(env: Mapping[str, str], layout: Layout, model: ModelShape) -> Training:
    checkpoint_dir = env.get("MESHRUN_CHECKPOINT_DIR") or None
    training = Training(
        steps=_int(env, "MESHRUN_STEPS", 10),
        global_batch_size=_int(env, "MESHRUN_GLOBAL_BATCH_SIZE", 8),
        micro_batch_size=_int(env, "MESHRUN_MICRO_BATCH_SIZE", 1),
        precision=_choice(env, "MESHRUN_PRECISION", "fp32", PRECISIONS),
        learning_rate=_float(env, "MESHRUN_LEARNING_RATE", 1e-3),
        seed=_int(env, "MESHRUN_SEED", 0, minimum=0),
        dataset=_choice(env, "MESHRUN_DATASET", "synthetic", DATASETS),
        max_grad_norm=_float(env, "MESHRUN_MAX_GRAD_NORM", 1.0),
        checkpoint_dir=checkpoint_dir,
        checkpoint_every=_int(env, "MESHRUN_CHECKPOINT_EVERY", 0, minimum=0),
        checkpoint_keep=_int(env, "MESHRUN_CHECKPOINT_KEEP", 2, minimum=0),
    )
    validate_batch(training, layout)
    if training.dataset == "corpus" and model.vocab < 256:
        raise ConfigError(
            "MESHRUN_DATASET", f"corpus needs vocab >= 256 (bytes), got {model.vocab}"
        )
    return training


def validate_batch(training: Training, layout: Layout) -> None:
    """The global batch must split evenly over replicas, accumulation steps and micro-batches."""
    split = layout.dp * layout.grad_accumulation * layout.micro_batches
    if training.global_batch_size % split:
        raise ConfigError(
            "MESHRUN_GLOBAL_BATCH_SIZE",
            f"{training.global_batch_size} must divide by dp*gradAccumulation*microBatches={split}",
        )


def from_env(env: Mapping[str, str] | None = None) -> TrainConfig:
    """Build the configuration from ``env`` (default: ``os.environ``)."""
    env = os.environ if env is None else env
    preset, model = _model(env)
    layout = _layout(env, model)
    world = env.get("WORLD_SIZE")
    if world is not None and world.isdigit() and int(world) != layout.world_size:
        raise ConfigError(
            "WORLD_SIZE", f"{world} != MESHRUN_DP*MESHRUN_PP*MESHRUN_TP={layout.world_size}"
        )
    return TrainConfig(
        model=model,
        preset=preset,
        layout=layout,
        training=_training(env, layout, model),
        job_name=env.get("MESHRUN_JOB_NAME", "local"),
        namespace=env.get("MESHRUN_NAMESPACE", "default"),
        attempt=_int(env, "MESHRUN_ATTEMPT", 0, minimum=0),
        metrics_port=_int(env, "MESHRUN_METRICS_PORT", 9400, minimum=0),
        termination_log=env.get("MESHRUN_TERMINATION_LOG", "/dev/termination-log"),
    )
