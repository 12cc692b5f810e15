"""Every strategy against the single-process reference: one launch per world size.

For the tiny preset the per-step losses of DDP, ZeRO-1/2/3, PP 2 with each schedule (alone, with
gradient accumulation, and x DP 2 with accumulation), PP 4, TP 2 (also with the
two-matrix GeLU MLP, against its own reference) and 4, DP 2 x TP 2, PP 2 x TP 2,
3D 2x2x2 (with and without accumulation), CP 4 and CP 2 x TP 2 match the plain run of the same
global batch: in fp32 within 1e-4 relative, and in bf16 with activation checkpointing within
BF16_RTOL of the plain bf16 run. The gradient norms (before clipping) are compared too: they
expose a wrong gradient average or a missing reduction on the first step. The layouts are
listed in layout_check.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from layout_check import runs
from trainer_launch import cpu_env, forked, run

pytestmark = pytest.mark.trainer

RTOL = {"fp32": (1e-4, 1e-4, 1e-4), "bf16": (5e-3, 1e-2, 1e-1)}
"""Relative tolerances per precision: (first step, losses, gradient norms).

fp32 runs agree to rounding. bf16 keeps 8 bits of mantissa and layouts round in different
places (FSDP2 computes with bf16 parameters, autocast casts fp32 ones per operation; row-parallel
layers sum bf16 partial products across ranks), so the first step, before any update, agrees to
a few 1e-4. Later steps drift further because AdamW's first updates move every weight by about
the learning rate whatever the size of its gradient, so a rounding difference in a near-zero
gradient becomes a full-size change: the losses of steps 2-3 stay within 1e-3 and the gradient
norms within a few 1e-2 (docs/trainer.md)."""


def _close(got: list[float], want: list[float], rtol: float) -> bool:
    return len(got) == len(want) and all(
        abs(g - w) <= rtol * abs(w) for g, w in zip(got, want, strict=True)
    )


def _matches(run: dict[str, Any]) -> bool:
    first, losses, norms = RTOL[run["precision"]]
    reference = run["reference"]
    return (
        _close(
            run["losses"][:1] + run["gradNorms"][:1],
            reference["losses"][:1] + reference["gradNorms"][:1],
            first,
        )
        and _close(run["losses"], reference["losses"], losses)
        and _close(run["gradNorms"], reference["gradNorms"], norms)
    )


@pytest.mark.timeout(600)
@pytest.mark.parametrize("world", [2, 4, 8])
def test_layouts_match_single_process(world: int, tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    script = str(Path(__file__).with_name("layout_check.py"))
    proc = run(forked(world, script, str(out)), cpu_env(), timeout=560)
    assert proc.returncode == 0, proc.stderr[-4000:]
    # A TP layout's gradient norm is reduced over its data-parallel and TP ranks at once (the
    # mesh flattens them), not in two all-reduces in a row, which torch warns of.
    sequential = [line for line in proc.stderr.splitlines() if "sequential all_reduce" in line]
    assert not sequential, sequential[:2]
    results = json.loads(out.read_text())
    assert set(results) == set(runs(world))
    fp32 = next(r["reference"] for r in results.values() if r["precision"] == "fp32")
    # The reference must really train, or equal losses would prove nothing.
    assert fp32["losses"][-1] < fp32["losses"][0] - 1e-3
    mismatched = {
        name: (r["losses"], r["gradNorms"], r["reference"])
        for name, r in results.items()
        if not _matches(r)
    }
    assert not mismatched, f"mismatched runs (losses, norms, reference): {mismatched}"
