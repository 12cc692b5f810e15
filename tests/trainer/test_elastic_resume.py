"""An elastic job keeps its training exact across data-parallel resizes.

Three launches for all the jobs (DDP, ZeRO-1, ZeRO-3, DP x TP, PP x DP): the planned degree
(4 ranks) until a preemption just after the checkpoint of step 3, half the data-parallel degree
(2 ranks, twice the gradient accumulation, same TP/PP and global batch) from that checkpoint
until a preemption after step 6, then the planned degree again to the end. Each step's loss
must match the uninterrupted run's within the layouts' parity tolerance (fp32, 1e-4 relative,
as tests/trainer/test_resume_layouts.py): the same samples in each global batch, the same
learning-rate schedule (warmup, then cosine: a shifted step shows), the same AdamW moments and
step counts.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from elastic_check import GROW_AT, JOBS, SHRINK_AT, STEPS
from test_resume_layouts import RTOL
from trainer_launch import cpu_env, forked, run

pytestmark = pytest.mark.trainer


def _launch(world: int, phase: str, workdir: Path) -> dict[str, dict[str, object]]:
    script = str(Path(__file__).with_name("elastic_check.py"))
    proc = run(forked(world, script, phase, str(workdir)), cpu_env(), timeout=280)
    assert proc.returncode == 0, f"{phase}: {proc.stderr[-4000:]}"
    loaded: dict[str, dict[str, object]] = json.loads((workdir / f"{phase}.json").read_text())
    return loaded


@pytest.mark.timeout(900)
def test_shrink_then_grow_keeps_the_losses_of_the_uninterrupted_run(tmp_path: Path) -> None:
    start = _launch(4, "start", tmp_path)
    shrink = _launch(2, "shrink", tmp_path)
    grow = _launch(4, "grow", tmp_path)
    for name in JOBS:
        reference = start[name]["reference"]
        assert isinstance(reference, dict)
        want = dict(zip(reference["steps"], reference["losses"], strict=True))
        assert sorted(want) == list(range(1, STEPS + 1))
        assert max(want.values()) - min(want.values()) > 1e-3, "the reference must really train"
        phases = [("start", start[name], 0), ("shrink", shrink[name], SHRINK_AT)]
        phases.append(("grow", grow[name], GROW_AT))
        for phase, got, resumed_from in phases:
            assert got["resumedFrom"] == resumed_from, (name, phase, got)
            steps, losses = got["steps"], got["losses"]
            assert isinstance(steps, list) and isinstance(losses, list)
            assert steps[0] == resumed_from + 1, (name, phase, steps)
            wrong = {
                step: (loss, want[step])
                for step, loss in zip(steps, losses, strict=True)
                if abs(loss - want[step]) > RTOL * abs(want[step])
            }
            assert not wrong, f"{name} {phase} ({got['layout']}): {wrong}"
        planned, small = start[name]["layout"], shrink[name]["layout"]
        assert planned == grow[name]["layout"] and planned != small, (planned, small)
        # Half the replicas, the same global batch: twice the passes per optimizer step.
        passes = start[name]["gradAccumulation"]
        assert isinstance(passes, int)
        assert shrink[name]["gradAccumulation"] == 2 * passes, (name, shrink[name])
