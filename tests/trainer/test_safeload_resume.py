"""Real checkpoints of DDP, FSDP2 (ZeRO-3), TP and pipeline runs resume through the safe reader,
and every global their metadata names is one it allows; the same checkpoint with a ``.metadata``
that would run code is refused on every rank, naming the file and the global, and its payload
never runs (2 ranks, gloo)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from meshrun_trainer.components.safeload import allowed_global
from safeload_check import HALF, LAYOUTS, STEPS
from trainer_launch import cpu_env, forked, run

pytestmark = pytest.mark.trainer

RTOL = 1e-4


@pytest.mark.timeout(600)
def test_real_checkpoints_resume_through_the_safe_reader_and_a_crafted_one_is_refused(
    tmp_path: Path,
) -> None:
    script = str(Path(__file__).with_name("safeload_check.py"))
    proc = run(forked(2, script, str(tmp_path)), cpu_env(), timeout=500)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads((tmp_path / "results.json").read_text())
    reference = json.loads((tmp_path / "reference.json").read_text())
    assert set(results) == set(LAYOUTS)
    for name, result in results.items():
        named = result["globals"]
        assert "torch.distributed.checkpoint.metadata.Metadata" in named, name
        refused = [g for g in named if allowed_global(*g.rsplit(".", 1)) is None]
        assert not refused, f"{name}: a real checkpoint names {refused}"
        assert result["resumedFrom"] == HALF, name
        assert len(result["losses"]) == STEPS - HALF, name
        for got, want in zip(result["losses"], reference[HALF:], strict=True):
            assert abs(got - want) <= RTOL * abs(want), (name, result["losses"], reference)
        metadata = tmp_path / f"{name}-tampered" / f"step-{HALF:08d}" / ".metadata"
        refusal = (
            f"{metadata}: refused to load the global io.open: a checkpoint's metadata holds only "
            "torch.distributed.checkpoint's own classes, so this file was not written by DCP "
            "(whoever can write the checkpoint volume could run code on every rank with it); "
            "restore the checkpoint or delete it"
        )
        assert result["refused"] == [refusal, refusal], name
        assert not (tmp_path / f"{name}-ran").exists(), f"{name}: the payload ran"
