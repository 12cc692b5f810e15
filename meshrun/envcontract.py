"""The environment of one trainer pod: the contract between the operator and the trainer.

The operator and ``meshrun run --local`` both call :func:`pod_env`, so a local run sees exactly
what a pod would. The trainer reads one variable, ``MESHRUN_JOB`` (the job document,
:mod:`meshrun.jobdoc`); the others are torchrun's and the coordinates documented for a custom
entrypoint (docs/env-contract.md). torchrun reads the
PET_* variables (the Kubeflow Trainer v2 convention) and sets RANK, LOCAL_RANK and WORLD_SIZE
for each process it starts; MASTER_ADDR/MASTER_PORT/WORLD_SIZE are also set here for tools
that read them before torchrun runs. Pure: no I/O, no torch.

This module is also the one home of the pod's constants: ports, the termination-log path and
the trainer's command.
"""

from __future__ import annotations

from meshrun.api.layout import RANK_ORDER
from meshrun.api.spec import JobSpec
from meshrun.jobdoc import JOB_VARIABLE, JobDocument, Pod, write_document
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
METRICS_FOLDER = "tensorboard"
"""Where rank 0's TensorBoard event files go in the checkpoint folder unless
spec.training.metrics.path says otherwise."""
EXIT_CONFIG_ERROR = 2
"""The trainer's exit code for a configuration a restart cannot fix (reason ConfigError)."""
EXIT_NO_ACCELERATOR = 3
"""The trainer's exit code when a GPU job finds no usable CUDA device (reason NoAccelerator)."""
EXIT_LOSS_NOT_FINITE = 4
"""The trainer's exit code when the training loss turned NaN or infinite (reason LossNotFinite):
training on would only spread it, and a restart from the last checkpoint diverges again."""
EXIT_CHECKPOINT_REFUSED = 5
"""The trainer's exit code when the checkpoint it must resume from cannot be loaded into this
job (reason CheckpointRefused): it lacks state the model needs (another model's, or damaged),
or its metadata names code to run. A restart would pick the same checkpoint again."""
PERMANENT_REASONS = {
    EXIT_CONFIG_ERROR: "ConfigError",
    EXIT_NO_ACCELERATOR: "NoAccelerator",
    EXIT_LOSS_NOT_FINITE: "LossNotFinite",
    EXIT_CHECKPOINT_REFUSED: "CheckpointRefused",
}
"""Permanent trainer failures by exit code. torchrun exits 1 whatever its worker's code, so the
trainer also writes ``{"status": "Failed", "reason": ..., "permanent": true, "error": ...}`` to
the termination log, which the operator reads."""


def metrics_dir(spec: JobSpec, checkpoint_dir: str | None) -> str | None:
    """The folder of rank 0's TensorBoard event files: spec.training.metrics.path, else
    tensorboard/ in the checkpoint folder; None when the spec turns them off or there is
    neither (a local run without a checkpoint folder)."""
    metrics = spec.training.metrics
    if not metrics.tensorboard:
        return None
    if metrics.path is not None:
        return metrics.path
    return f"{checkpoint_dir.rstrip('/')}/{METRICS_FOLDER}" if checkpoint_dir else None


def pod_env(
    plan: Plan,
    spec: JobSpec,
    *,
    job_name: str,
    namespace: str,
    pod_index: int,
    master_addr: str,
    master_port: int = RENDEZVOUS_PORT,
    attempt: int = 0,
    checkpoint_dir: str | None = None,
    metrics_port: int = METRICS_PORT,
    termination_log: str = TERMINATION_LOG,
) -> dict[str, str]:
    """The environment of pod ``pod_index`` of the job ``spec`` planned as ``plan``: torchrun's
    variables, the documented coordinates for a custom entrypoint, and the job document."""
    layout, nodes = plan.layout, spec.resources.num_nodes
    if not 0 <= pod_index < nodes:
        raise ValueError(f"pod_index: {pod_index} must be in [0, numNodes={nodes})")
    pod = Pod(
        job_name=job_name,
        namespace=namespace,
        index=pod_index,
        attempt=attempt,
        checkpoint_dir=checkpoint_dir or None,
        checkpoint_keep=CHECKPOINT_KEEP,
        metrics_port=metrics_port,
        termination_log=termination_log,
    )
    return {
        # torch.distributed / torchrun
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "WORLD_SIZE": str(plan.world_size),
        "PET_NNODES": str(nodes),
        "PET_NPROC_PER_NODE": str(spec.resources.num_proc_per_node),
        "PET_NODE_RANK": str(pod_index),
        "PET_MASTER_ADDR": master_addr,
        "PET_MASTER_PORT": str(master_port),
        # the coordinates a custom entrypoint reads (docs/env-contract.md)
        "MESHRUN_JOB_NAME": job_name,
        "MESHRUN_NAMESPACE": namespace,
        "MESHRUN_ATTEMPT": str(attempt),
        "MESHRUN_POD_INDEX": str(pod_index),
        "MESHRUN_DP": str(layout.dp),
        "MESHRUN_CP": str(layout.cp),
        "MESHRUN_PP": str(layout.pp),
        "MESHRUN_TP": str(layout.tp),
        "MESHRUN_EP": str(layout.ep),
        "MESHRUN_ETP": str(layout.etp),
        # a process's coordinates from its RANK: mixed radix over these, outermost first
        "MESHRUN_RANK_ORDER": ",".join(RANK_ORDER),
        "MESHRUN_CHECKPOINT_DIR": checkpoint_dir or "",
        # everything the trainer reads: the spec, the plan and this pod, as one typed value
        JOB_VARIABLE: write_document(JobDocument(spec=spec, plan=plan, pod=pod)),
    }
