"""Run a check script on N local ranks forked from one process that has imported it already.

Usage: forked_ranks.py --nproc-per-node=N SCRIPT [ARGS...]

Each rank gets torchrun's environment contract (RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT) and runs SCRIPT as ``__main__``, as
torchrun's workers do; the first rank to fail stops the others and its exit code is this
process's. What it saves is the start: the script's module-level imports (torch, the trainer)
run once, here, before the fork, instead of once in every rank and again in torchrun's agent
(3.2 s of CPU per rank and 1.8 s per agent on this machine). The tests of the launch itself
(the trainer's entrypoint, restarts, the pods) still go through torchrun.

Before the fork the parent also does what every rank would do for itself on first use: it
parses the CRD the job specs are validated against and imports the parts of torch the trainer
imports only where a layout needs them (ZeRO-1's optimizer, pipelining, checkpointing), about
0.3 s and up to 1 s of CPU per rank. Which imports a layout may make stays checked in fresh
processes (test_trainer_imports.py).

The parent has one thread when it forks (importing torch starts none; checked before the fork),
so no lock is copied held. Each rank dies with the parent (PR_SET_PDEATHSIG), so a test's
timeout, which kills this process, leaves no rank behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import os
import runpy
import signal
import sys
import time
import traceback
from pathlib import Path

from meshrun.api.crd import crd
from meshrun.localnet import free_port

PR_SET_PDEATHSIG = 1
LATER_IMPORTS = (
    "torch.distributed.checkpoint",
    "torch.distributed.optim",
    "torch.distributed.pipelining",
)
"""What the trainer imports only where a layout needs it."""
GRACE_S = 5.0


def _rank(rank: int, world: int, port: int, script: str, args: list[str]) -> int:
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world),
        GROUP_RANK="0",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    sys.argv = [script, *args]
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exit_:
        code = exit_.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def _warm() -> None:
    """What each rank would otherwise do for itself after the fork (see the module's docstring)."""
    for module in LATER_IMPORTS:
        importlib.import_module(module)
    crd()


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _stop(ranks: dict[int, int]) -> None:
    for pid in ranks:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while ranks and time.monotonic() < deadline:
        pid, _ = os.waitpid(-1, os.WNOHANG)
        if pid:
            ranks.pop(pid, None)
        else:
            time.sleep(0.05)
    for pid in ranks:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def main(argv: list[str]) -> int:
    if len(argv) < 2 or not argv[0].startswith("--nproc-per-node="):
        print(__doc__.splitlines()[2], file=sys.stderr)
        return 2
    world = int(argv[0].split("=", 1)[1])
    script, args = argv[1], argv[2:]
    sys.path.insert(0, str(Path(script).resolve().parent))  # as `python SCRIPT` would
    runpy.run_path(script, run_name="__preload__")  # its imports, not its main
    _warm()
    threads = _threads()
    if threads != 1:
        print(f"forked_ranks: {threads} threads before the fork, not 1", file=sys.stderr)
        return 2
    port = free_port()
    ranks: dict[int, int] = {}
    for rank in range(world):
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = _rank(rank, world, port, script, args)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        ranks[pid] = rank
    while ranks:
        pid, status = os.wait()
        rank = ranks.pop(pid)
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            print(f"forked_ranks: rank {rank} exited with {code}", file=sys.stderr)
            _stop(ranks)
            return code if code > 0 else 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
