"""``meshrun run FILE --local`` refuses bad input before any process starts: exit code 2 and one
clear line naming what to fix, never a traceback. Called in-process through the CLI's own
``main`` (what the ``meshrun`` script runs): no trainer process is launched, so these run in the
unit tier; the real runs are in test_local_run.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from meshrun_trainer.local.run import CHILD_FAILED, log_tail
from test_local_run import JOB

from meshrun.cli.main import main

pytestmark = pytest.mark.unit


def meshrun(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    """The CLI's exit code (argparse's own exits included) and what it wrote to stderr."""
    try:
        code = main(list(argv))
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["missing.yaml", "--local"], "missing.yaml"),
        (["JOB"], "only --local is supported"),
        (["JOB", "--local", "--plot", "x.txt"], "--plot: x.txt must end in"),
        (["BAD", "--local"], "spec.strategy.tensorParallel"),
        # Refused by the planner's rules before any process starts, not by every trainer.
        (["SEQ", "--local"], "(2 does not divide seqLen=63)"),
        (["JOB", "--local", "--job", "nope"], "--job: no ParallelTrainingJob named 'nope'"),
    ],
)
def test_bad_input_exits_2_with_a_clear_message(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = {name: tmp_path / f"{name.lower()}.yaml" for name in ("JOB", "BAD", "SEQ")}
    files["JOB"].write_text(JOB)
    files["BAD"].write_text(
        JOB.replace("pipelineParallel: 2", "pipelineParallel: 2, tensorParallel: 3")
    )
    files["SEQ"].write_text(
        JOB.replace("numNodes: 2, numProcPerNode: 1", "numNodes: 1, numProcPerNode: 2")
        .replace(
            "{type: pipeline, pipelineParallel: 2, pipelineSchedule: gpipe, microBatches: 2}",
            "{type: tensor, tensorParallel: 2}",
        )
        .replace("{preset: tiny}", "{preset: tiny, seqLen: 63}")
    )
    argv = [str(files[a]) if a in files else a for a in args]
    code, stderr = meshrun(capsys, "run", *argv)
    assert code == 2, stderr
    assert message in stderr
    assert "Traceback" not in stderr


def test_a_failed_runs_log_shows_the_ranks_last_lines_before_torchruns_report() -> None:
    """torchrun writes its own traceback and a table after the failed rank's output: the excerpt
    the CLI prints keeps the rank's last lines and the table, not the launcher's frames."""
    rank = [f"step {i}" for i in range(40)] + [
        "terminate called without an active exception",
        "Fatal Python error: Aborted",
    ]
    launcher = [
        "Traceback (most recent call last):",
        *[f'  File "torch/distributed/run.py", line {i}, in run' for i in range(12)],
        f"{CHILD_FAILED}: ",
    ]
    table = ["=" * 20, "meshrun_trainer FAILED", "exitcode  : -6 (pid: 7)  (SIGABRT)", "=" * 20]
    excerpt = log_tail("\n".join(rank + launcher + table)).splitlines()
    assert excerpt == rank[-30:] + launcher[-1:] + table
    # A log without torchrun's report: its last lines, as they are.
    assert log_tail("\n".join(rank), lines=2).splitlines() == rank[-2:]
