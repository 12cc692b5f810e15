"""TensorBoard event files: the writer read back by TensorBoard's own reader, the purge after a
resume, the reader ``meshrun plot`` uses, the curves it draws and ``meshrun plot FOLDER``."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator
from tensorboard.compat.proto import event_pb2

from meshrun.api.errors import SpecError
from meshrun.api.read import read_spec
from meshrun.cli.main import main as meshrun_main
from meshrun.envcontract import metrics_dir
from meshrun.files import events
from meshrun.files.curves import curves_from_events, curves_from_steps
from meshrun.rules.strategy import check_spec

pytestmark = pytest.mark.unit


def tensorboard(folder: Path) -> dict[str, list[tuple[int, float]]]:
    reader = EventAccumulator(str(folder), size_guidance={SCALARS: 0})
    reader.Reload()
    return {
        tag: [(e.step, e.value) for e in reader.Scalars(tag)] for tag in reader.Tags()["scalars"]
    }


def test_crc32c_and_frames_match_the_format() -> None:
    assert events.crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value (RFC 3720)
    record = events.event(12.5, 7, scalars={"a": 1.5})
    framed = events.frame(record)
    assert struct.unpack("<Q", framed[:8]) == (len(record),)
    assert events.records(framed) == [record]
    parsed = event_pb2.Event.FromString(record)  # TensorBoard's own protobuf classes
    assert parsed.wall_time == 12.5 and parsed.step == 7
    assert [(v.tag, v.simple_value) for v in parsed.summary.value] == [("a", 1.5)]
    start = event_pb2.Event.FromString(events.event(1.0, 41, session_start=True))
    assert start.session_log.status == event_pb2.SessionLog.START and start.step == 41


def test_resume_purges_the_dead_runs_later_steps_for_both_readers(tmp_path: Path) -> None:
    """Steps 1-47 logged, checkpoint at 40: the new file's values for 41-47 replace them."""
    dead = events.EventWriter(tmp_path)
    for step in range(1, 48):
        dead.scalars(step, {events.LOSS: 100.0 + step, events.EVAL_LOSS: 200.0 + step})
    dead.close()
    resumed = events.EventWriter(tmp_path, purge_from=41)
    assert resumed.path.name > dead.path.name, "read after the dead run's file"
    for step in range(41, 51):
        resumed.scalars(step, {events.LOSS: float(step)})
    resumed.close()
    expected = [(s, 100.0 + s) for s in range(1, 41)] + [(s, float(s)) for s in range(41, 51)]
    seen = tensorboard(tmp_path)
    assert seen[events.LOSS] == expected
    assert [s for s, _ in seen[events.EVAL_LOSS]] == list(range(1, 41)), "every series purged"
    ours = events.read_scalars(tmp_path)
    assert sorted(ours[events.LOSS].items()) == expected
    assert sorted(ours[events.EVAL_LOSS]) == list(range(1, 41))


def test_a_file_being_written_reads_up_to_its_last_whole_record(tmp_path: Path) -> None:
    writer = events.EventWriter(tmp_path)
    writer.scalars(1, {events.LOSS: 2.0})
    writer.scalars(2, {events.LOSS: 1.0})
    writer.close()
    data = writer.path.read_bytes()
    writer.path.write_bytes(data[:-5])  # the last record cut short
    assert events.read_scalars(tmp_path) == {events.LOSS: {1: 2.0}}
    writer.path.write_bytes(data[:20] + b"\x00" + data[21:])  # a damaged first record
    with pytest.raises(events.EventFileError, match="checksum"):
        events.read_scalars(tmp_path)


def _write_run(folder: Path) -> None:
    writer = events.EventWriter(folder)
    writer.scalars(0, {events.EVAL_LOSS: 5.0})
    for step in range(1, 5):
        writer.scalars(
            step,
            {
                events.LOSS: 5.0 - step,
                events.TOKENS_PER_SECOND: 1000.0 + step,
                events.PREDICTED_TOKENS_PER_SECOND: 1200.0,
            },
        )
    writer.scalars(4, {events.EVAL_LOSS: 1.5})
    writer.close()


def test_curves_from_event_files_and_from_a_local_runs_lines(tmp_path: Path) -> None:
    _write_run(tmp_path)
    curves = curves_from_events(tmp_path)
    assert curves.loss == [(1, 4.0), (2, 3.0), (3, 2.0), (4, 1.0)]
    assert curves.tokens_per_second == [(s, 1000.0 + s) for s in range(1, 5)]
    assert curves.predicted_tokens_per_second == 1200.0
    assert curves.eval_loss == [(0, 5.0), (4, 1.5)]
    steps = [{"step": s, "loss": 5.0 - s, "tokensPerSecond": 1000.0 + s} for s in range(1, 5)]
    evals = [{"step": 0, "loss": 5.0}, {"step": 4, "loss": 1.5}]
    assert curves_from_steps(steps, evals, 1200.0) == curves
    with pytest.raises(ValueError, match="no train/loss"):
        curves_from_events(tmp_path / "empty")


def test_meshrun_plot_draws_a_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "run"
    _write_run(folder)
    picture = tmp_path / "run.png"
    assert meshrun_main(["plot", str(folder), "-o", str(picture)]) == 0
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert meshrun_main(["plot", str(folder), "-o", str(tmp_path / "run.txt")]) == 2
    assert "-o: " in capsys.readouterr().err
    (tmp_path / "none").mkdir()
    assert meshrun_main(["plot", str(tmp_path / "none"), "-o", str(picture)]) == 2
    assert "no train/loss in any TensorBoard event file" in capsys.readouterr().err
    # A folder that is not there is said so, not looked for as a job on the cluster.
    absent = tmp_path / "absent"
    assert meshrun_main(["plot", str(absent), "-o", str(picture)]) == 2
    assert capsys.readouterr().err == f"meshrun plot: {absent}: no such folder here\n"


SPEC = {"image": "t", "resources": {"accelerator": "cpu"}, "model": {"preset": "tiny"}}


def test_where_the_event_files_go() -> None:
    default = read_spec(SPEC)
    assert metrics_dir(default, "/checkpoints") == "/checkpoints/tensorboard"
    assert metrics_dir(default, None) is None
    chosen = read_spec({**SPEC, "training": {"metrics": {"path": "/data/runs/a"}}})
    assert metrics_dir(chosen, "/checkpoints") == "/data/runs/a"
    off = read_spec({**SPEC, "training": {"metrics": {"tensorboard": False}}})
    assert metrics_dir(off, "/checkpoints") is None
    both = read_spec({**SPEC, "training": {"metrics": {"tensorboard": False, "path": "/x"}}})
    with pytest.raises(SpecError, match=r"metrics.path: needs spec.training.metrics.tensorboard"):
        check_spec(both)
