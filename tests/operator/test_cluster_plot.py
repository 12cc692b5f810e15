"""``meshrun plot NAME``: a job read from the real API server, drawn from its event files, and
the one-line errors when there is no such job or no pod to read the files from."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from operator_harness import Cluster

from meshrun.api.crd import PLURAL
from meshrun.cli.main import main as meshrun_main
from meshrun.cli.plot import cluster_curves
from meshrun.files import events

pytestmark = pytest.mark.cluster

JOB = {
    "apiVersion": "meshrun.dev/v1alpha1",
    "kind": "ParallelTrainingJob",
    "metadata": {"name": "drawn"},
    "spec": {
        "image": "meshrun/trainer:test",
        "resources": {"numNodes": 1, "numProcPerNode": 2, "accelerator": "cpu"},
        "model": {"preset": "tiny"},
        "runPolicy": {"suspend": True},
    },
}


@pytest.mark.timeout(120)
def test_plot_reads_the_job_from_the_cluster(
    cluster: Cluster,
    namespace: str,
    kubeconfig: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("KUBECONFIG", kubeconfig)
    cluster.apply(JOB)
    status = {"status": {"plan": {"layout": "dp2 x pp1 x tp1", "predictedTokensPerSecond": 900}}}
    cluster.kubectl(
        "patch", PLURAL, "drawn", "-n", namespace, "--subresource=status", "--type=merge",
        "-p", json.dumps(status),
    )  # fmt: skip
    logdir = tmp_path / "events"
    writer = events.EventWriter(logdir)
    for step in (1, 2, 3):
        writer.scalars(step, {events.LOSS: 4.0 - step, events.TOKENS_PER_SECOND: 800.0})
    writer.close()

    args = argparse.Namespace(
        source="drawn", namespace=namespace, context=None, kubeconfig=None, logdir=logdir
    )
    title, curves = cluster_curves(args)
    assert title == "drawn (dp2 x pp1 x tp1)"
    assert curves.loss == [(1, 3.0), (2, 2.0), (3, 1.0)]
    assert curves.predicted_tokens_per_second == 900.0, "status.plan's, the files have none"

    picture = tmp_path / "drawn.png"
    code = meshrun_main(
        ["plot", "drawn", "-n", namespace, "--logdir", str(logdir), "-o", str(picture)]
    )
    assert code == 0 and picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # Cluster answers exit 1 with the job client's one line, as the other job commands do.
    assert meshrun_main(["plot", "nosuch", "-n", namespace, "-o", str(picture)]) == 1
    said = capsys.readouterr().err
    assert f"no job nosuch in namespace {namespace}" in said
    assert said.count("\n") == 1 and "Traceback" not in said
    # A suspended job has no pod: where else the files are is said in the same line.
    assert meshrun_main(["plot", "drawn", "-n", namespace, "-o", str(picture)]) == 1
    said = capsys.readouterr().err
    assert "job drawn has no pod drawn-0 now" in said and "give --logdir" in said
