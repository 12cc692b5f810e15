"""Environments for trainer processes on this machine, always built by the operator's contract.

``meshrun run --local`` gives each local "pod" exactly the environment the operator would
(``meshrun.envcontract.pod_env``) with 127.0.0.1 as the master address. Tests and benchmarks
that launch torchrun themselves take :func:`layout_env`: a one-pod job with the layout they
want, planned and checked by the planner like any other, never a hand-written environment (or
:func:`one_pod_env` for a one-pod job they planned themselves).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from meshrun.api.spec import CPU, JobSpec
from meshrun.envcontract import pod_env
from meshrun.files.checks import read_with_files
from meshrun.jobdoc import JOB_VARIABLE
from meshrun.localnet import free_port
from meshrun.planner.plan import Plan, plan_job


def visible_gpus() -> list[str]:
    """Physical ids of the GPUs this process may use (honours CUDA_VISIBLE_DEVICES)."""
    import torch

    count = torch.cuda.device_count()
    preset = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [i.strip() for i in preset.split(",") if i.strip()] if preset else []
    return ids[:count] if ids else [str(i) for i in range(count)]


def device_env(
    accelerator: str, world: int, per_pod: int, pod_index: int, gpus: list[str]
) -> tuple[dict[str, str], str | None]:
    """CUDA_VISIBLE_DEVICES for one local "pod": its own GPUs, or none (CPU) with a reason.

    Every pod's torchrun numbers its processes from LOCAL_RANK 0, so pods on one machine must
    see disjoint GPU sets or they would all use the first ones.
    """
    if accelerator == CPU:
        return {"CUDA_VISIBLE_DEVICES": ""}, None
    if len(gpus) < world:
        reason = f"{world} processes need {world} GPUs, {len(gpus)} visible: running on CPU"
        return {"CUDA_VISIBLE_DEVICES": ""}, reason
    mine = gpus[pod_index * per_pod : (pod_index + 1) * per_pod]
    return {"CUDA_VISIBLE_DEVICES": ",".join(mine)}, None


def local_envs(
    spec: JobSpec, plan: Plan, workdir: Path, checkpoint_dir: str | None = None
) -> tuple[list[dict[str, str]], str | None]:
    """Each local pod's environment, and why it runs on CPU when GPUs were wanted (or None).

    Pod 0 serves /metrics and /progress on a free port; every pod writes its termination
    message into ``workdir``.
    """
    master_port = free_port()
    gpus = visible_gpus() if spec.resources.accelerator != CPU else []
    envs, why_cpu = [], None
    per_pod = spec.resources.num_proc_per_node
    for index in range(spec.resources.num_nodes):
        devices, reason = device_env(
            spec.resources.accelerator, plan.world_size, per_pod, index, gpus
        )
        why_cpu = why_cpu or reason
        if reason:  # a GPU job run on this machine's CPUs: the trainer must not ask for CUDA
            spec = replace(spec, resources=replace(spec.resources, accelerator="cpu"))
            plan = replace(plan, accelerator=CPU)
        env = pod_env(
            plan,
            spec,
            job_name=plan.name,
            namespace="local",
            pod_index=index,
            master_addr="127.0.0.1",
            master_port=master_port,
            checkpoint_dir=checkpoint_dir,
            metrics_port=free_port() if index == 0 else 0,
            termination_log=str(workdir / f"pod-{index}-termination.json"),
        )
        env.update(devices)
        envs.append(env)
    return envs, why_cpu


def layout_env(
    model: Mapping[str, Any],
    training: Mapping[str, Any],
    *,
    dp: int = 1,
    pp: int = 1,
    tp: int = 1,
    cp: int = 1,
    zero_stage: int = 0,
    schedule: str = "1f1b",
    micro_batches: int = 1,
    virtual_stages: int = 1,
    grad_accumulation: int = 1,
    ep: int = 1,
    name: str = "local",
    checkpoint_dir: str | None = None,
) -> dict[str, str]:
    """The environment of every process of a one-pod job laid out as asked.

    ``training`` needs globalBatchSize; microBatchSize follows from the layout. The job goes
    through the planner (so its rules hold) and the env contract; the process serves no
    metrics and writes its summary nowhere. For torchrun launched with dp x cp x pp x tp
    processes.
    """
    batch = int(training["globalBatchSize"])
    per_rank = dp * micro_batches * grad_accumulation
    strategy: dict[str, Any] = {
        "type": "hybrid",
        "dataParallel": dp,
        "pipelineParallel": pp,
        "tensorParallel": tp,
        "contextParallel": cp,
        "zeroStage": zero_stage,
        "pipelineSchedule": schedule,
    }
    if pp > 1:
        strategy["microBatches"] = micro_batches
    if virtual_stages > 1:
        strategy["virtualStages"] = virtual_stages
    if ep > 1:
        strategy["expertParallel"] = ep
        strategy["expertTensorParallel"] = 1
    job = read_with_files(
        {
            "image": "local",
            "resources": {"numNodes": 1, "numProcPerNode": dp * cp * pp * tp, "accelerator": CPU},
            "strategy": strategy,
            "model": dict(model),
            "training": {**training, "microBatchSize": max(1, batch // per_rank)},
        }
    )
    return one_pod_env(plan_job(job, name), job, checkpoint_dir)


def one_pod_env(plan: Plan, spec: JobSpec, checkpoint_dir: str | None = None) -> dict[str, str]:
    """The environment of the one pod of the job ``spec`` planned as ``plan``, on this machine:
    the rendezvous on 127.0.0.1, no metrics served, the summary written nowhere."""
    return pod_env(
        plan,
        spec,
        job_name=plan.name,
        namespace="local",
        pod_index=0,
        master_addr="127.0.0.1",
        checkpoint_dir=checkpoint_dir,
        metrics_port=0,
        termination_log=os.devnull,
    )


def edit_document(env: Mapping[str, str], **parts: Mapping[str, Any]) -> dict[str, str]:
    """``env`` with its job document's ``spec``, ``plan`` or ``pod`` keys replaced (merged
    section by section), for tests and benchmarks that vary one pod's run."""
    document = json.loads(env[JOB_VARIABLE])
    for part, changes in parts.items():
        document[part] = _merged(document[part], changes)
    return {**env, JOB_VARIABLE: json.dumps(document)}


def _merged(base: Any, changes: Mapping[str, Any]) -> Any:
    merged = dict(base)
    for key, value in changes.items():
        nested = isinstance(value, Mapping) and isinstance(merged.get(key), Mapping)
        merged[key] = _merged(merged[key], value) if nested else value
    return merged
