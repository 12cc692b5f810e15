"""``meshrun calibrate`` times the matrix multiplies the step-time model prices, on this
machine, and compares them with the model's own efficiency curve."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from meshrun.api.crd import load_jobs
from meshrun.api.read import read_spec
from meshrun.planner.plan import plan_job
from meshrun.planner.steptime import gemm_efficiency, gemm_passes, layer_gemms

pytestmark = [pytest.mark.trainer, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "examples" / "demo-3d-cpu.yaml"


def _calibrate(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "meshrun", "calibrate", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=ROOT)


def test_calibrate_times_the_multiplies_the_model_prices_for_the_jobs_layout() -> None:
    proc = _calibrate(str(JOB), "--device", "cpu", "--repeat", "3", "-o", "json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    (job,) = load_jobs(JOB)
    plan = plan_job(read_spec(job["spec"]), name="demo-3d-cpu")
    tokens = plan.layout.micro_batch_size * plan.model.seq_len
    want = [
        (weights, product, [int(x) for x in shape])
        for weights, (m, n, k) in layer_gemms(plan.model, tokens, plan.layout.tp).items()
        for product, shape in gemm_passes(m, n, k).items()
    ]
    got = [(r["weights"], r["product"], [r["m"], r["n"], r["k"]]) for r in result["multiplies"]]
    assert got == want, "one block's three products per weight, split by the plan's tp"
    assert result["tensorParallel"] == 2 and result["tokensPerMicroBatch"] == tokens
    assert (result["dtype"], result["product"], result["device"]) == ("fp32", "cpu", "cpu")
    # fp32 is priced at an eighth of the profile's peak, as the step-time model does
    peak = result["peakTflops"] / 8
    for row in result["multiplies"]:
        flops = 2 * row["m"] * row["n"] * row["k"]
        assert row["seconds"] > 0
        assert row["tflops"] == pytest.approx(flops / row["seconds"] / 1e12)
        assert row["efficiency"] == pytest.approx(row["tflops"] / peak)
        assert row["predictedEfficiency"] == pytest.approx(
            gemm_efficiency(row["m"], row["n"], row["k"])
        )
    measured = sum(r["seconds"] for r in result["multiplies"])
    predicted = sum(
        2 * r["m"] * r["n"] * r["k"] / (peak * 1e12 * r["predictedEfficiency"])
        for r in result["multiplies"]
    )
    assert result["speedVsModel"] == pytest.approx(predicted / measured)
    assert result["impliedPeakTflops"] == pytest.approx(result["peakTflops"] * predicted / measured)


def test_calibrate_on_cuda_runs_there_or_names_the_flag_it_cannot_honour() -> None:
    import torch

    proc = _calibrate(str(JOB), "--device", "cuda", "--repeat", "2", "-o", "json")
    if torch.cuda.is_available():
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["device"] == torch.cuda.get_device_name(0)
    else:
        assert proc.returncode == 2
        assert "--device: cuda: torch sees no CUDA device here" in proc.stderr
