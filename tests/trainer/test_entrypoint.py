"""``python -m meshrun_trainer`` on its own: success, bad configuration and a failing run."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from meshrun_trainer.local.env import edit_document, one_pod_env
from trainer_launch import REPO, cpu_env

from meshrun.api.read import read_spec
from meshrun.planner.plan import plan_job

pytestmark = pytest.mark.trainer

JOB = {
    "image": "local",
    "resources": {
        "numNodes": 1,
        "numProcPerNode": 1,
        "accelerator": "cpu",
        "acceleratorMemoryGiB": 1,  # so that auto searches the layouts and micro-batch sizes
    },
    "strategy": {"type": "auto"},
    "model": {"preset": "tiny"},
    "training": {"steps": 3, "globalBatchSize": 8, "dataset": "corpus"},  # microBatchSize unset
}


def job_env() -> dict[str, str]:
    """The environment of :data:`JOB`, planned by auto (one process, micro-batches of 8)."""
    spec = read_spec(JOB)
    plan = plan_job(spec, "local")
    assert plan.layout.micro_batch_size == 8 and spec.training.micro_batch_size is None
    return one_pod_env(plan, spec)


def trainer(
    tmp_path: Path,
    *,
    drop: str = "",
    spec: dict[str, Any] | None = None,
    plan: dict[str, Any] | None = None,
    pod: dict[str, Any] | None = None,
    **env: str,
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """Run the trainer with :data:`JOB`'s environment, its document's spec, plan and pod changed
    as given, ``env`` set and ``drop`` removed."""
    log = tmp_path / "termination-log"
    base = job_env()
    parts = {
        "spec": spec or {},
        "plan": plan or {},
        "pod": {"terminationLog": str(log), **(pod or {})},
    }
    base = edit_document(base, **parts)
    base.update(**env)
    base.pop(drop, None)
    proc = subprocess.run(
        [sys.executable, "-m", "meshrun_trainer"],
        cwd=REPO,
        env=cpu_env(**base),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return proc, log


@pytest.mark.timeout(180)
def test_single_process_without_torchrun(tmp_path: Path) -> None:
    proc, log = trainer(tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    events = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [e["step"] for e in events if e["event"] == "step"] == [1, 2, 3]
    message = json.loads(log.read_text())
    assert message["status"] == "Succeeded" and message["steps"] == 3
    assert message["layout"]["dataParallel"] == "none"
    # the plan's micro-batch size, which auto chose: the spec leaves it unset
    assert message["layout"]["microBatchSize"] == 8
    assert len(message["peakMemoryBytes"]) == 1


def test_bad_configuration_exits_2_naming_the_field(tmp_path: Path) -> None:
    proc, log = trainer(tmp_path, plan={"layout": {"degrees": {"tp": 3}}}, WORLD_SIZE="3")
    assert proc.returncode == 2
    # torchrun exits 1 whatever its worker's code: the termination message says "permanent".
    message = json.loads(log.read_text())
    assert (message["status"], message["reason"], message["permanent"]) == (
        "Failed",
        "ConfigError",
        True,
    )
    assert (
        "invalid configuration: spec.strategy.tensorParallel: must divide spec.model.heads"
    ) in proc.stderr
    assert "(3 does not divide heads=4)" in proc.stderr
    assert "Traceback" not in proc.stderr
    missing, _ = trainer(tmp_path, drop="MESHRUN_JOB")
    assert missing.returncode == 2, "the trainer has no configuration of its own"
    assert "invalid configuration: MESHRUN_JOB: is required" in missing.stderr
    wrong, _ = trainer(tmp_path, spec={"training": {"learningRate": "fast"}})
    assert wrong.returncode == 2
    assert "invalid configuration: spec.training.learningRate: must be a number" in wrong.stderr


@pytest.mark.timeout(180)
def test_failure_reaches_the_termination_message(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the checkpoint directory should be")
    proc, log = trainer(
        tmp_path,
        spec={"training": {"checkpoint": {"everySteps": 2}}},
        pod={"checkpointDir": str(blocker)},
    )
    assert proc.returncode != 0
    message = json.loads(log.read_text())
    assert message["status"] == "Failed" and message["rank"] == 0
    assert "not-a-directory" in message["error"]


def test_a_gpu_job_without_cuda_fails_permanently_instead_of_using_the_cpu(
    tmp_path: Path,
) -> None:
    gpu = {"resources": {"accelerator": "nvidia.com/gpu"}}
    proc, log = trainer(tmp_path, spec=gpu, CUDA_VISIBLE_DEVICES="")
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert "no usable accelerator" in proc.stderr and "not falling back to the CPU" in proc.stderr
    assert "Traceback" not in proc.stderr and '"event": "step"' not in proc.stdout
    message = json.loads(log.read_text())
    assert (message["reason"], message["permanent"]) == ("NoAccelerator", True)
    assert "0 CUDA device(s)" in message["error"]


@pytest.mark.timeout(400)
def test_compiled_blocks_train_like_eager(tmp_path: Path) -> None:
    """spec.training.compile with selective checkpointing, through the environment."""
    losses = {}
    for compile_ in ("false", "true"):
        proc, _ = trainer(
            tmp_path,
            spec={"training": {"compile": compile_ == "true", "precision": "fp32"}},
            plan={"activationCheckpointing": "selective"},
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        events = [json.loads(line) for line in proc.stdout.splitlines()]
        losses[compile_] = [e["loss"] for e in events if e["event"] == "step"]
    assert len(losses["true"]) == 3
    for eager, compiled in zip(losses["false"], losses["true"], strict=True):
        assert abs(compiled - eager) <= 1e-5 * abs(eager), losses


@pytest.mark.timeout(180)
def test_a_loss_that_turns_non_finite_stops_the_trainer_with_a_permanent_reason(
    tmp_path: Path,
) -> None:
    # A learning rate no model survives: the weights blow up after the first step, and so does
    # the loss of the next.
    proc, log = trainer(tmp_path, spec={"training": {"learningRate": 1e30, "steps": 6}})
    assert proc.returncode == 4, proc.stderr[-2000:]
    message = json.loads(log.read_text())  # strict JSON: no NaN in it
    assert (message["status"], message["reason"], message["permanent"]) == (
        "Failed",
        "LossNotFinite",
        True,
    )
    assert message["loss"] in ("nan", "inf", "-inf")
    assert f"the training loss is {message['loss']} at step {message['step']}" in message["error"]
    steps = [json.loads(line) for line in proc.stdout.splitlines()]
    # It stopped at the first non-finite loss: every step it reported had a finite one.
    assert [e["step"] for e in steps if e["event"] == "step"] == list(range(1, message["step"]))
    assert all(isinstance(e["loss"], float) for e in steps if e["event"] == "step")
    assert "Traceback" not in proc.stderr


class _Payload:
    """Pickles as a call of ``open(path, "w")``: a file that appears if it ever runs."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return (open, (str(self.path), "w"))


@pytest.mark.timeout(240)
def test_a_checkpoint_that_cannot_be_loaded_fails_the_job_permanently_naming_it(
    tmp_path: Path,
) -> None:
    checkpoints, first, second = tmp_path / "checkpoints", tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    pod = {"checkpointDir": str(checkpoints)}
    proc, _ = trainer(first, spec={"training": {"checkpoint": {"everySteps": 3}}}, pod=pod)
    assert proc.returncode == 0, proc.stderr[-2000:]
    metadata = checkpoints / "step-00000003" / ".metadata"
    assert metadata.is_file(), sorted(p.name for p in checkpoints.iterdir())
    ran = tmp_path / "payload-ran"
    metadata.write_bytes(pickle.dumps(_Payload(ran)))

    spec = {"training": {"steps": 6, "checkpoint": {"everySteps": 3}}}
    proc, log = trainer(second, spec=spec, pod=pod)
    assert proc.returncode == 5, proc.stderr[-2000:]
    message = json.loads(log.read_text())
    assert (message["status"], message["reason"], message["permanent"]) == (
        "Failed",
        "CheckpointRefused",
        True,
    )
    assert f"{metadata}: refused to load the global io.open" in message["error"]
    assert not ran.exists(), "the checkpoint's payload ran"
    assert "Traceback" not in proc.stderr
