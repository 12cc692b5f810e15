"""Distributed checkpoints with torch.distributed.checkpoint (DCP), visible only once complete.

Layout of a checkpoint root::

    step-00000010/          complete: DCP files + .metadata + rank-NNNNN.pt per rank
    step-00000012.tmp/      being written (or left by a crash): never read

Every rank writes into ``step-N.tmp``; after a barrier (all writes done) rank 0 renames it to
``step-N``. A rename within one directory is atomic on POSIX file systems, so a reader sees a
whole checkpoint or none. Model and optimizer state go through DCP for every layout and ZeRO
stage (meshrun_trainer.components.statedicts), so a checkpoint resumes under any other layout or
world size; loading is strict (a missing key is an error, never a silent fresh start). The per-rank
file holds the step, the world size, the RNG states and the training loop's other state; a
run with more ranks than the checkpoint reads rank 0's file for the ranks it lacks.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from meshrun_trainer.components import statedicts

if TYPE_CHECKING:
    from meshrun_trainer.runner import Runner

COMPLETE = re.compile(r"^step-(\d{8})$")


def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"step-{step:08d}"


def latest_complete(root: str | Path) -> tuple[int, Path] | None:
    """The newest complete checkpoint under ``root`` as (step, path), or None."""
    steps = complete_steps(root)
    return (steps[-1], step_dir(root, steps[-1])) if steps else None


def _rank_state(step: int, extra: dict[str, Any] | None) -> dict[str, Any]:
    state: dict[str, Any] = {
        "step": step,
        "world": dist.get_world_size(),
        "rng": torch.get_rng_state(),
        "extra": extra or {},
    }
    if torch.cuda.is_available():
        state["cuda_rng"] = torch.cuda.get_rng_state()
    return state


def _rank_file(directory: Path, rank: int | None = None) -> Path:
    return directory / f"rank-{dist.get_rank() if rank is None else rank:05d}.pt"


def _read_rank_file(directory: Path) -> dict[str, Any]:
    """This rank's file, or rank 0's when the checkpoint was written by fewer ranks."""
    path = _rank_file(directory)
    if not path.is_file():
        path = _rank_file(directory, 0)
    local: dict[str, Any] = torch.load(path, weights_only=True)
    return local


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

    ``extra``: this rank's other training state (the data stream's position, the learning-rate
    schedules, the validation history: the parts meshrun_trainer.loop.train puts together),
    plain Python values and tensors, read back with :func:`read_extra`.
    """
    final = step_dir(root, step)
    tmp = final.with_name(final.name + ".tmp")
    if dist.get_rank() == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    dcp_save(statedicts.merged(statedicts.part_states(runner)), checkpoint_id=str(tmp))
    torch.save(_rank_state(step, extra), _rank_file(tmp))
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
    states = statedicts.part_states(runner)
    loaded = statedicts.merged(states)
    statedicts.load(loaded, str(directory))  # strict: a missing key raises
    statedicts.apply(runner, states, loaded)
    local = _read_rank_file(directory)
    if int(local["step"]) != step:
        raise RuntimeError(f"{directory}: rank file holds step {local['step']}, expected {step}")
    if local.get("world") == dist.get_world_size():  # the same ranks: the same random streams
        torch.set_rng_state(local["rng"])
        if "cuda_rng" in local and torch.cuda.is_available():
            torch.cuda.set_rng_state(local["cuda_rng"])
    return step


def read_extra(root: str | Path, step: int) -> dict[str, Any]:
    """The ``extra`` state this rank saved with the checkpoint of ``step``."""
    local = _read_rank_file(step_dir(root, step))
    extra: dict[str, Any] = local.get("extra", {})
    return extra
