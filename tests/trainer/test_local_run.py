"""``meshrun run FILE --local``: real two-pod runs through the CLI (examples/moe.yaml among them),
and its input errors."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator
from trainer_launch import REPO, cpu_env

pytestmark = pytest.mark.trainer

JOB = """\
apiVersion: meshrun.dev/v1alpha1
kind: ParallelTrainingJob
metadata:
  name: local-pp
spec:
  image: meshrun/trainer:test
  resources: {numNodes: 2, numProcPerNode: 1, accelerator: cpu}
  strategy: {type: pipeline, pipelineParallel: 2, pipelineSchedule: gpipe, microBatches: 2}
  model: {preset: tiny}
  training:
    steps: 6
    globalBatchSize: 4
    precision: fp32
    learningRate: 0.01
    checkpoint: {everySteps: 2}
"""


def meshrun(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "meshrun", *args]
    return subprocess.run(
        cmd, cwd=REPO, env=cpu_env(), capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.mark.timeout(300)
def test_two_pods_train_and_write_summary_plot_and_event_files(tmp_path: Path) -> None:
    """The summary, the picture, and the TensorBoard event files read by TensorBoard's own
    reader: the losses of the summary, and after a restart from an earlier checkpoint each
    step once, the resumed run's."""
    job = tmp_path / "job.yaml"
    job.write_text(JOB)
    summary_path, plot = tmp_path / "summary.json", tmp_path / "loss.png"
    checkpoints = tmp_path / "checkpoints"
    proc = meshrun(
        "run", str(job), "--local", "--summary-json", str(summary_path), "--plot", str(plot),
        "--checkpoint-dir", str(checkpoints),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(summary_path.read_text())
    assert summary["steps"] == 6 and len(summary["losses"]) == 6
    assert summary["finalLoss"] == summary["losses"][-1] < summary["losses"][0]
    assert summary["layout"]["pp"] == 2 and summary["layout"]["pipelineSchedule"] == "gpipe"
    assert summary["worldSize"] == 2 and len(summary["peakMemoryBytes"]) == 2
    assert all(b > 10_000_000 for b in summary["peakMemoryBytes"])  # a torch process: > 10 MB
    assert summary["peakMemoryKind"] == "ru_maxrss"
    assert summary["tokensPerSecond"] > 0
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "local-pp: 6 steps, final loss" in proc.stdout
    events = checkpoints / "tensorboard"
    assert f"TensorBoard event files: {events}" in proc.stdout
    first = scalars(events)
    assert [step for step, _ in first["train/loss"]] == [1, 2, 3, 4, 5, 6]
    assert [value for _, value in first["train/loss"]] == pytest.approx(summary["losses"])
    assert [value for _, value in first["train/learning_rate"]] == pytest.approx([0.01] * 6)
    assert all(value > 0 for _, value in first["train/grad_norm"])
    assert all(value > 0 for _, value in first["train/step_time_seconds"])
    assert all(value > 0 for _, value in first["train/tokens_per_second"])
    assert len(first["plan/predicted_tokens_per_second"]) == 6

    # The pods die after step 6 was logged but before its checkpoint is kept: the restart
    # resumes from step 4 and logs 5 and 6 again, into a new file of the same folder.
    shutil.rmtree(checkpoints / "step-00000006")
    restarted = time.time()
    second_summary = tmp_path / "second.json"
    proc = meshrun(
        "run", str(job), "--local", "--quiet", "--summary-json", str(second_summary),
        "--checkpoint-dir", str(checkpoints),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    second = json.loads(second_summary.read_text())
    assert second["resumedFromStep"] == 4 and len(second["losses"]) == 2
    assert len(list(events.glob("events.out.tfevents.*"))) == 2
    after = scalars(events)
    assert [step for step, _ in after["train/loss"]] == [1, 2, 3, 4, 5, 6], "no step twice"
    assert [value for _, value in after["train/loss"]] == pytest.approx(
        summary["losses"][:4] + second["losses"]
    )
    walls = [wall for _, wall in after["wall"]]
    assert max(walls[:4]) < restarted <= min(walls[4:]), "steps 5 and 6 of the resumed run"


def scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series of the folder as TensorBoard's reader sees it (all points kept),
    and "wall": the wall times of the loss's points."""
    reader = EventAccumulator(str(folder), size_guidance={SCALARS: 0})
    reader.Reload()
    series = {
        tag: [(event.step, event.value) for event in reader.Scalars(tag)]
        for tag in reader.Tags()["scalars"]
    }
    series["wall"] = [(event.step, event.wall_time) for event in reader.Scalars("train/loss")]
    return series


def _losses(tmp_path: Path, name: str, resources: str, strategy: str) -> list[float]:
    job = tmp_path / f"{name}.yaml"
    job.write_text(
        JOB.replace("name: local-pp", f"name: {name}")
        .replace("{numNodes: 2, numProcPerNode: 1, accelerator: cpu}", resources)
        .replace(
            "{type: pipeline, pipelineParallel: 2, pipelineSchedule: gpipe, microBatches: 2}",
            strategy,
        )
    )
    summary = tmp_path / f"{name}.json"
    proc = meshrun("run", str(job), "--local", "--quiet", "--summary-json", str(summary))
    assert proc.returncode == 0, proc.stderr[-3000:]
    losses: list[float] = json.loads(summary.read_text())["losses"]
    return losses


@pytest.mark.timeout(600)
def test_tp_over_whole_pods_and_1f1b_below_a_micro_batch_per_stage_train_as_one_process(
    tmp_path: Path,
) -> None:
    """A TP group spanning two pods, and 1F1B with one micro-batch over two stages (run in
    GPipe's order), give the losses of one process with the same batch."""
    one = _losses(
        tmp_path, "one", "{numNodes: 1, numProcPerNode: 1, accelerator: cpu}", "{type: ddp}"
    )
    assert one[-1] < one[0] - 1e-3  # it trains, or equal losses would prove nothing
    two_pods = "{numNodes: 2, numProcPerNode: 1, accelerator: cpu}"
    tensor = _losses(tmp_path, "tp-pods", two_pods, "{type: tensor, tensorParallel: 2}")
    pipeline = _losses(
        tmp_path,
        "few-micro",
        two_pods,
        "{type: pipeline, pipelineParallel: 2, pipelineSchedule: 1f1b, microBatches: 1}",
    )
    for losses in (tensor, pipeline):
        assert len(losses) == len(one)
        assert all(abs(a - b) <= 1e-4 * abs(b) for a, b in zip(losses, one, strict=True))


@pytest.mark.timeout(600)
def test_the_long_context_example_trains_with_each_sequence_split_over_two_ranks(
    tmp_path: Path,
) -> None:
    """examples/long-context.yaml through the CLI as a user runs it (2 of its steps): every
    4,096-token sequence split over the 2 processes (cp 2, one data-parallel replica), and the
    loss falls."""
    example = yaml.safe_load((REPO / "examples" / "long-context.yaml").read_text())
    example["spec"]["training"]["steps"] = 2
    job, summary_path = tmp_path / "long-context.yaml", tmp_path / "summary.json"
    job.write_text(yaml.safe_dump(example))
    proc = meshrun("run", str(job), "--local", "--quiet", "--summary-json", str(summary_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(summary_path.read_text())
    assert summary["worldSize"] == 2 and len(summary["losses"]) == 2
    assert (summary["layout"]["dp"], summary["layout"]["cp"]) == (1, 2)
    assert summary["trainerLayout"]["degrees"]["cp"] == 2
    assert summary["finalLoss"] < summary["losses"][0] - 1e-2


@pytest.mark.timeout(600)
def test_the_moe_example_trains_as_given_and_ep_changes_no_loss(tmp_path: Path) -> None:
    """examples/moe.yaml, unchanged, trains with its experts over expertParallel 2 (2 pods of 2
    processes); its first steps' losses equal those of the same job with every expert on every
    rank (expertParallel 1), the experts' gradients being the same sums."""
    example = REPO / "examples" / "moe.yaml"
    summary_path = tmp_path / "moe.json"
    proc = meshrun(
        "run", str(example), "--local", "--quiet", "--summary-json", str(summary_path),
        "--checkpoint-dir", str(tmp_path / "checkpoints"),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(summary_path.read_text())
    assert summary["trainerLayout"]["ep"] == 2 and summary["worldSize"] == 4
    losses = summary["losses"]
    assert len(losses) == summary["steps"] == 20 and losses[-1] < losses[0] - 1.0
    job = yaml.safe_load(example.read_text())
    job["spec"]["strategy"]["expertParallel"] = 1
    job["spec"]["training"].update(steps=3)
    del job["spec"]["training"]["checkpoint"]
    whole = tmp_path / "ep1.yaml"
    whole.write_text(yaml.safe_dump(job))
    plain = tmp_path / "ep1.json"
    proc = meshrun("run", str(whole), "--local", "--quiet", "--summary-json", str(plain))
    assert proc.returncode == 0, proc.stderr[-3000:]
    reference = json.loads(plain.read_text())
    assert reference["trainerLayout"]["ep"] == 1
    assert reference["losses"] == pytest.approx(losses[:3], rel=1e-5)
