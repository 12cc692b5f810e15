"""Real checkpoints through the safe reader: one launch of 2 ranks.

Usage (under torchrun): safeload_check.py WORKDIR
For each layout of LAYOUTS: train HALF steps (a checkpoint at the end), record the globals its
``.metadata`` names, resume it to STEPS, then resume a copy whose ``.metadata`` was replaced by
one that would create WORKDIR/<name>-ran when unpickled. Results go to WORKDIR/results.json:
{name: {"globals", "resumedFrom", "losses", "refused"}}; rank 0 also writes the
single-process reference losses to WORKDIR/reference.json.
Launched by test_safeload_resume.py; not a test module itself.
"""

from __future__ import annotations

import builtins
import json
import pickle
import shutil
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from meshrun_trainer.components.safeload import UnsafeCheckpoint
from meshrun_trainer.distributed.mesh import init_distributed, pick_device
from resume_check import PIPELINE, _single_process, _train

HALF, STEPS = 2, 4
LAYOUTS: dict[str, dict[str, Any]] = {
    "ddp2": {"dp": 2},
    "fsdp2-zero3": {"dp": 2, "zero_stage": 3},
    "tp2": {"tp": 2},
    "pp2": {"pp": 2, **PIPELINE},
}


class Recorder(pickle.Unpickler):
    """A plain unpickler that notes every global the file names (the checkpoint is trusted
    here: it was just written by this run)."""

    def __init__(self, file: Any) -> None:
        super().__init__(file)
        self.named: set[str] = set()

    def find_class(self, module: str, name: str) -> Any:
        self.named.add(f"{module}.{name}")
        return super().find_class(module, name)


class Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return builtins.open, (str(self.marker), "w")


def _named_globals(metadata: Path) -> list[str]:
    with metadata.open("rb") as handle:
        recorder = Recorder(handle)
        recorder.load()
    return sorted(recorder.named)


def main(workdir: Path) -> None:
    init_distributed(pick_device())
    rank = dist.get_rank()
    results: dict[str, Any] = {}
    for name, layout in LAYOUTS.items():
        saved = workdir / name
        _train(layout, HALF, saved)
        metadata = saved / f"step-{HALF:08d}" / ".metadata"
        entry: dict[str, Any] = {"globals": _named_globals(metadata)}
        tampered = workdir / f"{name}-tampered"
        if rank == 0:
            shutil.copytree(saved, tampered)
            real = pickle.loads(metadata.read_bytes())
            real.storage_meta = Payload(workdir / f"{name}-ran")
            (tampered / f"step-{HALF:08d}" / ".metadata").write_bytes(pickle.dumps(real))
        dist.barrier()
        entry |= _train(layout, STEPS, saved)
        try:
            _train(layout, STEPS, tampered)
            entry["refused"] = None
        except UnsafeCheckpoint as error:
            entry["refused"] = str(error)
        dist.barrier()
        results[name] = entry
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, {n: r["refused"] for n, r in results.items()})
    if rank == 0:
        for name, entry in results.items():
            entry["refused"] = [ranks[name] for ranks in gathered]  # every rank's verdict
        (workdir / "results.json").write_text(json.dumps(results, indent=1))
        (workdir / "reference.json").write_text(json.dumps(_single_process(None, 1, STEPS)))
    dist.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(Path(sys.argv[1]))
