"""Distributed checkpoints with torch.distributed.checkpoint (DCP), visible only once complete.

Layout of a checkpoint root::

    step-00000010/          complete: DCP files + .metadata + rank-NNNNN.pt per rank
    step-00000012.tmp/      being written (or left by a crash): never read

Every rank writes into ``step-N.tmp``; after a barrier (all writes done) rank 0 renames it to
``step-N``. A rename within one directory is atomic on POSIX file systems, so a reader sees a
whole checkpoint or none. Model and optimizer go through DCP (sharded, layout-aware state dicts
for DDP, FSDP2, DTensor TP and pipeline stages); the per-rank file holds what DCP cannot
de-duplicate: the step, the RNG states and, under ZeRO-1, this rank's optimizer shard.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.distributed.optim import ZeroRedundancyOptimizer

if TYPE_CHECKING:
    from meshrun_trainer.train import Runner

COMPLETE = re.compile(r"^step-(\d{8})$")
FLAT = StateDictOptions(flatten_optimizer_state_dict=True)


def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"step-{step:08d}"


def latest_complete(root: str | Path) -> tuple[int, Path] | None:
    """The newest complete checkpoint under ``root`` as (step, path), or None."""
    steps = complete_steps(root)
    return (steps[-1], step_dir(root, steps[-1])) if steps else None


def _sharded_zero1(runner: Runner) -> bool:
    return any(isinstance(opt, ZeroRedundancyOptimizer) for opt in runner.optimizers)


def _app_state(runner: Runner) -> dict[str, Any]:
    model: dict[str, Any] = {}
    for part in runner.parts:
        model.update(get_model_state_dict(part))
    state: dict[str, Any] = {"model": model}
    if not _sharded_zero1(runner):
        optim: dict[str, Any] = {}
        for part, opt in zip(runner.parts, runner.optimizers, strict=True):
            optim.update(get_optimizer_state_dict(part, opt, options=FLAT))
        state["optim"] = optim
    return state


def _rank_state(runner: Runner, step: int, extra: dict[str, Any] | None) -> dict[str, Any]:
    state: dict[str, Any] = {"step": step, "rng": torch.get_rng_state(), "extra": extra or {}}
    if torch.cuda.is_available():
        state["cuda_rng"] = torch.cuda.get_rng_state()
    if _sharded_zero1(runner):
        state["zero1"] = [opt.optim.state_dict() for opt in runner.optimizers]  # type: ignore[attr-defined]
    return state


def _rank_file(directory: Path) -> Path:
    return directory / f"rank-{dist.get_rank():05d}.pt"


def complete_steps(root: str | Path) -> list[int]:
    """Steps of the complete checkpoints under ``root``, oldest first."""
    path = Path(root)
    if not path.is_dir():
        return []
    steps = []
    for entry in path.iterdir():
        match = COMPLETE.match(entry.name)
        if match and (entry / ".metadata").is_file():
            steps.append(int(match.group(1)))
    return sorted(steps)


def prune(root: str | Path, keep: int) -> list[int]:
    """Delete all but the newest ``keep`` complete checkpoints (0 keeps all); return the deleted."""
    steps = complete_steps(root)
    doomed = steps[:-keep] if keep else []
    for step in doomed:
        shutil.rmtree(step_dir(root, step), ignore_errors=True)
    return doomed


def save(
    root: str | Path, step: int, runner: Runner, keep: int = 0, extra: dict[str, Any] | None = None
) -> Path:
    """Write the checkpoint of ``step``; collective, every rank calls it.

    ``extra``: this rank's other training state (data position, learning-rate schedule,
    validation history: meshrun_trainer.userhooks), plain Python values and tensors, read back
    with :func:`read_extra`.
    """
    final = step_dir(root, step)
    tmp = final.with_name(final.name + ".tmp")
    if dist.get_rank() == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    dcp_save(_app_state(runner), checkpoint_id=str(tmp))
    torch.save(_rank_state(runner, step, extra), _rank_file(tmp))
    dist.barrier()  # every rank's files are written before the checkpoint becomes visible
    if dist.get_rank() == 0:
        shutil.rmtree(final, ignore_errors=True)
        os.rename(tmp, final)
        fd = os.open(final.parent, os.O_RDONLY)
        try:
            os.fsync(fd)  # make the rename durable before anyone relies on it
        finally:
            os.close(fd)
        prune(root, keep)  # only after the new one is visible
    dist.barrier()
    return final


def restore_latest(root: str | Path, runner: Runner) -> int:
    """Load the newest complete checkpoint into ``runner``; return its step (0 if none)."""
    found = latest_complete(root)
    # Rank 0's view decides, so all ranks load the same step even on a slow shared file system.
    chosen = [found[0] if found else 0]
    dist.broadcast_object_list(chosen, src=0)
    step = int(chosen[0])
    if step == 0:
        return 0
    directory = step_dir(root, step)
    state = _app_state(runner)
    dcp_load(state, checkpoint_id=str(directory))
    for part in runner.parts:
        set_model_state_dict(part, state["model"], options=StateDictOptions(strict=False))
    if "optim" in state:
        for part, opt in zip(runner.parts, runner.optimizers, strict=True):
            set_optimizer_state_dict(part, opt, state["optim"], options=FLAT)
    local = torch.load(_rank_file(directory), weights_only=True)
    if int(local["step"]) != step:
        raise RuntimeError(f"{directory}: rank file holds step {local['step']}, expected {step}")
    torch.set_rng_state(local["rng"])
    if "cuda_rng" in local and torch.cuda.is_available():
        torch.cuda.set_rng_state(local["cuda_rng"])
    for opt, shard in zip(runner.optimizers, local.get("zero1", []), strict=False):
        opt.optim.load_state_dict(shard)  # type: ignore[attr-defined]
    return step


def read_extra(root: str | Path, step: int) -> dict[str, Any]:
    """The ``extra`` state this rank saved with the checkpoint of ``step``."""
    local = torch.load(_rank_file(step_dir(root, step)), weights_only=True)
    extra: dict[str, Any] = local.get("extra", {})
    return extra
