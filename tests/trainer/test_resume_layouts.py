"""A checkpoint written under one layout resumes under another (DCP resharding).

Two launches: 2 ranks save under DDP, TP and PP; 4 ranks resume those under ZeRO-3, PP x DP
(interleaved) and DP x TP, save under ZeRO-1, ZeRO-3 and PP x ZeRO-2 and resume those under
PP x TP, ZeRO-1 and DDP, and one 4-rank checkpoint resumes in a single process. Every resumed
run must continue from step 3 with the losses of the uninterrupted single-process run (fp32,
1e-4 relative): a lost or misplaced piece of model or optimizer state (AdamW's moments, its
step count) changes them at once.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from resume_check import HALF, PAIRS, STEPS
from trainer_launch import cpu_env, forked, run

pytestmark = pytest.mark.trainer

RTOL = 1e-4


@pytest.mark.timeout(600)
def test_checkpoints_resume_under_other_layouts(tmp_path: Path) -> None:
    script = str(Path(__file__).with_name("resume_check.py"))
    for world, phase in ((2, "save"), (4, "resume")):
        proc = run(forked(world, script, phase, str(tmp_path)), cpu_env(), timeout=280)
        assert proc.returncode == 0, f"{phase}: {proc.stderr[-4000:]}"
    reference = json.loads((tmp_path / "reference.json").read_text())
    assert max(reference) - min(reference) > 1e-3, "the reference must really train"
    results = json.loads((tmp_path / "resumed.json").read_text())
    expected = {f"{saved}->{target}" for saved, target in PAIRS}
    assert set(results) == expected | {"zero3-dp4->single-process"}
    wrong = {
        pair: result
        for pair, result in results.items()
        if result["resumedFrom"] != HALF
        or len(result["losses"]) != STEPS - HALF
        or any(
            abs(got - want) > RTOL * abs(want)
            for got, want in zip(result["losses"], reference[HALF:], strict=True)
        )
    }
    assert not wrong, f"reference steps {HALF + 1}-{STEPS}: {reference[HALF:]}; wrong: {wrong}"
