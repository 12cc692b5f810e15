"""The trainer's own verdict: torchrun exits 1 whatever its worker's code, so a permanent
failure (ConfigError, NoAccelerator) must come from the termination message."""

from __future__ import annotations

import pytest
from meshrun_operator.lifecycle.failure.classes import FailureClass, classify, from_trainer
from operator_factories import make_pod, observe
from operator_lifecycle_helpers import condition, run, started_job

from meshrun.envcontract import EXIT_NO_ACCELERATOR

pytestmark = pytest.mark.unit

NO_GPU = {
    "status": "Failed",
    "rank": 0,
    "error": "NoAcceleratorError: local rank 0 sees 0 CUDA device(s)",
    "reason": "NoAccelerator",
    "permanent": True,
}


def test_a_permanent_verdict_fails_the_job_at_once_despite_torchruns_exit_1() -> None:
    failed = make_pod(1, phase="Failed", exit_code=1, summary=NO_GPU)
    _, decision = run(started_job(), observe(make_pod(0), failed), 5)
    failed_condition = condition(decision, "Failed")
    assert failed_condition["reason"] == "NoAccelerator"
    assert "0 CUDA device(s)" in failed_condition["message"]
    assert decision.status["phase"] == "Failed"


def test_exit_3_alone_is_no_accelerator_and_plain_errors_stay_retryable() -> None:
    direct = classify(EXIT_NO_ACCELERATOR, "Error", None)
    assert (direct.kind, direct.reason) == (FailureClass.PERMANENT, "NoAccelerator")
    assert from_trainer({"status": "Failed", "error": "RuntimeError: NCCL timeout"}) is None
    assert from_trainer({**NO_GPU, "reason": "SomethingElse"}) is None
    assert from_trainer({**NO_GPU, "permanent": "yes"}) is None
    verdict = from_trainer(NO_GPU)
    assert verdict is not None and verdict.kind == FailureClass.PERMANENT
