"""The pod entrypoint: ``python -m torch.distributed.run -m meshrun_trainer`` (torchrun)."""

from __future__ import annotations

import os
import sys
from typing import Any

import torch.distributed as dist

from meshrun.api.errors import SpecError
from meshrun.api.read import write_section
from meshrun.envcontract import (
    EXIT_CHECKPOINT_REFUSED,
    EXIT_CONFIG_ERROR,
    EXIT_LOSS_NOT_FINITE,
    EXIT_NO_ACCELERATOR,
    PERMANENT_REASONS,
)
from meshrun.jobdoc import JOB_VARIABLE, JobDocument, termination_log_of
from meshrun_trainer.components.progress import TERMINATION_MESSAGE_LIMIT, Reporter, finite_json
from meshrun_trainer.components.safeload import UnsafeCheckpoint
from meshrun_trainer.components.statedicts import CheckpointMismatch
from meshrun_trainer.config.files import open_files, with_model
from meshrun_trainer.config.read import read_job
from meshrun_trainer.distributed.mesh import (
    NoAcceleratorError,
    build_mesh,
    init_distributed,
    pick_device,
)
from meshrun_trainer.distributed.parallel import data_parallel_kind
from meshrun_trainer.loop.train import LossNotFinite, peak_memory, train
from meshrun_trainer.runner import TrainResult


def summarize(job: JobDocument, result: TrainResult, peaks: list[int]) -> dict[str, Any]:
    records = result.records
    timed = records[1:] or records  # the first step pays one-off warm-up costs
    tokens = job.spec.tokens_per_step
    tokens_per_s = tokens * len(timed) / sum(r.step_time_s for r in timed) if timed else 0.0
    layout: dict[str, Any] = write_section(job.plan.layout)  # as the plan writes it
    layout["stageLayers"] = [list(layers) for layers in job.plan.stage_layers]
    layout["dataParallel"] = data_parallel_kind(job.plan.layout).value
    return {
        "status": "Succeeded",
        "steps": job.spec.training.steps,
        "resumedFromStep": result.resumed_from,
        "finalLoss": records[-1].loss if records else None,
        "eval": result.evals,
        "losses": [r.loss for r in records],
        "tokensPerSecond": tokens_per_s,
        "peakMemoryBytes": peaks,
        "peakMemoryKind": peak_memory()[1],
        "layout": layout,
    }


def write_failure(path: str | None, error: BaseException, exit_code: int | None = None) -> None:
    """Put the error in the pod's termination message, so the operator can show why it failed;
    ``exit_code`` one of meshrun.envcontract.PERMANENT_REASONS marks it permanent (torchrun
    exits 1 whatever its worker's code, so the message carries the classification)."""
    if not path:
        return
    message: dict[str, Any] = {
        "status": "Failed",
        "rank": dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", "0")),
        "error": f"{type(error).__name__}: {error}"[: TERMINATION_MESSAGE_LIMIT - 200],
    }
    if exit_code in PERMANENT_REASONS:
        message |= {"reason": PERMANENT_REASONS[exit_code], "permanent": True}
    if isinstance(error, LossNotFinite):
        message |= {"step": error.step, "loss": str(error.loss)}
    try:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(finite_json(message))
    except OSError:
        pass  # the original error matters more; torchrun reports it with the traceback


def _refuse(path: str | None, error: BaseException, exit_code: int, what: str) -> int:
    write_failure(path, error, exit_code)
    print(f"meshrun-trainer: {what}: {error}", file=sys.stderr)
    return exit_code


def main() -> int:
    try:
        job = read_job()
        hf = open_files(job)
        job = with_model(job, hf)
    except SpecError as error:
        log = termination_log_of(os.environ.get(JOB_VARIABLE, ""))
        return _refuse(log, error, EXIT_CONFIG_ERROR, "invalid configuration")
    log = job.pod.termination_log
    if job.spec.training.checkpoint.every_steps and not job.pod.checkpoint_dir:
        print(
            "meshrun-trainer: spec.training.checkpoint.everySteps is set but the pod has no "
            "checkpoint directory (spec.training.checkpoint.volume); not checkpointing",
            file=sys.stderr,
        )
    try:
        device = pick_device(job.spec.resources.accelerator)
    except NoAcceleratorError as error:
        return _refuse(log, error, EXIT_NO_ACCELERATOR, "no usable accelerator")
    init_distributed(device)
    mesh = build_mesh(job.plan.layout, device)
    reporter = Reporter(job) if dist.get_rank() == 0 else None
    try:
        result = train(
            job,
            mesh,
            on_step=reporter.on_step if reporter else None,
            hf=hf,
            on_eval=reporter.on_eval if reporter else None,
        )
    except SpecError as error:  # found once the data is read: a restart cannot fix it
        return _refuse(log, error, EXIT_CONFIG_ERROR, "invalid configuration")
    except LossNotFinite as error:  # every rank sees the same loss, so every rank stops here
        return _refuse(log, error, EXIT_LOSS_NOT_FINITE, "stopped")
    except (CheckpointMismatch, UnsafeCheckpoint) as error:  # DCP's load fails on every rank
        return _refuse(log, error, EXIT_CHECKPOINT_REFUSED, "cannot resume")
    except Exception as error:
        write_failure(log, error)
        raise
    finally:
        if reporter is not None:
            reporter.close_events()
    peaks: list[int] = [0] * dist.get_world_size()
    dist.all_gather_object(peaks, peak_memory()[0])
    if reporter is not None:
        reporter.finish(summarize(job, result, peaks))
    dist.barrier()
    dist.destroy_process_group()
    return 0
