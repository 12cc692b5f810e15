"""The environment of one trainer pod: the contract between the operator and the trainer.

The operator and ``meshrun run --local`` both call :func:`pod_env`, so a local run sees exactly
what a pod would. Every variable is documented in docs/env-contract.md. torchrun reads the PET_*
variables (the Kubeflow Trainer v2 convention) and sets RANK, LOCAL_RANK and WORLD_SIZE for each
process it starts; MASTER_ADDR/MASTER_PORT/WORLD_SIZE are also set here for tools that read them
before torchrun runs. Pure: no I/O, no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

DEFAULT_MASTER_PORT = 29500
"""torchrun's default rendezvous port."""
METRICS_PORT = 9400
"""Rank 0 serves /metrics and /progress here (HTTP)."""
TERMINATION_LOG = "/dev/termination-log"
"""Kubernetes' default terminationMessagePath; the trainer writes its JSON summary there."""
TRAINER_COMMAND = ["python", "-m", "torch.distributed.run", "-m", "meshrun_trainer"]
"""The pod's default command: torchrun (configured by PET_*) running the trainer module."""


def _stage_layers(plan: Mapping[str, Any]) -> str:
    """``"0-1,2-3"``: layer ranges in global stage order (stage = virtual * pp + pp_rank)."""
    pp = int(plan["layout"]["pp"])
    stages = sorted(
        plan.get("stages", []), key=lambda s: int(s.get("virtual", 0)) * pp + int(s["pp"])
    )
    return ",".join(f"{s['layers'][0]}-{s['layers'][1]}" for s in stages)


def _dataset(training: Mapping[str, Any], vocab: int) -> str:
    # The shipped corpus is byte-tokenized, so it needs a vocabulary of at least 256.
    explicit = training.get("dataset")
    if explicit:
        return str(explicit)
    return "corpus" if vocab >= 256 else "synthetic"


def pod_env(
    plan: Mapping[str, Any],
    spec: Mapping[str, Any],
    *,
    job_name: str,
    namespace: str,
    pod_index: int,
    master_addr: str,
    master_port: int = DEFAULT_MASTER_PORT,
    attempt: int = 0,
    checkpoint_dir: str | None = None,
) -> dict[str, str]:
    """The environment of pod ``pod_index``, from ``Plan.to_dict()`` and the defaulted spec."""
    layout, model = plan["layout"], plan["model"]
    resources = spec.get("resources", {})
    training = spec.get("training", {})
    nodes = int(resources.get("numNodes", 1))
    per_node = int(resources.get("numProcPerNode", 1))
    if not 0 <= pod_index < nodes:
        raise ValueError(f"pod_index: {pod_index} must be in [0, numNodes={nodes})")
    checkpoint = training.get("checkpoint", {}) or {}
    env = {
        # torch.distributed / torchrun
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "WORLD_SIZE": str(plan["worldSize"]),
        "PET_NNODES": str(nodes),
        "PET_NPROC_PER_NODE": str(per_node),
        "PET_NODE_RANK": str(pod_index),
        "PET_MASTER_ADDR": master_addr,
        "PET_MASTER_PORT": str(master_port),
        # job identity
        "MESHRUN_JOB_NAME": job_name,
        "MESHRUN_NAMESPACE": namespace,
        "MESHRUN_ATTEMPT": str(attempt),
        "MESHRUN_POD_INDEX": str(pod_index),
        "MESHRUN_STRATEGY": str(plan.get("strategy", "")),
        # layout
        "MESHRUN_DP": str(layout["dp"]),
        "MESHRUN_PP": str(layout["pp"]),
        "MESHRUN_TP": str(layout["tp"]),
        "MESHRUN_ZERO_STAGE": str(layout.get("zeroStage", 0)),
        "MESHRUN_PIPELINE_SCHEDULE": str(layout.get("pipelineSchedule", "1f1b")),
        "MESHRUN_MICRO_BATCHES": str(layout.get("microBatches", 1)),
        "MESHRUN_VIRTUAL_STAGES": str(layout.get("virtualStages", 1)),
        "MESHRUN_GRAD_ACCUMULATION": str(layout.get("gradAccumulation", 1)),
        "MESHRUN_STAGE_LAYERS": _stage_layers(plan),
        # model
        "MESHRUN_MODEL_PRESET": str(model.get("preset") or "custom"),
        "MESHRUN_MODEL_LAYERS": str(model["layers"]),
        "MESHRUN_MODEL_HIDDEN": str(model["hidden"]),
        "MESHRUN_MODEL_HEADS": str(model["heads"]),
        "MESHRUN_MODEL_KV_HEADS": str(model.get("kvHeads", model["heads"])),
        "MESHRUN_MODEL_VOCAB": str(model["vocab"]),
        "MESHRUN_MODEL_SEQ_LEN": str(model["seqLen"]),
        "MESHRUN_MODEL_FFN_HIDDEN": str(model["ffnHidden"]),
        # training
        "MESHRUN_STEPS": str(training.get("steps", 100)),
        "MESHRUN_GLOBAL_BATCH_SIZE": str(training.get("globalBatchSize", 8)),
        "MESHRUN_MICRO_BATCH_SIZE": str(training.get("microBatchSize", 1)),
        "MESHRUN_PRECISION": str(training.get("precision", "bf16")),
        "MESHRUN_LEARNING_RATE": repr(float(training.get("learningRate", 3e-4))),
        "MESHRUN_SEED": str(training.get("seed", 0)),
        "MESHRUN_DATASET": _dataset(training, int(model["vocab"])),
        "MESHRUN_CHECKPOINT_EVERY": str(checkpoint.get("everySteps", 0)),
        "MESHRUN_CHECKPOINT_KEEP": str(checkpoint.get("keep", 2)),
        # progress
        "MESHRUN_METRICS_PORT": str(METRICS_PORT),
        "MESHRUN_TERMINATION_LOG": TERMINATION_LOG,
    }
    if "maxGradNorm" in training:
        env["MESHRUN_MAX_GRAD_NORM"] = str(training["maxGradNorm"])
    if checkpoint_dir:
        env["MESHRUN_CHECKPOINT_DIR"] = checkpoint_dir
    return env
