"""Helpers shared by the trainer tests: launching torchrun with a small, CPU-friendly env."""

from __future__ import annotations

import faulthandler
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp
from meshrun_trainer.distributed.mesh import leave

from meshrun.localnet import free_port

__all__ = ["REPO", "cpu_env", "forked", "free_port", "gloo_ranks", "run", "torchrun"]

REPO = Path(__file__).resolve().parents[2]


def cpu_env(**extra: str) -> dict[str, str]:
    """The current environment without meshrun's variables, with one OpenMP thread per process
    (the machine has 2 cores), plus ``extra`` (e.g. a ``layout_env``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MESHRUN_", "PET_"))}
    env.update({"OMP_NUM_THREADS": "1", **extra})
    return env


def torchrun(nproc: int, *args: str) -> list[str]:
    """Command line of a single-node torchrun with ``nproc`` workers."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={nproc}",
        f"--master-port={free_port()}",
        *args,
    ]


def forked(nproc: int, script: str | Path, *args: str) -> list[str]:
    """Command line running ``script`` on ``nproc`` ranks forked after its imports
    (tests/trainer/forked_ranks.py): torchrun's environment for the script, without a
    torchrun agent and an import of torch in every rank. For the checks that run many layouts
    in one launch; the tests of the launch itself use :func:`torchrun`."""
    return [
        sys.executable,
        str(Path(__file__).with_name("forked_ranks.py")),
        f"--nproc-per-node={nproc}",
        str(script),
        *args,
    ]


def run(cmd: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False
    )


def gloo_ranks(body: Callable[[int, dict[str, Any]], None], world: int) -> dict[str, Any]:
    """Run ``body(rank, results)`` in ``world`` spawned processes joined in one gloo group;
    what the ranks put in ``results`` comes back. ``body`` must be a module-level function."""
    port = free_port()
    with mp.Manager() as manager:
        results = manager.dict()
        torn_down = manager.Barrier(world)
        mp.spawn(_gloo_rank, args=(body, world, port, results, torn_down), nprocs=world, join=True)
        return dict(results)


def _gloo_rank(
    rank: int,
    body: Callable[[int, dict[str, Any]], None],
    world: int,
    port: int,
    results: dict[str, Any],
    torn_down: Any,
) -> None:
    # A rank that aborts inside torch's C++ (gloo) prints where its Python threads were.
    faulthandler.enable(all_threads=True)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        body(rank, results)
        # Every rank done with its collectives before any tears its groups down: a rank that
        # exits while its peer's gloo threads still talk to it aborted that peer ("terminate
        # called without an active exception") once in a loaded run.
        dist.barrier()
    finally:
        dist.destroy_process_group()
    # Rank 0 hosts the rendezvous store: no rank leaves until every rank has torn its group
    # down, and then none runs the interpreter's teardown (see ``leave``). The results are
    # already with the manager.
    torn_down.wait(timeout=120)
    leave(0)
