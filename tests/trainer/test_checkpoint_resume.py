"""Kill one rank mid-run with SIGKILL, relaunch, and finish with the same loss bit for bit.

Each run is one "pod": torchrun with the exact environment meshrun.envcontract.pod_env gives it.
Checkpoints land every 3 steps; the relaunch must resume from the newest complete one (a
half-written ``.tmp`` directory is never read) and reproduce the uninterrupted run's losses
exactly (CPU, fp32: same data order, model, optimizer and RNG state).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from references import kept_run
from trainer_launch import cpu_env, free_port

from meshrun.api.read import read_spec
from meshrun.envcontract import TRAINER_COMMAND, pod_env
from meshrun.planner.plan import plan_job

pytestmark = pytest.mark.trainer

STEPS, EVERY, KILL_AFTER = 24, 3, 7
STRATEGIES = {
    "zero3": {"type": "zero", "zeroStage": 3},
    "zero1": {"type": "zero", "zeroStage": 1},
    "pipeline": {"type": "pipeline", "pipelineParallel": 2, "microBatches": 4},
    # two model chunks per rank: checkpoint state merges and splits per chunk
    "interleaved": {
        "type": "pipeline",
        "pipelineParallel": 2,
        "microBatches": 4,
        "pipelineSchedule": "interleaved-1f1b",
        "virtualStages": 2,
    },
}


def _spec(strategy: dict[str, Any]) -> dict[str, Any]:
    return {
        "image": "meshrun/trainer:test",
        "resources": {"numNodes": 1, "numProcPerNode": 2, "accelerator": "cpu"},
        "strategy": strategy,
        "model": {"preset": "tiny"},
        "training": {
            "steps": STEPS,
            "globalBatchSize": 8,
            "precision": "fp32",
            "learningRate": 0.01,
            "checkpoint": {"everySteps": EVERY},
        },
    }


def _env(strategy: dict[str, Any], checkpoint_dir: Path) -> dict[str, str]:
    spec = read_spec(_spec(strategy))
    plan = plan_job(spec, "resume")
    env = pod_env(
        plan,
        spec,
        job_name="resume",
        namespace="test",
        pod_index=0,
        master_addr="127.0.0.1",
        master_port=free_port(),
        checkpoint_dir=str(checkpoint_dir),
        metrics_port=0,
        termination_log=str(checkpoint_dir.parent / "termination.json"),
    )
    return cpu_env(**env)


def _start(env: dict[str, str]) -> subprocess.Popen[str]:
    cmd = [sys.executable, *TRAINER_COMMAND[1:]]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _events(proc: subprocess.Popen[str], timeout: float = 300) -> list[dict[str, Any]]:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    return [json.loads(line) for line in out.splitlines() if line.startswith('{"event"')]


def _children(pid: int) -> list[int]:
    """Processes whose parent is ``pid`` (torchrun's workers), from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            # field 4 of /proc/PID/stat is the parent pid; the command name may hold spaces
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return sorted(found)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_kill_one_rank_then_resume_is_bit_exact(strategy: str, tmp_path: Path) -> None:
    layout = STRATEGIES[strategy]

    def uninterrupted() -> dict[str, Any]:
        straight = _events(_start(_env(layout, tmp_path / "straight")))
        return {"losses": [[e["step"], e["loss"]] for e in straight if e["event"] == "step"]}

    # The same job run without interruption, once per code (tests/references.py).
    sources = [
        Path(__file__).read_text(),
        (Path(__file__).parent / "trainer_launch.py").read_text(),
    ]
    straight = kept_run("resume-straight", {"spec": _spec(layout), "tests": sources}, uninterrupted)
    straight_losses = dict(straight["losses"])
    assert sorted(straight_losses) == list(range(1, STEPS + 1))

    crashed_dir = tmp_path / "crashed"
    proc = _start(_env(layout, crashed_dir))
    assert proc.stdout is not None
    deadline = time.monotonic() + 300
    for line in proc.stdout:
        if line.startswith('{"event": "step"') and json.loads(line)["step"] >= KILL_AFTER:
            break
        assert time.monotonic() < deadline, "no step progress from the first run"
    workers = _children(proc.pid)
    assert len(workers) == 2, f"expected 2 workers under torchrun, found {workers}"
    os.kill(workers[1], signal.SIGKILL)  # rank 1 dies mid-run, without any cleanup
    proc.communicate(timeout=120)
    assert proc.returncode != 0, "torchrun must report the killed worker"
    # the step folders only (the run's TensorBoard events are written beside them)
    done = sorted(
        p.name
        for p in crashed_dir.iterdir()
        if p.name.startswith("step-") and not p.name.endswith(".tmp")
    )
    assert done and done[-1] < f"step-{STEPS:08d}", f"the run was not cut short: {done}"

    # Leftovers that must never be read: a half-written directory from a crash and a complete-
    # looking directory without DCP's .metadata (written last by the coordinator).
    (crashed_dir / f"step-{STEPS - 1:08d}.tmp").mkdir()
    (crashed_dir / f"step-{STEPS - 2:08d}").mkdir()
    resumed = _events(_start(_env(layout, crashed_dir)))
    summary = next(e for e in resumed if e["event"] == "summary")
    first = summary["resumedFromStep"]
    assert KILL_AFTER - EVERY <= first < STEPS and first % EVERY == 0
    losses = {e["step"]: e["loss"] for e in resumed if e["event"] == "step"}
    assert sorted(losses) == list(range(first + 1, STEPS + 1))
    # Bit-exact: equality of floats, not closeness.
    assert {s: straight_losses[s] for s in losses} == losses
    assert summary["finalLoss"] == straight_losses[STEPS]
