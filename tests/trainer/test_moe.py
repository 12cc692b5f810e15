"""A mixture of experts under expert parallelism against the single-process reference: one
launch of 4 processes (moe_check.py).

ep 4 over DDP, ep 2 under ZeRO-3 with gradient accumulation, ep 2 with 2 pipeline stages x dp 2,
ep 1 under ZeRO-1 and ZeRO-2, ep 2 under ZeRO-1 (FSDP2's, as ZeroRedundancyOptimizer would
broadcast one rank's experts over another's), ep 4 over tp 2 x dp 2, a sigmoid router with
bias balancing at ep 4 and at ep 2 over tp 2 x ZeRO-3 dp 2, and under context parallelism: ep 2
over cp 2 (x dp 2), ep 4 over dp 2 x cp 2 under ZeRO-1, ep 4 over cp 2 x tp 2 and the sigmoid
router at ep 2 inside cp 4 (the per-sequence auxiliary loss adds up the shards of each
sequence over cp x tp first, the loads are summed over dp x cp): the per-step losses, gradient norms
and auxiliary losses equal the plain run's in fp32 within 1e-4 relative, every expert's
gradient on the first step within 1e-6 absolute (gradients of about 1e-3), and the balancing
biases after the last step exactly (they move in steps of 0.001). A run saved at ep 4 resumes
at ep 2 (under ZeRO-3) from its step-2 checkpoint onto the plain run's step 3.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from moe_check import RUNS, grads_file
from trainer_launch import cpu_env, forked, run

pytestmark = pytest.mark.trainer

RTOL = 1e-4
GRAD_ATOL = 1e-6


def _close(got: list[float], want: list[float], rtol: float = RTOL) -> bool:
    return len(got) == len(want) and all(
        abs(g - w) <= rtol * abs(w) for g, w in zip(got, want, strict=True)
    )


@pytest.mark.timeout(600)
def test_moe_layouts_match_single_process(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    script = str(Path(__file__).with_name("moe_check.py"))
    proc = run(forked(4, script, str(out), str(tmp_path / "ck")), cpu_env(), timeout=560)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads(out.read_text())
    expert_grads = torch.load(grads_file(out), weights_only=True)
    assert set(results) == set(RUNS) == set(expert_grads)
    softmax = results["ep4-ddp4"]["reference"]
    assert softmax["losses"][-1] < softmax["losses"][0] - 1e-3, "the reference must train"
    assert all(a > 0 for a in softmax["aux"]), "the auxiliary loss is counted"
    sigmoid = results["sigmoid-bias-ep4"]["reference"]
    assert any(b != 0 for layer in sigmoid["biases"] for b in layer), "bias balancing moves"
    for name, got in results.items():
        want = got["reference"]
        steps = len(got["losses"])
        assert _close(got["losses"], want["losses"][-steps:]), (name, got["losses"], want)
        assert _close(got["gradNorms"], want["gradNorms"][-steps:]), (name, got["gradNorms"])
        assert _close(got["aux"], want["aux"][-steps:]), (name, got["aux"], want["aux"])
        flat = [b for layer in got["biases"] for b in layer]
        assert flat == pytest.approx([b for layer in want["biases"] for b in layer], abs=1e-9)
        if name == "resumed-ep2":
            assert got["resumedFrom"] == 2 and steps == 1
            continue
        got_grads, want_grads = expert_grads[name]["got"], expert_grads[name]["want"]
        assert set(got_grads) == set(want_grads) != set()
        for key, grad in want_grads.items():
            assert got_grads[key].shape == grad.shape, (name, key)
            error = (got_grads[key] - grad).abs().max().item()
            assert error <= GRAD_ATOL, (name, key, error)
