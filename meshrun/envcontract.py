"""The environment of one trainer pod: the contract between the operator and the trainer.

The operator and ``meshrun run --local`` both call :func:`pod_env`, so a local run sees exactly
what a pod would, and the trainer reads every value back from these variables (it has no
defaults of its own). Every variable is documented in docs/env-contract.md. torchrun reads the
PET_* variables (the Kubeflow Trainer v2 convention) and sets RANK, LOCAL_RANK and WORLD_SIZE
for each process it starts; MASTER_ADDR/MASTER_PORT/WORLD_SIZE are also set here for tools
that read them before torchrun runs. Pure: no I/O, no torch.

This module is also the one home of the pod's constants: ports, the termination-log path and
the trainer's command.
"""

from __future__ import annotations

from meshrun.api.spec import JobSpec
from meshrun.planner.plan import Plan

RENDEZVOUS_PORT = 29500
"""torchrun's default rendezvous port, on pod 0."""
METRICS_PORT = 9400
"""Rank 0 serves /metrics and /progress here (HTTP)."""
TERMINATION_LOG = "/dev/termination-log"
"""Kubernetes' default terminationMessagePath; the trainer writes its JSON summary there."""
TRAINER_COMMAND = ("python", "-m", "torch.distributed.run", "-m", "meshrun_trainer")
"""The pod's default command: torchrun (configured by PET_*) running the trainer module."""
CHECKPOINT_KEEP = 2
"""Complete checkpoints kept, newest first (older ones are deleted after each save)."""
EXIT_CONFIG_ERROR = 2
"""The trainer's exit code for a configuration a restart cannot fix (reason ConfigError)."""
EXIT_NO_ACCELERATOR = 3
"""The trainer's exit code when a GPU job finds no usable CUDA device (reason NoAccelerator)."""
EXIT_LOSS_NOT_FINITE = 4
"""The trainer's exit code when the training loss turned NaN or infinite (reason LossNotFinite):
training on would only spread it, and a restart from the last checkpoint diverges again."""
PERMANENT_REASONS = {
    EXIT_CONFIG_ERROR: "ConfigError",
    EXIT_NO_ACCELERATOR: "NoAccelerator",
    EXIT_LOSS_NOT_FINITE: "LossNotFinite",
}
"""Permanent trainer failures by exit code. torchrun exits 1 whatever its worker's code, so the
trainer also writes ``{"status": "Failed", "reason": ..., "permanent": true, "error": ...}`` to
the termination log, which the operator reads."""

ENV_OF_FIELD = {
    "spec.strategy": "WORLD_SIZE",
    "spec.strategy.dataParallel": "MESHRUN_DP",
    "spec.strategy.pipelineParallel": "MESHRUN_PP",
    "spec.strategy.tensorParallel": "MESHRUN_TP",
    "spec.strategy.zeroStage": "MESHRUN_ZERO_STAGE",
    "spec.strategy.pipelineSchedule": "MESHRUN_PIPELINE_SCHEDULE",
    "spec.strategy.microBatches": "MESHRUN_MICRO_BATCHES",
    "spec.strategy.virtualStages": "MESHRUN_VIRTUAL_STAGES",
    "spec.model.preset": "MESHRUN_MODEL_PRESET",
    "spec.model.layers": "MESHRUN_MODEL_LAYERS",
    "spec.model.hidden": "MESHRUN_MODEL_HIDDEN",
    "spec.model.heads": "MESHRUN_MODEL_HEADS",
    "spec.model.kvHeads": "MESHRUN_MODEL_KV_HEADS",
    "spec.model.vocab": "MESHRUN_MODEL_VOCAB",
    "spec.model.seqLen": "MESHRUN_MODEL_SEQ_LEN",
    "spec.model.ffnHidden": "MESHRUN_MODEL_FFN_HIDDEN",
    "spec.training.steps": "MESHRUN_STEPS",
    "spec.training.globalBatchSize": "MESHRUN_GLOBAL_BATCH_SIZE",
    "spec.training.microBatchSize": "MESHRUN_MICRO_BATCH_SIZE",
    "spec.training.precision": "MESHRUN_PRECISION",
    "spec.training.activationCheckpointing": "MESHRUN_ACTIVATION_CHECKPOINTING",
    "spec.training.compile": "MESHRUN_COMPILE",
    "spec.resources.accelerator": "MESHRUN_ACCELERATOR",
    "spec.training.learningRate": "MESHRUN_LEARNING_RATE",
    "spec.training.seed": "MESHRUN_SEED",
    "spec.training.maxGradNorm": "MESHRUN_MAX_GRAD_NORM",
    "spec.training.dataset": "MESHRUN_DATASET",
    "spec.training.checkpoint.everySteps": "MESHRUN_CHECKPOINT_EVERY",
}
"""The variable that carries each spec field (the trainer names both in its errors)."""

INPUT_VARIABLES = {
    "MESHRUN_MODEL_HF_PATH": "spec.model.hf.path",
    "MESHRUN_DATA_FORMAT": "spec.training.data.format",
    "MESHRUN_DATA_PATH": "spec.training.data.path",
    "MESHRUN_DATA_TEXT_FIELD": "spec.training.data.textField",
    "MESHRUN_DATA_VALIDATION_PATH": "spec.training.data.validation.path",
    "MESHRUN_DATA_EVAL_EVERY_STEPS": "spec.training.data.evalEverySteps",
    "MESHRUN_OPTIMIZER_BETAS": "spec.training.optimizer.betas",
    "MESHRUN_OPTIMIZER_WEIGHT_DECAY": "spec.training.optimizer.weightDecay",
    "MESHRUN_LR_WARMUP_STEPS": "spec.training.lrSchedule.warmupSteps",
    "MESHRUN_LR_DECAY": "spec.training.lrSchedule.decay",
    "MESHRUN_LR_MIN_RATIO": "spec.training.lrSchedule.minRatio",
    "MESHRUN_EXPORT_PATH": "spec.training.export.path",
}
"""The variables of the job's own parts (model folder, data, optimizer, schedule, export) and
the field each carries; an optional section's variables are empty when it is unset."""
ENV_OF_FIELD |= {field: variable for variable, field in INPUT_VARIABLES.items()}


def stage_layers(plan: Plan) -> str:
    """``"0-1,2-3"``: the plan's layer ranges in global stage order (virtual * pp + pp rank)."""
    pp = plan.layout.pp
    stages = sorted(plan.stages, key=lambda s: s.virtual * pp + s.pp)
    return ",".join(f"{s.first}-{s.last}" for s in stages)


def pod_env(
    plan: Plan,
    job: JobSpec,
    *,
    job_name: str,
    namespace: str,
    pod_index: int,
    master_addr: str,
    master_port: int = RENDEZVOUS_PORT,
    attempt: int = 0,
    checkpoint_dir: str | None = None,
) -> dict[str, str]:
    """The environment of pod ``pod_index`` of the job ``job`` planned as ``plan``."""
    layout, model, training = plan.layout, plan.model, job.training
    nodes = job.resources.num_nodes
    if not 0 <= pod_index < nodes:
        raise ValueError(f"pod_index: {pod_index} must be in [0, numNodes={nodes})")
    return {
        # torch.distributed / torchrun
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "WORLD_SIZE": str(plan.world_size),
        "PET_NNODES": str(nodes),
        "PET_NPROC_PER_NODE": str(job.resources.num_proc_per_node),
        "PET_NODE_RANK": str(pod_index),
        "PET_MASTER_ADDR": master_addr,
        "PET_MASTER_PORT": str(master_port),
        # job identity
        "MESHRUN_JOB_NAME": job_name,
        "MESHRUN_NAMESPACE": namespace,
        "MESHRUN_ATTEMPT": str(attempt),
        "MESHRUN_POD_INDEX": str(pod_index),
        "MESHRUN_STRATEGY": plan.strategy,
        "MESHRUN_ACCELERATOR": job.resources.accelerator,
        # layout
        "MESHRUN_DP": str(layout.dp),
        "MESHRUN_PP": str(layout.pp),
        "MESHRUN_TP": str(layout.tp),
        "MESHRUN_ZERO_STAGE": str(layout.zero_stage),
        "MESHRUN_PIPELINE_SCHEDULE": layout.schedule,
        "MESHRUN_MICRO_BATCHES": str(layout.micro_batches),
        "MESHRUN_VIRTUAL_STAGES": str(layout.virtual_stages),
        "MESHRUN_GRAD_ACCUMULATION": str(layout.grad_accumulation),
        "MESHRUN_STAGE_LAYERS": stage_layers(plan),
        # model
        "MESHRUN_MODEL_PRESET": plan.preset or "custom",
        "MESHRUN_MODEL_LAYERS": str(model.layers),
        "MESHRUN_MODEL_HIDDEN": str(model.hidden),
        "MESHRUN_MODEL_HEADS": str(model.heads),
        "MESHRUN_MODEL_KV_HEADS": str(model.kv_heads),
        "MESHRUN_MODEL_VOCAB": str(model.vocab),
        "MESHRUN_MODEL_SEQ_LEN": str(model.seq_len),
        "MESHRUN_MODEL_FFN_HIDDEN": str(model.ffn_hidden),
        # training
        "MESHRUN_STEPS": str(training.steps),
        "MESHRUN_GLOBAL_BATCH_SIZE": str(training.global_batch_size),
        "MESHRUN_MICRO_BATCH_SIZE": str(plan.micro_batch_size),
        "MESHRUN_PRECISION": training.precision,
        "MESHRUN_ACTIVATION_CHECKPOINTING": plan.activation_checkpointing,
        "MESHRUN_COMPILE": "true" if training.compile else "false",
        "MESHRUN_LEARNING_RATE": repr(training.learning_rate),
        "MESHRUN_SEED": str(training.seed),
        "MESHRUN_MAX_GRAD_NORM": repr(training.max_grad_norm),
        "MESHRUN_DATASET": job.dataset,
        "MESHRUN_CHECKPOINT_DIR": checkpoint_dir or "",
        "MESHRUN_CHECKPOINT_EVERY": str(training.checkpoint.every_steps),
        "MESHRUN_CHECKPOINT_KEEP": str(CHECKPOINT_KEEP),
        # progress
        "MESHRUN_METRICS_PORT": str(METRICS_PORT),
        "MESHRUN_TERMINATION_LOG": TERMINATION_LOG,
        **inputs_env(job),
    }


def inputs_env(job: JobSpec) -> dict[str, str]:
    """The variables of :data:`INPUT_VARIABLES` for ``job``."""
    hf, training = job.model.hf, job.training
    data, schedule, export = training.data, training.lr_schedule, training.export
    validation = data.validation if data is not None else None
    return {
        "MESHRUN_MODEL_HF_PATH": hf.path if hf is not None else "",
        "MESHRUN_DATA_FORMAT": data.format if data is not None else "",
        "MESHRUN_DATA_PATH": data.path if data is not None else "",
        "MESHRUN_DATA_TEXT_FIELD": data.text_field if data is not None else "",
        "MESHRUN_DATA_VALIDATION_PATH": validation.path if validation is not None else "",
        "MESHRUN_DATA_EVAL_EVERY_STEPS": str(data.eval_every_steps if data is not None else 0),
        "MESHRUN_OPTIMIZER_BETAS": ",".join(repr(beta) for beta in training.optimizer.betas),
        "MESHRUN_OPTIMIZER_WEIGHT_DECAY": repr(training.optimizer.weight_decay),
        "MESHRUN_LR_WARMUP_STEPS": str(schedule.warmup_steps),
        "MESHRUN_LR_DECAY": schedule.decay,
        "MESHRUN_LR_MIN_RATIO": repr(schedule.min_ratio),
        "MESHRUN_EXPORT_PATH": export.path if export is not None else "",
    }
