"""On the real node: a user's day one with the client. ``meshrun submit --follow`` (the installed
script, as a user runs it) plans a job of two real trainer pods, creates it and follows it to
Succeeded; ``meshrun logs --rank`` prints what kubectl prints for the pod that runs the rank;
``meshrun wait`` and the Python API agree; ``meshrun delete`` removes it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from cli_run import meshrun
from operator_harness import FAST_FLAGS, Cluster, OperatorProcess, job_manifest

from meshrun.client import JobClient
from meshrun.client.errors import JobEnded, NotFound

# Covers set-up too: after a trainer change the image is built and imported first (12.5 min here
# cold); the test itself takes about a minute.
pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(1800)]

REAL_NODE = "meshrun.dev/real-node"
NAME, STEPS = "client-demo", 12
MESHRUN = str(Path(sys.executable).with_name("meshrun"))


def job(image: str) -> dict[str, object]:
    """Two pods of one CPU process each (DDP), a tiny model for a few steps, on the real node."""
    return job_manifest(
        NAME,
        image=image,
        resources={"numNodes": 2, "numProcPerNode": 1, "accelerator": "cpu"},
        strategy={"type": "ddp"},
        training={
            "steps": STEPS,
            "globalBatchSize": 4,
            "microBatchSize": 1,
            "precision": "fp32",
            "dataset": "synthetic",
        },
        podTemplate={
            "spec": {
                "nodeSelector": {REAL_NODE: "true"},
                "tolerations": [
                    {"key": REAL_NODE, "operator": "Equal", "value": "true", "effect": "NoSchedule"}
                ],
                "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "trainer", "imagePullPolicy": "Never"}],
            }
        },
    )


def test_submit_follow_logs_of_a_rank_wait_and_delete(
    cluster: Cluster,
    real_node: str,
    trainer_image: str,
    kubeconfig: str,
    namespace: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job(trainer_image)))
    flags = [f for f in FAST_FLAGS if f != "--no-progress-http"]
    operator = OperatorProcess(kubeconfig, namespace, tmp_path, flags=flags).start()
    ns = ["-n", namespace, "--kubeconfig", kubeconfig]
    try:
        followed = subprocess.run(
            [MESHRUN, "submit", str(path), "--follow", *ns],
            capture_output=True,
            text=True,
            timeout=600,
        )
        with capsys.disabled():
            print(followed.stdout)  # what the user sees (pytest -s shows it)
        assert followed.returncode == 0, (followed.stdout, followed.stderr)
        said = followed.stdout.splitlines()
        assert said[0] == f"job {NAME} created in namespace {namespace}"
        phases = [line.split()[2] for line in said if line[:2].isdigit()]
        assert phases[-1] == "Succeeded" and "Running" in phases, followed.stdout
        client = JobClient(kubeconfig=kubeconfig, namespace=namespace)
        done = client.wait(NAME, timeout=10)
        assert done.phase == "Succeeded" and done.progress["step"] == STEPS
        loss = done.status["display"]["loss"]
        assert said[-1].startswith(
            f"job {NAME} Succeeded: step {STEPS}/{STEPS} (100%), loss {loss}"
        )

        # Each rank's log is its pod's, as kubectl prints it.
        logs = {}
        for rank in (0, 1):
            code, out, err = meshrun(capsys, "logs", NAME, "--rank", str(rank), *ns)
            expected = cluster.kubectl("logs", f"{NAME}-{rank}", "-n", namespace).stdout
            assert (code, err) == (0, "") and out == expected, rank
            logs[rank] = out
        assert meshrun(capsys, "logs", NAME, "--pod", "1", *ns)[1] == logs[1]
        # Followed, a finished container's log is all of it, and the stream ends.
        assert meshrun(capsys, "logs", NAME, "--rank", "0", "--follow", *ns)[1] == logs[0]
        assert (
            meshrun(capsys, "logs", NAME, "--tail", "2", *ns)[1].splitlines()
            == (logs[0].splitlines()[-2:])
        )
        assert list(client.logs(NAME, rank=1)) == logs[1].splitlines()
        # Rank 0 reports the steps and the summary; its final loss is the job's.
        events = [json.loads(line) for line in logs[0].splitlines() if line.startswith("{")]
        steps = [e["step"] for e in events if e.get("event") == "step"]
        summary = next(e for e in events if e.get("event") == "summary")
        assert steps[-1] == STEPS and summary["finalLoss"] == pytest.approx(done.progress["loss"])
        assert '"event": "summary"' not in logs[1]
        code, _, err = meshrun(capsys, "logs", NAME, "--rank", "2", *ns)
        assert code == 1 and err == f"meshrun logs: job {NAME} has ranks 0 to 1, not 2\n"
        code, _, err = meshrun(capsys, "logs", NAME, "--previous", *ns)
        assert code == 1 and "previous terminated container" in err and "\n" not in err[:-1]

        code, out, _ = meshrun(capsys, "wait", NAME, "--for", "Succeeded", "--timeout", "30", *ns)
        assert (code, out) == (0, f"job {NAME} Succeeded\n")
        ended = f"job {NAME} Succeeded, not Failed: Completed: all 2 pods"
        with pytest.raises(JobEnded, match=ended):
            client.wait(NAME, ("Failed",), timeout=10)
        code, out, _ = meshrun(capsys, "status", NAME, *ns)
        with capsys.disabled():
            print(out)
        said = " ".join(out.split())  # the lines wrap at the terminal's width (80 piped)
        assert said.startswith(f"{NAME} in {namespace}: Succeeded, attempt 0, 0 restarts")
        assert f"Progress: step {STEPS}/{STEPS} (100%), loss {loss}" in said
        assert f"{NAME}-1 {real_node} 1 0 Succeeded" in said

        code, out, _ = meshrun(capsys, "delete", NAME, *ns)
        assert (code, out) == (0, f"job {NAME} deleted from namespace {namespace}\n")
        with pytest.raises(NotFound):
            client.get(NAME)
    finally:
        operator.stop()
