"""Context parallelism trains as one process does: two launches (2 ranks, then 4).

The tiny model with grouped-query attention under cp 2 (alone, with gradient accumulation, with
selective activation checkpointing, which recomputes the keys' and values' gather in backward,
and under ZeRO-1), cp 4, dp 2 x cp 2 under ZeRO-3, cp 2 x tp 2 and pp 2 x cp 2:
- after step 1's backward, the gradient every rank holds (its FSDP2 or tensor-parallel shard,
  its pipeline stage's parameters) equals that piece of the single-process gradient within
  1e-5 of the parameter's largest gradient;
- the losses of 3 steps equal the single-process run's within 1e-5 relative (fp32);
- checkpoints resume across cp: cp 2 (ZeRO-1) at cp 4, cp 2 in a single process (cp 1), cp 1
  (dp 2) at dp 2 x cp 2 under ZeRO-3, cp 4 at cp 2 x tp 2, each continuing with the
  uninterrupted run's losses of steps 4-5 within 1e-5 relative.
The layouts are listed in cp_check.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cp_check import LAYOUTS, RESUMED, RESUMES, STEPS
from trainer_launch import cpu_env, forked, run

pytestmark = pytest.mark.trainer

RTOL = 1e-5


def _off(got: list[float], want: list[float]) -> float:
    assert len(got) == len(want), (got, want)
    return max(abs(g - w) / abs(w) for g, w in zip(got, want, strict=True))


@pytest.mark.timeout(400)
def test_context_parallel_matches_single_process(tmp_path: Path) -> None:
    script = str(Path(__file__).with_name("cp_check.py"))
    results: dict[int, dict[str, Any]] = {}
    for world in (2, 4):
        proc = run(forked(world, script, str(tmp_path)), cpu_env(), timeout=180)
        assert proc.returncode == 0, f"{world} ranks: {proc.stderr[-4000:]}"
        results[world] = json.loads((tmp_path / f"cp-{world}.json").read_text())
    reference = results[4]["reference"]["losses"]
    assert results[2]["reference"]["losses"] == reference
    assert len(reference) == RESUMED
    assert reference[STEPS - 1] < reference[0] - 1e-3, "the reference must really train"
    runs = {**results[2]["runs"], **results[4]["runs"]}
    assert set(runs) == {name for layouts in LAYOUTS.values() for name in layouts}
    gaps = {
        name: {"gradients": r["gradError"], "losses": _off(r["losses"], reference[:STEPS])}
        for name, r in runs.items()
    }
    resumed = results[4]["resumed"]
    assert set(resumed) == {f"{s}->{t}" for s, t in RESUMES} | {"cp2->single-process"}
    for pair, r in resumed.items():
        assert r["resumedFrom"] == STEPS, (pair, r)
        gaps[pair] = {"losses": _off(r["losses"], reference[STEPS:])}
    print(json.dumps(gaps, indent=1))
    wrong = {name: gap for name, gap in gaps.items() if max(gap.values()) > RTOL}
    assert not wrong, f"reference {reference}; off by more than {RTOL}: {wrong}"
