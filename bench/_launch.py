"""Shared by the trainer benches: re-run the calling script under torchrun when not already."""

from __future__ import annotations

import os
import subprocess
import sys

from meshrun.localnet import free_port


def ensure_torchrun(nproc: int) -> None:
    """Unless already a torchrun worker, launch ``nproc`` workers and exit with their code."""
    if "LOCAL_RANK" in os.environ:
        return
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={nproc}",
        f"--master-port={free_port()}",
        sys.argv[0],
        *sys.argv[1:],
    ]
    sys.exit(subprocess.call(cmd, env=env))
