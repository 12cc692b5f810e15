"""The operator's flags, group by group: every duration and count refuses what is not above 0,
naming the flag; the ports take 0 (off) to 65535; the help lists each concern under its heading."""

from __future__ import annotations

import pytest
from meshrun_operator.main import main, parse_args

pytestmark = pytest.mark.unit

POSITIVE = [
    "--workers", "--api-timeout-seconds", "--stall-seconds", "--max-pods-per-job",
    "--resync-seconds", "--status-interval-seconds", "--error-backoff-base-seconds",
    "--error-backoff-max-seconds", "--backoff-base-seconds", "--backoff-max-seconds",
    "--node-toleration-seconds", "--start-failure-seconds", "--expectations-timeout-seconds",
]  # fmt: skip


@pytest.mark.parametrize("flag", POSITIVE)
def test_a_duration_or_count_not_above_zero_is_refused_naming_the_flag(
    flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([flag, "0"]) == 2
    said = capsys.readouterr().err
    assert f"argument {flag}: 0 must be positive" in said
    assert main([flag, "many"]) == 2
    assert f"argument {flag}: invalid" in capsys.readouterr().err


def test_the_flags_reach_the_options_and_the_help_has_a_heading_per_concern(
    capsys: pytest.CaptureFixture[str],
) -> None:
    options = parse_args(
        ["--metrics-port", "0", "--workers", "3", "--resync-seconds", "0.5",
         "--node-toleration-seconds", "7", "--no-kueue"]
    )  # fmt: skip
    assert (options.metrics_port, options.workers, options.resync_seconds) == (0, 3, 0.5)
    assert options.timing.node_toleration_seconds == 7 and not options.kueue
    assert main(["--health-port", "65536"]) == 2
    assert "argument --health-port: 65536 must be a port" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    shown = capsys.readouterr().out
    for heading in ("serving:", "the resync loop:", "restarts and timeouts:", "what is watched:"):
        assert heading in shown


def test_the_help_begins_with_what_the_operator_does_for_its_user(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "Run the meshrun operator: it turns each ParallelTrainingJob into" in shown
    assert "``" not in shown, "the module's reStructuredText is not the help"
