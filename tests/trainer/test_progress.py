"""Rank 0's progress: JSON step lines, /metrics and /progress over real HTTP, termination log."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from meshrun_trainer.components.eventlog import EventLog
from meshrun_trainer.components.progress import Metrics, ProgressServer, Reporter
from meshrun_trainer.config.read import read_job
from meshrun_trainer.local.env import edit_document, layout_env
from meshrun_trainer.runner import StepRecord

from meshrun.files import events

pytestmark = pytest.mark.unit


def test_step_lines_endpoints_and_termination_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "termination-log"
    env = layout_env({"preset": "tiny"}, {"steps": 5, "globalBatchSize": 8}, name="j1")
    # No fixed port in tests: the server is started below on a free one.
    job = read_job(edit_document(env, pod={"metricsPort": 0, "terminationLog": str(log)}))
    reporter = Reporter(job)
    assert reporter.server is None
    reporter.server = ProgressServer(0, reporter.metrics, reporter.progress)
    base = f"http://127.0.0.1:{reporter.server.port}"
    reporter.on_step(
        StepRecord(
            step=3,
            loss=4.25,
            grad_norm=0.9,
            learning_rate=3e-4,
            step_time_s=0.5,
            tokens_per_s=1024.0,
            peak_memory_bytes=12345,
        )
    )

    line = json.loads(capsys.readouterr().out.strip())
    assert line["event"] == "step" and line["step"] == 3 and line["loss"] == 4.25
    assert line["totalSteps"] == 5 and line["peakMemoryBytes"] == 12345

    with urllib.request.urlopen(f"{base}/progress", timeout=5) as response:
        progress = json.load(response)
    assert progress["step"] == 3 and progress["totalSteps"] == 5
    assert progress["tokensPerSecond"] == 1024.0 and progress["stepTimeSeconds"] == 0.5
    with urllib.request.urlopen(f"{base}/metrics", timeout=5) as response:
        metrics = response.read().decode()
    assert 'meshrun_trainer_step{job="j1",namespace="local"} 3.0' in metrics
    assert 'meshrun_trainer_loss{job="j1",namespace="local"} 4.25' in metrics
    assert "meshrun_trainer_tokens_total" in metrics

    reporter.finish({"status": "Succeeded", "finalLoss": 4.25, "losses": [5.0, 4.25]})
    message = json.loads(log.read_text())
    assert message == {"status": "Succeeded", "finalLoss": 4.25}, "no per-step list in 4 KiB"


def test_unwritable_termination_log_does_not_fail(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    env = layout_env({"preset": "tiny"}, {"globalBatchSize": 8})
    job = read_job(edit_document(env, pod={"terminationLog": str(tmp_path / "missing" / "log")}))
    Reporter(job).finish({"status": "Succeeded"})
    assert "cannot write termination log" in capsys.readouterr().err


def test_metrics_registry_is_per_reporter() -> None:
    job = read_job(layout_env({"preset": "tiny"}, {"globalBatchSize": 8}))
    # Two registries in one process must not clash (tests build several reporters).
    assert Metrics(job).registry is not Metrics(job).registry


def _record(step: int) -> StepRecord:
    return StepRecord(
        step=step,
        loss=5.0 - step,
        grad_norm=1.0,
        learning_rate=1e-3,
        step_time_s=0.1,
        tokens_per_s=100.0,
        peak_memory_bytes=1,
    )


def test_event_files_are_on_disk_at_each_checkpoints_step(tmp_path: Path) -> None:
    """A pod killed after the checkpoint of step 2 has lost nothing a resume from it would not
    log again: the file is flushed at the checkpoint's step (within the 10 s otherwise)."""
    training = {"globalBatchSize": 8, "checkpoint": {"everySteps": 2}}
    job = read_job(layout_env({"preset": "tiny"}, training))
    log = EventLog(str(tmp_path), job)
    for step in (1, 2, 3):
        log.step(_record(step))
    on_disk = events.read_scalars(tmp_path)
    assert sorted(on_disk[events.LOSS]) == [1, 2], "step 3 still buffered"
    assert on_disk[events.LEARNING_RATE] == {1: pytest.approx(1e-3), 2: pytest.approx(1e-3)}
    log.close()
    assert sorted(events.read_scalars(tmp_path)[events.LOSS]) == [1, 2, 3]


def test_an_unwritable_event_folder_does_not_stop_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "file").write_text("")
    log = EventLog(
        str(tmp_path / "file" / "tensorboard"),
        read_job(layout_env({"preset": "tiny"}, {"globalBatchSize": 8})),
    )
    log.step(_record(1))
    log.step(_record(2))
    log.close()
    assert capsys.readouterr().err.count("TensorBoard event files disabled") == 1


def test_the_operator_reads_progress_again_on_one_kept_connection() -> None:
    """The operator's reader asks pod 0 every few seconds: on one connection the trainer keeps
    open (HTTP/1.1), not a new one per read."""
    import asyncio

    from meshrun_operator.seen.progress import ProgressReader
    from meshrun_operator.seen.views import PodView

    env = layout_env({"preset": "tiny"}, {"steps": 5, "globalBatchSize": 8}, name="j1")
    job = read_job(edit_document(env, pod={"metricsPort": 0}))
    reporter = Reporter(job)
    server = ProgressServer(0, reporter.metrics, reporter.progress)
    accepted: list[object] = []
    get_request = server.httpd.get_request

    def counted() -> Any:
        request = get_request()
        accepted.append(request[1])
        return request

    server.httpd.get_request = counted  # type: ignore[method-assign]
    reader = ProgressReader(True, timeout=5, port=server.port)
    pod = PodView(name="j1-0", index=0, attempt=0, phase="Running", pod_ip="127.0.0.1")

    async def reads() -> list[Any]:
        try:
            return [await reader.read(pod) for _ in range(5)]
        finally:
            await reader.close()

    try:
        answers = asyncio.run(reads())
    finally:
        server.close()
    assert all(a is not None and a["totalSteps"] == 5 for a in answers), answers
    assert len(accepted) == 1, f"{len(accepted)} connections for 5 reads"
