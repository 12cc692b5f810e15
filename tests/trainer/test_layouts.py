"""Every strategy against the single-process reference: one torchrun launch per world size.

Issue 4: for the tiny preset in fp32 the per-step losses of DDP, ZeRO-1/2/3, PP 2 with each
schedule (alone and x DP 2), PP 4, TP 2 and 4, DP 2 x TP 2, PP 2 x TP 2 and 3D 2x2x2 match the
plain run of the same global batch within 1e-4 relative. The gradient norms (before clipping) are
compared too: they expose a wrong gradient average or a missing reduction on the first step.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from trainer_launch import cpu_env, run, torchrun

pytestmark = pytest.mark.trainer

RTOL = 1e-4
EXPECTED = {
    2: {"tp2", "pp2-gpipe", "pp2-1f1b", "pp2-interleaved-1f1b"},
    4: {
        "ddp4",
        "zero1-dp4",
        "zero2-dp4",
        "zero3-dp4",
        "pp2-gpipe-dp2",
        "pp2-1f1b-dp2",
        "pp2-interleaved-1f1b-dp2",
        "pp4-1f1b",
        "tp4",
        "dp2-tp2",
        "dp2-tp2-zero2",
        "pp2-tp2",
    },
    8: {"3d-pp2-dp2-tp2", "3d-pp2-zero3-tp2-interleaved"},
}


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
    assert set(results) == EXPECTED[world]
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
