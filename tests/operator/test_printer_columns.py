"""What ``kubectl get ptj`` shows: every printer column reads a field the operator writes, and
the text it writes for the columns (status.display)."""

from __future__ import annotations

from typing import Any

import pytest
from meshrun_operator.lifecycle.columns import display
from meshrun_operator.plaindata import without_none
from operator_factories import REPORT_3_OF_10, make_job, make_pod, observe
from operator_lifecycle_helpers import run, started_job

from meshrun.api.crd import VERSION, crd
from meshrun.api.display import duration_text, rate_text

pytestmark = pytest.mark.unit


def columns() -> list[dict[str, Any]]:
    version = next(v for v in crd()["spec"]["versions"] if v["name"] == VERSION)
    found: list[dict[str, Any]] = version["additionalPrinterColumns"]
    return found


def read(status: dict[str, Any], json_path: str) -> Any:
    """A printer column's value: its JSONPath (``.status.a.b``) in the stored status."""
    value: Any = {"status": without_none(status)}
    for key in json_path.removeprefix(".").split("."):
        value = value.get(key) if isinstance(value, dict) else None
    return value


def running(**spec: Any) -> dict[str, Any]:
    """The status of a running job whose rank 0 reported ``REPORT_3_OF_10``."""
    job = started_job(**spec)
    _, decision = run(job, observe(make_pod(0, progress=REPORT_3_OF_10), make_pod(1)), 5)
    status: dict[str, Any] = decision.status
    return status


def test_every_column_reads_what_the_operator_writes_for_a_running_gpu_job() -> None:
    status = running()
    shown = {c["name"]: read(status, c["jsonPath"]) for c in columns() if c["type"] != "date"}
    predicted = status["progress"]["predictedTokensPerSecond"]
    assert shown == {
        "Strategy": "ddp",
        "Layout": "dp8 x pp1 x tp1",
        "Procs": 8,
        "Phase": "Running",
        "Restarts": 0,
        "Step": "3/10",
        "Progress": "30%",
        "Loss": "2.303",
        "Tokens/s": "123k",
        "Predicted Tokens/s": rate_text(predicted),
        "ETA": "3m30s",
    }


def test_the_layout_column_shows_context_parallelism_and_says_so() -> None:
    """A running job over 4 x 2 ranks with each sequence split over 2 of them: the Layout
    column shows cp, and its description (kubectl explain, the column's help) names it."""
    status = running(strategy={"contextParallel": 2})
    layout = next(c for c in columns() if c["name"] == "Layout")
    assert read(status, layout["jsonPath"]) == "dp4 x cp2 x pp1 x tp1"
    assert status["plan"]["layout"] == "dp4 x cp2 x pp1 x tp1" and status["plan"]["cp"] == 2
    words = " ".join(layout["description"].split())
    assert "data x context (only above 1) x pipeline x tensor" in words and "(epN)" in words


def test_a_cpu_job_counts_its_processes_and_shows_its_cpu_prediction() -> None:
    status = running(resources={"accelerator": "cpu"})
    assert status["gpus"] == 0 and read(status, ".status.worldSize") == 8
    predicted = status["progress"]["predictedTokensPerSecond"]
    shown = read(status, ".status.display.predictedTokensPerSecond")
    assert predicted < 5000 and shown == rate_text(predicted)
    assert read(status, ".status.display.step") == "3/10"


def test_nothing_to_show_before_the_first_report_and_no_empty_object() -> None:
    _, decision = run(make_job(), observe(), 0)
    assert decision.status["display"] is None
    assert "display" not in without_none(decision.status)
    assert decision.status["worldSize"] == 8


def test_a_finished_job_shows_its_last_step_and_no_time_left() -> None:
    summary = {"status": "Succeeded", "steps": 10, "finalLoss": 1.0, "tokensPerSecond": 512.0}
    done = (make_pod(0, phase="Succeeded", summary=summary), make_pod(1, phase="Succeeded"))
    _, decision = run(started_job(), observe(*done), 9)
    assert decision.status["display"] == {
        "step": "10/10",
        "progress": "100%",
        "loss": "1",
        "tokensPerSecond": "512",
        "predictedTokensPerSecond": None,
        "eta": None,
    }


def test_a_failed_job_shows_no_time_left_from_its_last_report() -> None:
    """The ETA of the run that stopped is no time left to wait for."""
    status = running()
    assert status["display"]["eta"] == "3m30s"
    ended = display({**status, "phase": "Failed"}) or {}
    assert ended["eta"] is None and ended["step"] == "3/10"


@pytest.mark.parametrize(
    ("progress", "step", "percent"),
    [
        ({"step": 0, "totalSteps": 1000}, "0/1000", "0%"),
        ({"step": 999, "totalSteps": 1000}, "999/1000", "99%"),
        ({"step": 1000, "totalSteps": 1000}, "1000/1000", "100%"),
        ({"step": 7}, "7", None),
        ({"totalSteps": 10}, None, None),
    ],
)
def test_step_of_the_total_and_the_share_done(
    progress: dict[str, Any], step: str | None, percent: str | None
) -> None:
    shown = display({"progress": progress}) or {}
    assert (shown.get("step"), shown.get("progress")) == (step, percent)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0.5, "0.50"),
        (8.123, "8.12"),
        (812.4, "812"),
        (999.4, "999"),
        (999.6, "1k"),
        (12345.0, "12.3k"),
        (1234567.0, "1.23M"),
        (2.5e9, "2.5G"),
    ],
)
def test_rates_have_three_significant_digits(value: float, text: str) -> None:
    assert rate_text(value) == text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.4, "0s"),
        (119, "119s"),
        (120, "2m"),
        (330, "5m30s"),
        (42 * 60 + 5, "42m"),
        (3 * 3600 + 5 * 60, "3h5m"),
        (20 * 3600, "20h"),
        (76 * 3600, "3d4h"),
        (45 * 86400, "45d"),
        (3 * 365 * 86400 + 86400, "3y1d"),
        (9 * 365 * 86400, "9y"),
    ],
)
def test_eta_is_written_as_kubectl_writes_an_age(seconds: float, text: str) -> None:
    assert duration_text(seconds) == text
