"""On the real control plane: the job client and its CLI against every mistake a user makes (no
cluster, the CRD not installed, no such job, forbidden), each one line and exit 1, never a
traceback; and a job that fails or never ends, followed and waited for by the operator's own
status. The happy path on real trainer pods is test_realnode_client.py.

The CRD is installed cluster-wide in the shared cluster, so "not installed" is asked of the same
API server in two ways: through a kubeconfig whose server URL carries a path the API server
serves nothing at, and as the real answer to a group it does not serve."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import socket
import struct
import subprocess
import sys
import termios
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_run import meshrun
from kubernetes.client import CustomObjectsApi
from kubernetes.client.exceptions import ApiException
from operator_harness import Cluster, OperatorProcess, job_manifest

from meshrun.api.crd import PLURAL, VERSION
from meshrun.api.errors import SpecError
from meshrun.client import JobClient
from meshrun.client.errors import (
    RESOURCE,
    AlreadyExists,
    Forbidden,
    NotFound,
    NotInstalled,
    Request,
    WaitTimeout,
    from_api,
)

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]


def one_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def kubeconfig_copy(kubeconfig: str, path: Path, server: str | None = None, **user: Any) -> str:
    config = yaml.safe_load(Path(kubeconfig).read_text())
    if server is not None:
        config["clusters"][0]["cluster"]["server"] = server
    if user:
        config["users"][0]["user"] = user
    path.write_text(yaml.safe_dump(config))
    return str(path)


def test_each_mistake_is_one_line_and_exit_1(
    cluster: Cluster,
    kubeconfig: str,
    namespace: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    ns = ["-n", namespace]
    # No cluster: a kubeconfig that points at a closed port.
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    nowhere = kubeconfig_copy(kubeconfig, tmp_path / "closed", f"https://127.0.0.1:{port}")
    code, _, err = meshrun(capsys, "list", *ns, "--kubeconfig", nowhere)
    assert code == 1
    assert one_line(err).startswith(
        f"meshrun list: cannot reach the cluster at https://127.0.0.1:{port}"
    )
    assert "Connection refused" in err and "kubectl cluster-info" in err

    # No CRD: the same API server, asked at a path it serves nothing at ...
    server = yaml.safe_load(Path(kubeconfig).read_text())["clusters"][0]["cluster"]["server"]
    elsewhere = kubeconfig_copy(kubeconfig, tmp_path / "prefix", f"{server}/elsewhere")
    code, _, err = meshrun(capsys, "status", "demo", *ns, "--kubeconfig", elsewhere)
    assert code == 1
    assert "does not serve ParallelTrainingJobs (meshrun.dev/v1alpha1): install meshrun first" in (
        one_line(err)
    )
    # ... and its own answer for a group it does not serve, as the client maps it.
    client = JobClient(kubeconfig=kubeconfig, namespace=namespace)
    with pytest.raises(ApiException) as raised:
        CustomObjectsApi(client.connection.api).list_namespaced_custom_object(
            "absent.meshrun.dev", VERSION, namespace, PLURAL
        )
    mapped = from_api(raised.value, Request("list", RESOURCE, None, namespace), server)
    assert isinstance(mapped, NotInstalled) and "does not serve" in str(mapped)

    # No such job, for every command that names one.
    for command in (["status", "nope"], ["logs", "nope"], ["delete", "nope"], ["wait", "nope"]):
        code, _, err = meshrun(capsys, *command, *ns, "--kubeconfig", kubeconfig)
        assert code == 1
        assert one_line(err) == (
            f"meshrun {command[0]}: no job nope in namespace {namespace} "
            f"(meshrun list -n {namespace} lists them)"
        )
    # No such namespace.
    code, _, err = meshrun(
        capsys, "logs", "nope", "-n", f"{namespace}-gone", "--kubeconfig", kubeconfig
    )
    assert code == 1 and "no job nope" in one_line(err)

    # Forbidden: a service account that may read jobs in its namespace and nothing else.
    cluster.kubectl("create", "serviceaccount", "reader", *ns)
    cluster.kubectl(
        "create", "role", "ptj-reader", "--verb=get,list,watch", f"--resource={RESOURCE}", *ns
    )
    cluster.kubectl(
        "create", "rolebinding", "ptj-reader", "--role=ptj-reader",
        f"--serviceaccount={namespace}:reader", *ns,
    )  # fmt: skip
    token = cluster.kubectl("create", "token", "reader", *ns).stdout.strip()
    reader = kubeconfig_copy(kubeconfig, tmp_path / "reader", token=token)
    code, out, err = meshrun(capsys, "list", *ns, "--kubeconfig", reader)
    assert (code, out) == (0, ""), err
    assert err == f"No jobs in namespace {namespace}.\n"
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(job_manifest("denied", runPolicy={"suspend": True})))
    code, _, err = meshrun(capsys, "submit", str(job), *ns, "--kubeconfig", reader)
    assert code == 1
    assert one_line(err) == (
        f"meshrun submit: paralleltrainingjobs.meshrun.dev is forbidden: User "
        f'"system:serviceaccount:{namespace}:reader" cannot create resource '
        f'"paralleltrainingjobs" in API group "meshrun.dev" in the namespace "{namespace}"; '
        f"ask your cluster's admin for access (kubectl auth can-i create {RESOURCE} -n {namespace})"
    )
    code, _, err = meshrun(capsys, "list", "-A", "--kubeconfig", reader)
    assert code == 1 and "cannot list resource" in one_line(err) and f"{RESOURCE} -A)" in err
    with pytest.raises(Forbidden, match="cannot delete resource"):
        JobClient(kubeconfig=reader, namespace=namespace).delete("denied")


def test_a_failed_job_fails_follow_and_wait_with_its_reason(
    cluster: Cluster,
    operator_process: OperatorProcess,
    kubeconfig: str,
    namespace: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    ns = ["-n", namespace, "--kubeconfig", kubeconfig]
    path = tmp_path / "jobs.yaml"
    short = job_manifest("short", runPolicy={"activeDeadlineSeconds": 2})
    path.write_text(yaml.safe_dump(short))
    code, out, err = meshrun(capsys, "submit", str(path), "--follow", *ns)
    assert code == 1, (out, err)
    assert out.startswith(f"job short created in namespace {namespace}\n")
    assert " short Failed [Failed: DeadlineExceeded] " in out
    assert one_line(err).startswith("meshrun submit: job short Failed: DeadlineExceeded: ")
    # Submitted again: it exists, and the user is told how to replace it.
    code, _, err = meshrun(capsys, "submit", str(path), *ns)
    assert code == 1 and one_line(err) == (
        f"meshrun submit: job short already exists in namespace {namespace}: to replace it, "
        f"delete it first (meshrun delete short -n {namespace}), or give the new one another "
        "metadata.name"
    )
    code, out, err = meshrun(capsys, "wait", "short", "--for", "Succeeded", *ns)
    assert code == 1 and one_line(err).startswith(
        "meshrun wait: job short Failed, not Succeeded: DeadlineExceeded"
    )
    code, out, err = meshrun(capsys, "wait", "short", "--for", "Failed", "--timeout", "5s", *ns)
    assert (code, out, err) == (0, "job short Failed\n", "")

    # A job that never ends: the wait gives up when told.
    path.write_text(yaml.safe_dump(job_manifest("held", runPolicy={"suspend": True})))
    assert meshrun(capsys, "submit", str(path), *ns)[0] == 0
    code, _, err = meshrun(capsys, "wait", "held", "--timeout", "1", *ns)
    assert code == 1 and one_line(err).startswith("meshrun wait: timed out after 1 s: job held is ")

    # Both listed; the status as JSON is the object.
    code, out, _ = meshrun(capsys, "list", *ns)
    rows = {line.split()[0]: line.split() for line in out.splitlines()[1:]}
    assert (
        code == 0 and rows["short"][1] == "Failed" and rows["held"][1] in ("Pending", "Suspended")
    )
    code, out, _ = meshrun(capsys, "status", "short", "-o", "json", *ns)
    shown = json.loads(out)
    assert shown["status"]["phase"] == "Failed" and "managedFields" not in shown["metadata"]
    code, out, _ = meshrun(capsys, "status", "short", *ns)
    assert code == 0 and out.startswith(f"short in {namespace}: Failed, attempt 0")
    assert "Conditions" in out and "DeadlineExceeded" in out


def test_in_a_terminal_follow_draws_the_bar(
    cluster: Cluster,
    operator_process: OperatorProcess,
    kubeconfig: str,
    namespace: str,
    tmp_path: Path,
) -> None:
    """The installed script in a pseudo-terminal of 80 columns, as a user's shell runs it."""
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job_manifest("tty", runPolicy={"activeDeadlineSeconds": 3})))
    primary, secondary = pty.openpty()
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    meshrun_script = str(Path(sys.executable).with_name("meshrun"))
    process = subprocess.Popen(
        [meshrun_script, "submit", str(path), "--follow", "-n", namespace, "--kubeconfig",
         kubeconfig],
        stdin=secondary, stdout=secondary, stderr=secondary, env={**env, "TERM": "xterm"},
    )  # fmt: skip
    os.close(secondary)
    shown = b""
    while True:
        try:
            chunk = os.read(primary, 65536)
        except OSError:  # the terminal closed: the process has exited
            break
        if not chunk:
            break
        shown += chunk
    os.close(primary)
    assert process.wait(timeout=60) == 1
    text = shown.decode("utf-8", "replace")
    assert "━" in text and "\x1b[" in text, text  # the bar, drawn and redrawn
    assert "tty Failed [Failed: DeadlineExceeded]" in text
    assert "meshrun submit: job tty Failed: DeadlineExceeded: " in text
    assert "Traceback" not in text


def test_the_python_api_submits_lists_gets_waits_and_deletes(
    cluster: Cluster, kubeconfig: str, namespace: str, tmp_path: Path
) -> None:
    client = JobClient(kubeconfig=kubeconfig, namespace=namespace)
    held = job_manifest("held", runPolicy={"suspend": True})
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job_manifest("from-file", runPolicy={"suspend": True})))
    created = [client.submit(held), client.submit(path)]
    assert [(j.name, j.namespace) for j in created] == [
        ("held", namespace), ("from-file", namespace)
    ]  # fmt: skip
    assert [j.name for j in client.list()] == ["from-file", "held"]
    assert client.get("held").object["spec"]["runPolicy"]["suspend"] is True
    assert client.pod("held", rank=7) == "held-1"  # 2 pods x 4: from the spec, not placed yet
    with pytest.raises(AlreadyExists, match="job held already exists"):
        client.submit(held)
    bad = job_manifest("bad", strategy={"type": "tensor", "tensorParallel": 3})
    with pytest.raises(SpecError, match=r"spec\.strategy\.tensorParallel"):
        client.submit(bad)
    with pytest.raises(NotFound):
        client.get("bad")  # refused before it was sent
    with pytest.raises(WaitTimeout, match=r"timed out after 0\.5 s: job held is Pending"):
        client.wait("held", timeout=0.5, interval=0.1)  # no operator here: no status at all
    client.delete("held")
    with pytest.raises(NotFound, match=f"no job held in namespace {namespace}"):
        client.get("held")
