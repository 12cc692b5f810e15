"""Shared by the trainer benches: re-run the calling script under torchrun when not already."""

from __future__ import annotations

import os
import socket
import subprocess
import sys


def ensure_torchrun(nproc: int) -> None:
    """Unless already a torchrun worker, launch ``nproc`` workers and exit with their code."""
    if "LOCAL_RANK" in os.environ:
        return
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={nproc}",
        f"--master-port={port}",
        sys.argv[0],
        *sys.argv[1:],
    ]
    sys.exit(subprocess.call(cmd, env=env))


def layout_env(base: dict[str, str], **layout: str) -> dict[str, str]:
    """``base`` plus MESHRUN_<KEY>=value for each layout keyword."""
    return {**base, **{f"MESHRUN_{k.upper()}": v for k, v in layout.items()}}
