"""How the trainer runs, checked in one 4-rank launch (facts measured by features_check.py).

- Meta-device build: under ZeRO-3 each of 4 ranks holds exactly a quarter of the parameters
  (DP 2 x TP 2: half), and the gathered values equal the single-process model's.
- bf16: parameters and gradients stay fp32 (master weights), the residual stream and what a
  pipeline stage sends are bf16, under FSDP2, DDP and PP x FSDP2.
- Accumulation: replicated gradients are not all-reduced before the last micro-step (DDP, HSDP,
  PP x HSDP); sharded ones (ZeRO-3) are reduce-scattered every micro-step; under pipelining a
  stage's parameters stay gathered until the optimizer step's last schedule run.
- Loss parallel: under TP the logits stay sharded over the vocabulary.
- Units: ZeRO-3 gathers a block whole, or (past the size that splits it) each matrix alone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from trainer_launch import cpu_env, forked, run

from meshrun.api.presets import PRESETS

pytestmark = pytest.mark.trainer

FP32, BF16 = "torch.float32", "torch.bfloat16"


@pytest.fixture(scope="module")
def facts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("features") / "facts.json"
    script = str(Path(__file__).with_name("features_check.py"))
    proc = run(forked(4, script, str(out)), cpu_env(), timeout=400)
    assert proc.returncode == 0, proc.stderr[-4000:]
    found: dict[str, Any] = json.loads(out.read_text())
    return found


@pytest.mark.timeout(450)
def test_each_rank_materializes_only_its_share(facts: dict[str, Any]) -> None:
    zero3, hybrid = facts["init/zero3-dp4"], facts["init/dp2-tp2"]
    assert zero3["shares"] == [zero3["total"] // 4] * 4 and zero3["equal"]
    # TP 2 splits every matrix; the norm weights (2 per layer and the final one) stay whole.
    tiny = PRESETS["tiny"]
    norms = (2 * tiny.layers + 1) * tiny.hidden
    assert hybrid["shares"] == [(hybrid["total"] - norms) // 2 + norms] * 4 and hybrid["equal"]


@pytest.mark.timeout(450)
@pytest.mark.parametrize("layout", ["zero3-dp4", "ddp4", "pp2-dp2"])
def test_bf16_keeps_fp32_master_weights_and_a_bf16_residual(
    facts: dict[str, Any], layout: str
) -> None:
    found = facts[f"dtypes/{layout}"]
    assert found["params"] == [FP32] and found["grads"] == [FP32]
    assert found["residual"] == BF16 and found["output"] == BF16


@pytest.mark.timeout(450)
def test_accumulation_syncs_only_what_it_must(facts: dict[str, Any]) -> None:
    ddp, hsdp, zero3 = facts["sync/ddp4"], facts["sync/dp2-tp2"], facts["sync/zero3-dp4"]
    assert not ddp["first"]["same_on_replicas"] and ddp["last"]["same_on_replicas"]
    assert not hsdp["first"]["sharded_grads"] and hsdp["last"]["sharded_grads"]
    assert zero3["first"]["sharded_grads"] and not zero3["first"]["gathered"]
    pipe, pipe3 = facts["sync/pp2-dp2"], facts["sync/pp2-dp2-zero3"]
    assert pipe["first"]["gathered"] and not pipe["first"]["same_on_replicas"]
    assert pipe3["first"]["gathered"] and pipe3["first"]["sharded_grads"]
    for last in (pipe["last"], pipe3["last"]):
        assert not last["gathered"] and last["sharded_grads"]


@pytest.mark.timeout(450)
def test_tensor_parallel_logits_stay_vocabulary_sharded(facts: dict[str, Any]) -> None:
    assert facts["loss-parallel"]["placements"] == ["S(2)"]
    assert facts["loss-parallel"]["shape"][-1] == 256 // 2


@pytest.mark.timeout(450)
def test_zero3_splits_a_large_block_into_one_unit_per_matrix(facts: dict[str, Any]) -> None:
    """Modules FSDP2 wraps: the blocks, the embedding, the final norm and the head (one unit of
    two modules) and the root; split, each block adds its 4 attention and 3 SwiGLU matrices
    (the tiny preset's; its losses are compared with one process in test_layouts)."""
    layers = PRESETS["tiny"].layers
    units = facts["units/zero3-dp4"]
    assert units == {"block": layers + 4, "matrix": layers * (1 + 4 + 3) + 4}
