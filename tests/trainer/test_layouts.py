"""Every strategy against the single-process reference: one torchrun launch per world size.

For the tiny preset in fp32 the per-step losses of DDP, ZeRO-1/2/3, PP 2 with each schedule
(alone, with gradient accumulation, and x DP 2 with accumulation), PP 4, TP 2 and 4, DP 2 x TP 2,
PP 2 x TP 2 and 3D 2x2x2 (with and without accumulation) match the plain run of the same global
batch within 1e-4 relative. The gradient norms (before clipping) are compared too: they expose a
wrong gradient average or a missing reduction on the first step. The layouts are listed in
layout_check.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from layout_check import LAYOUTS
from trainer_launch import cpu_env, run, torchrun

pytestmark = pytest.mark.trainer

RTOL = 1e-4


def _close(got: list[float], want: list[float]) -> bool:
    return len(got) == len(want) and all(
        abs(g - w) <= RTOL * abs(w) for g, w in zip(got, want, strict=True)
    )


@pytest.mark.timeout(600)
@pytest.mark.parametrize("world", [2, 4, 8])
def test_layouts_match_single_process(world: int, tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    script = str(Path(__file__).with_name("layout_check.py"))
    proc = run(torchrun(world, script, str(out)), cpu_env(), timeout=560)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads(out.read_text())
    assert set(results) == set(LAYOUTS[world])
    reference = next(iter(results.values()))["reference"]
    # The reference must really train, or equal losses would prove nothing.
    assert reference["losses"][-1] < reference["losses"][0] - 1e-3
    mismatched = {
        name: (r["losses"], r["gradNorms"])
        for name, r in results.items()
        if not _close(r["losses"], reference["losses"])
        or not _close(r["gradNorms"], reference["gradNorms"])
    }
    assert not mismatched, f"reference {reference}, mismatched layouts {mismatched}"
