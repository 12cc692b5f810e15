"""On the real control plane: ``kubectl get ptj`` as a user reads it, from the status the
operator writes (the layout with its expert-parallel degree, the step of the total, the share
done, loss, tokens/s, ETA; ``-o wide`` adds the restarts and the predicted tokens/s)."""

from __future__ import annotations

import json
import re

import pytest
from meshrun_operator import names
from operator_factories import REPORT_3_OF_10
from operator_harness import Cluster, OperatorProcess, job_manifest
from waiting import wait_for

from meshrun.api.display import rate_text

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

COLUMNS = ["NAME", "STRATEGY", "LAYOUT", "PROCS", "PHASE"]
PROGRESS = ["STEP", "PROGRESS", "LOSS", "TOKENS/S"]


def rows(text: str) -> tuple[list[str], dict[str, dict[str, str]]]:
    """kubectl's table: the column names, and each row by name, cut where the header's names
    start (a cell may be blank or hold spaces, as a layout does)."""
    header, *lines = text.splitlines()
    starts = [m.start() for m in re.finditer(r"\S+(?: \S+)*", header)]
    bounds = list(zip(starts, [*starts[1:], None], strict=True))
    columns = [header[a:b].strip() for a, b in bounds]
    table = {}
    for line in lines:
        row = dict(zip(columns, (line[a:b].strip() for a, b in bounds), strict=True))
        table[row["NAME"]] = row
    return columns, table


def test_kubectl_get_shows_the_progress_and_wide_the_restarts_and_the_prediction(
    cluster: Cluster, operator_process: OperatorProcess
) -> None:
    cluster.apply(job_manifest("gpu"))
    cpu = {"numNodes": 2, "numProcPerNode": 4, "accelerator": "cpu"}
    experts = {
        "model": {"preset": "tiny", "moe": {"experts": 8}},
        "strategy": {"type": "ddp", "expertParallel": 2},
    }
    cluster.apply(job_manifest("cpu", resources=cpu, runPolicy={"suspend": True}, **experts))
    cluster.wait_running_pods("gpu", 2)
    cluster.annotate("pod", "gpu-0", f"{names.ANNOTATION_PROGRESS}={json.dumps(REPORT_3_OF_10)}")
    wait_for(
        lambda: (cluster.status("gpu").get("display") or {}).get("step") == "3/10",
        30,
        "status.display.step 3/10",
    )
    wait_for(lambda: cluster.status("cpu").get("worldSize") == 8, 30, "the CPU job's worldSize")

    text = cluster.kubectl("get", "ptj", "-n", cluster.ns).stdout
    columns, table = rows(text)
    assert columns == [*COLUMNS, *PROGRESS, "ETA", "AGE"], text
    gpu, cpu_row = table["gpu"], table["cpu"]
    assert {k: gpu[k] for k in columns[1:-1]} == {
        "STRATEGY": "ddp",
        "LAYOUT": "dp8 x pp1 x tp1",
        "PROCS": "8",
        "PHASE": "Running",
        "STEP": "3/10",
        "PROGRESS": "30%",
        "LOSS": "2.303",
        "TOKENS/S": "123k",
        "ETA": "3m30s",
    }, text
    # A CPU job's processes count; a job that reported nothing shows blank cells; an expert
    # parallel degree follows the layout.
    assert (cpu_row["PROCS"], cpu_row["PHASE"], cpu_row["STEP"]) == ("8", "Suspended", ""), text
    assert cpu_row["LAYOUT"] == "dp8 x pp1 x tp1 (ep2)", text
    assert "2.302585" not in text and "e+05" not in text, "a number printed in full"

    wide = cluster.kubectl("get", "ptj", "-n", cluster.ns, "-o", "wide").stdout
    columns, table = rows(wide)
    assert columns == [*COLUMNS, "RESTARTS", *PROGRESS, "PREDICTED TOKENS/S", "ETA", "AGE"]
    predicted = cluster.status("gpu")["progress"]["predictedTokensPerSecond"]
    gpu = table["gpu"]
    assert (gpu["RESTARTS"], gpu["PREDICTED TOKENS/S"]) == ("0", rate_text(predicted)), wide
    assert (table["cpu"]["RESTARTS"], table["cpu"]["PREDICTED TOKENS/S"]) == ("0", ""), wide
