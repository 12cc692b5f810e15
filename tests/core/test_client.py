"""The pure parts of the job client and its CLI: which pod runs a rank, what each error answer of
the API server becomes (one line that says what to do), how a job's status reads, and that
``meshrun submit`` refuses what ``meshrun plan`` refuses, with the same message, before it looks
for a cluster. The same paths against the real API server are in
tests/operator/test_cluster_client.py and tests/operator/test_realnode_client.py."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import urllib3
import yaml
from cli_run import meshrun
from kubernetes.client.exceptions import ApiException
from rich.console import Console
from rich.progress import Progress

from meshrun.cli.jobview import LiveView, jobs_table, status_view
from meshrun.cli.main import build_parser
from meshrun.client import Job, JobClient
from meshrun.client.errors import (
    RESOURCE,
    AlreadyExists,
    Forbidden,
    JobEnded,
    NoCluster,
    NotFound,
    NotInstalled,
    Refused,
    Request,
    from_api,
    from_no_answer,
)
from meshrun.client.ranks import pod_of_index, pod_of_rank

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 1, 2, 3, 10, 0, tzinfo=UTC)
SERVER = "https://127.0.0.1:6443"


def job(status: dict[str, Any] | None = None, **resources: int) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "llm",
            "namespace": "team",
            "creationTimestamp": "2026-01-02T03:04:30Z",
        },
        "spec": {"resources": {"numNodes": 2, "numProcPerNode": 4, **resources}},
        "status": status or {},
    }


PLACED = {
    "worldSize": 8,
    "placement": [
        {
            "pod": "llm-0",
            "node": "a",
            "firstRank": 0,
            "lastRank": 3,
            "stage": 0,
            "phase": "Running",
        },
        {
            "pod": "llm-1",
            "node": "b",
            "firstRank": 4,
            "lastRank": 7,
            "stage": 1,
            "phase": "Running",
        },
    ],
}


@pytest.mark.parametrize(
    ("status", "rank", "pod"),
    [
        (PLACED, 0, "llm-0"),
        (PLACED, 3, "llm-0"),
        (PLACED, 4, "llm-1"),
        (PLACED, 7, "llm-1"),
        # A run of 128 pods of 4 ranks in one row (a job beyond 512 pods).
        (
            {
                "worldSize": 2048,
                "placement": [
                    {"pods": "0-127", "count": 128, "firstRank": 0, "lastRank": 511},
                    {"pods": "128-511", "count": 384, "firstRank": 512, "lastRank": 2047},
                ],
            },
            517,
            "llm-129",
        ),
        # Planned, no pods yet: consecutive ranks share a pod, numProcPerNode of them.
        ({"plan": {"worldSize": 8}}, 5, "llm-1"),
    ],
)
def test_a_rank_is_found_in_the_placement(status: dict[str, Any], rank: int, pod: str) -> None:
    assert pod_of_rank(job(status), rank) == pod


def test_a_rank_or_a_pod_the_job_does_not_have_is_refused_with_its_range() -> None:
    with pytest.raises(NotFound, match="job llm has ranks 0 to 7, not 8"):
        pod_of_rank(job(PLACED), 8)
    # Before the operator's first status: the spec's pods times processes per pod.
    assert pod_of_rank(job({}), 5) == "llm-1"
    with pytest.raises(NotFound, match="not planned yet"):
        pod_of_rank({"metadata": {"name": "llm"}}, 0)
    with pytest.raises(NotFound, match=r"job llm has no pod 2 \(it has pods 0 to 1\)"):
        pod_of_index(job(PLACED), 2)
    assert pod_of_index(job(PLACED), 1) == "llm-1"
    # An elastic job shrunk to one pod of four processes.
    assert pod_of_index(job({"worldSize": 4}), 0) == "llm-0"
    with pytest.raises(NotFound):
        pod_of_index(job({"worldSize": 4}), 1)


def answer(status: int, body: dict[str, Any] | str, reason: str = "") -> ApiException:
    """The kubernetes package's own exception for an error answer of the API server."""
    text = body if isinstance(body, str) else json.dumps({"kind": "Status", **body})
    return ApiException(status=status, reason=reason, body=text)


LIST = Request("list", RESOURCE, None, "team")
GET = Request("get", RESOURCE, "llm", "team", "llm")
CREATE = Request("create", RESOURCE, "llm", "team")


@pytest.mark.parametrize(
    ("error", "request_", "kind", "line"),
    [
        (
            answer(
                403,
                {
                    "reason": "Forbidden",
                    "message": 'paralleltrainingjobs.meshrun.dev is forbidden: User "bob" cannot '
                    'list resource "paralleltrainingjobs" in API group "meshrun.dev" in the '
                    'namespace "team"',
                },
            ),
            LIST,
            Forbidden,
            'User "bob" cannot list resource "paralleltrainingjobs" in API group "meshrun.dev" in '
            'the namespace "team"; ask your cluster\'s admin for access (kubectl auth can-i list '
            "paralleltrainingjobs.meshrun.dev -n team)",
        ),
        (answer(401, {"reason": "Unauthorized"}), LIST, Forbidden, "refused your credentials"),
        (
            answer(
                404,
                {
                    "reason": "NotFound",
                    "message": 'paralleltrainingjobs.meshrun.dev "llm" not found',
                    "details": {
                        "name": "llm",
                        "group": "meshrun.dev",
                        "kind": "paralleltrainingjobs",
                    },
                },
            ),
            GET,
            NotFound,
            "no job llm in namespace team (meshrun list -n team lists them)",
        ),
        # What the API server answers for a group it does not serve: no details.
        (
            answer(
                404,
                {
                    "reason": "NotFound",
                    "message": "the server could not find the requested resource",
                },
            ),
            LIST,
            NotInstalled,
            f"the cluster at {SERVER} does not serve ParallelTrainingJobs (meshrun.dev/v1alpha1): "
            "install meshrun first",
        ),
        (answer(404, "404 page not found"), GET, NotInstalled, "does not serve"),
        (
            answer(
                404,
                {
                    "reason": "NotFound",
                    "message": 'namespaces "team" not found',
                    "details": {"name": "team", "kind": "namespaces"},
                },
            ),
            CREATE,
            NotFound,
            "namespace team not found (kubectl get namespaces lists them)",
        ),
        (
            answer(
                409,
                {
                    "reason": "AlreadyExists",
                    "message": "already exists",
                    "details": {"name": "llm"},
                },
            ),
            CREATE,
            AlreadyExists,
            "job llm already exists in namespace team: to replace it, delete it first "
            "(meshrun delete llm -n team)",
        ),
        (
            answer(
                400,
                {
                    "reason": "BadRequest",
                    "message": 'previous terminated container "trainer" in pod "llm-1" not found',
                },
            ),
            Request("get", "pods/log", "llm-1", "team", "llm"),
            Refused,
            'previous terminated container "trainer" in pod "llm-1" not found (meshrun status '
            "llm shows the job's pods)",
        ),
        (
            answer(500, {"reason": "InternalError", "message": "etcdserver: timeout"}),
            GET,
            Refused,
            "the API server refused to get job llm in namespace team: InternalError: "
            "etcdserver: timeout",
        ),
    ],
)
def test_each_error_answer_is_one_line_saying_what_to_do(
    error: ApiException, request_: Request, kind: type[Exception], line: str
) -> None:
    found = from_api(error, request_, SERVER)
    assert type(found) is kind
    assert line in str(found)
    assert "\n" not in str(found)


def test_no_answer_says_which_server_and_how_to_check() -> None:
    """A real refused connection, as urllib3 raises it inside the kubernetes package."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    pool = urllib3.PoolManager(retries=0)
    with pytest.raises(urllib3.exceptions.HTTPError) as raised:
        pool.request("GET", f"http://127.0.0.1:{port}/api")
    found = from_no_answer(raised.value, f"https://127.0.0.1:{port}", "kind-dev")
    assert isinstance(found, NoCluster)
    assert str(found).startswith(f"cannot reach the cluster at https://127.0.0.1:{port} ")
    assert "(context kind-dev): " in str(found) and "Connection refused" in str(found)
    assert "HTTPConnection object" not in str(found)
    assert "kubectl cluster-info" in str(found)


RUNNING = {
    "phase": "Running",
    "attempt": 1,
    "restarts": 1,
    "message": "Every pod runs.",
    "layout": "dp2 x pp2 x tp2",
    "worldSize": 8,
    "plan": {
        "strategy": "hybrid",
        "layout": "dp2 x pp2 x tp2",
        "worldSize": 8,
        "gpus": 8,
        "microBatchSize": 2,
        "predictedTokensPerSecond": 130000.0,
        "memory": {"perGpuBytes": {"total": 53 * 2**30}, "acceleratorBytes": 80 * 2**30},
    },
    "progress": {"step": 3, "totalSteps": 10, "loss": 2.302585, "stepTimeSeconds": 0.5},
    "display": {
        "step": "3/10",
        "progress": "30%",
        "loss": "2.303",
        "tokensPerSecond": "123k",
        "predictedTokensPerSecond": "130k",
        "eta": "3m30s",
    },
    "conditions": [
        {
            "type": "Scheduled",
            "status": "True",
            "reason": "AllPodsBound",
            "lastTransitionTime": "2026-01-02T03:05:00Z",
        },
        {
            "type": "Running",
            "status": "True",
            "reason": "AllPodsRunning",
            "message": "2 pods run",
            "lastTransitionTime": "2026-01-02T03:08:00Z",
        },
    ],
    "lastFailure": {
        "pod": "llm-1",
        "reason": "OOMKilled",
        "message": "the trainer ran out of memory",
        "class": "Retryable",
        "exitCode": 137,
        "time": "2026-01-02T03:07:00Z",
    },
    **PLACED,
}


def test_status_reads_the_plan_progress_restarts_last_failure_conditions_and_pods() -> None:
    console = Console(width=100, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(status_view(Job(job(RUNNING)), NOW))
    text = console.export_text()
    lines = [line.rstrip() for line in text.splitlines()]
    assert lines[0] == "llm in team: Running, attempt 1, 1 restart, age 5m30s"
    said = " ".join(text.split())  # a long line wraps at the width, between words
    assert "Plan: hybrid dp2 x pp2 x tp2, 8 processes on 8 GPUs, micro-batch 2, predicted " \
        "130k tokens/s, 53.00 GiB of 80.00 GiB per GPU (estimate) Progress:" in said  # fmt: skip
    assert "Progress: step 3/10 (30%), loss 2.303, 123k tokens/s of 130k predicted, 0.5 " \
        "s/step, ETA 3m30s" in lines  # fmt: skip
    assert "Last failure: pod llm-1 OOMKilled (Retryable, exit code 137, 3m ago): the trainer " \
        "ran out of memory" in lines  # fmt: skip
    assert any(line.split()[:4] == ["Running", "True", "AllPodsRunning", "2m"] for line in lines)
    assert any(line.split() == ["llm-1", "b", "4-7", "1", "Running"] for line in lines), text
    assert max(len(line) for line in lines) <= 100


def test_list_is_kubectls_table_with_nothing_cut() -> None:
    pending = job({"phase": "Pending"})
    pending["metadata"]["name"] = "a-job-with-a-rather-long-name"
    text = jobs_table([Job(job(RUNNING)), Job(pending)], NOW)
    header, *lines = text.splitlines()
    starts = [header.index(name) for name in header.split()]
    cells = [
        [line[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]
        for line in lines
    ]
    assert header.split() == [
        "NAME", "PHASE", "LAYOUT", "PROCS", "STEP", "PROGRESS", "LOSS", "TOKENS/S", "ETA",
        "RESTARTS", "AGE",
    ]  # fmt: skip
    assert cells == [
        ["llm", "Running", "dp2 x pp2 x tp2", "8", "3/10", "30%", "2.303", "123k", "3m30s", "1",
         "5m30s"],
        ["a-job-with-a-rather-long-name", "Pending", "", "", "", "", "", "", "", "0", "5m30s"],
    ]  # fmt: skip
    done = job({**RUNNING, "phase": "Succeeded"})
    done["status"]["display"] = {**done["status"]["display"], "eta": "0s"}
    assert jobs_table([Job(done)], NOW).splitlines()[1].split()[-3:] == ["123k", "1", "5m30s"]


def test_the_live_view_shows_the_bar_and_a_line_per_change() -> None:
    console = Console(width=200, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    with Progress(*LiveView.columns(), console=console, auto_refresh=False) as progress:
        view = LiveView(progress)
        view.show(Job(job({"phase": "Pending"})))
        view.show(Job(job(RUNNING)))
        view.show(Job(job(RUNNING)))  # no change: no new line
        task = progress.tasks[0]
        assert (task.completed, task.total) == (3, 10)
        assert task.fields["detail"] == (
            "step 3/10 (30%), loss 2.303, 123k tokens/s of 130k predicted, 0.5 s/step, "
            "ETA 3m30s, restarts 1, Running: AllPodsRunning"
        )
    text = console.export_text()
    said = [line for line in text.splitlines() if line[:2].isdigit()]
    assert [line.split(" ", 1)[1] for line in said] == [
        "llm Pending",
        "llm Running [Running: AllPodsRunning] 2 pods run",
    ]


def test_submit_refuses_what_plan_refuses_with_the_same_message_before_any_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # No cluster at all: planning comes first.
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    bad = yaml.safe_load((ROOT / "examples" / "ddp.yaml").read_text())
    bad["spec"]["strategy"] = {"type": "tensor", "tensorParallel": 3}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    plan_code, _, plan_err = meshrun(capsys, "plan", str(path))
    code, out, err = meshrun(capsys, "submit", str(path))
    assert (code, plan_code) == (2, 2)
    assert err.removeprefix("meshrun submit: ") == plan_err.removeprefix("meshrun plan: ")
    assert "spec.strategy.tensorParallel" in err and out == ""
    # A valid job, no kubeconfig: one line, exit 1.
    code, out, err = meshrun(capsys, "submit", str(ROOT / "examples" / "ddp.yaml"))
    assert (
        code == 1
        and err.startswith("meshrun submit: no kubeconfig at ")
        and "\n" not in (err.rstrip("\n"))
    )
    code, _, err = meshrun(capsys, "wait", "llm", "--timeout", "soon")
    assert code == 2 and "'soon' is not a duration" in err
    code, _, err = meshrun(capsys, "logs", "llm", "--pod", "1", "--rank", "2")
    assert code == 2 and "not allowed with argument" in err


def test_submit_names_a_file_it_cannot_read_once_as_plan_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    absent = tmp_path / "absent.yaml"
    plan_code, _, plan_err = meshrun(capsys, "plan", str(absent))
    code, out, err = meshrun(capsys, "submit", str(absent))
    assert (code, plan_code, out) == (2, 2, "")
    assert err == f"meshrun submit: {absent}: cannot be read (No such file or directory)\n"
    assert err.removeprefix("meshrun submit: ") == plan_err.removeprefix("meshrun plan: ")


def test_logs_tail_is_kubectls_minus_one_for_all_and_refuses_less_before_any_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    parse = build_parser().parse_args
    assert parse(["logs", "llm", "--tail", "-1"]).tail is None
    assert parse(["logs", "llm", "--tail", "0"]).tail == 0
    assert parse(["logs", "llm", "--tail", "20"]).tail == 20
    code, out, err = meshrun(capsys, "logs", "llm", "--tail", "-5")
    assert (code, out) == (2, "")
    assert "argument --tail: must be 0 or more lines, or -1 for all, got -5" in err
    code, _, err = meshrun(capsys, "logs", "llm", "--tail", "ten")
    assert code == 2 and "argument --tail: 'ten' is not a number of lines" in err


def test_the_help_names_the_phases_and_the_job_and_shows_examples(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # one line per flag
    code, out, _ = meshrun(capsys, "wait", "--help")
    assert code == 0
    assert (
        "the phase to wait for: Pending, Running, Restarting, Suspended, Succeeded, Failed "
        "(default: Succeeded)"
    ) in out
    for command in ("status", "logs", "wait", "delete"):
        code, out, _ = meshrun(capsys, command, "--help")
        assert code == 0 and "the job (its metadata.name)" in out, command
    code, out, _ = meshrun(capsys, "--help")
    assert code == 0
    examples = out.split("examples:\n", 1)[1]
    assert "meshrun submit job.yaml --follow" in examples
    assert "'meshrun COMMAND --help' gives a command's flags." in examples


def test_plot_takes_kubeconfig_as_the_other_job_commands_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    absent = tmp_path / "none"
    for command in ("status", "plot"):
        code, out, err = meshrun(capsys, command, "llm", "--kubeconfig", str(absent))
        assert (code, out) == (1, ""), command
        assert err.startswith(f"meshrun {command}: no kubeconfig at {absent}: "), command


def test_without_the_client_extra_the_job_commands_say_how_to_install_it() -> None:
    probe = (
        "import sys\n"
        "sys.modules['kubernetes'] = None  # not installed\n"
        "from meshrun.cli.main import main\n"
        "sys.exit(main(['list']))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 1
    assert result.stderr.startswith(
        "meshrun list: needs the client extra (pip install 'meshrun[client]'): "
    )
    assert len(result.stderr.splitlines()) == 1


def kubeconfig(path: Path, current: str | None, **namespaces: str | None) -> str:
    """A kubeconfig of one context per keyword (its namespace, None for none), each its own
    server; nothing is contacted."""
    contexts = [
        {"name": name, "context": {"cluster": name, "user": "me"}}
        | ({"context": {"cluster": name, "user": "me", "namespace": ns}} if ns else {})
        for name, ns in namespaces.items()
    ]
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": name, "cluster": {"server": f"https://{name}.example:6443"}}
            for name in namespaces
        ],
        "users": [{"name": "me", "user": {"token": "t"}}],
        "contexts": contexts,
    }
    if current:
        config["current-context"] = current
    path.write_text(yaml.safe_dump(config))
    return str(path)


def test_the_cluster_and_namespace_are_kubectls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from meshrun.client.connection import connect

    # KUBECONFIG lists two files, merged: the first names the current context.
    first = kubeconfig(tmp_path / "a", "prod", prod="team-a")
    second = kubeconfig(tmp_path / "b", None, dev=None)
    monkeypatch.setenv("KUBECONFIG", f"{first}:{second}")
    found = connect()
    assert (found.context, found.namespace, found.server) == (
        "prod", "team-a", "https://prod.example:6443"
    )  # fmt: skip
    assert connect(namespace="x").namespace == "x"
    dev = connect(context="dev")
    assert (dev.context, dev.namespace, dev.server) == (
        "dev",
        "default",
        "https://dev.example:6443",
    )
    with pytest.raises(NoCluster, match=r"no context 'qa' in .* \(it has: dev, prod; kubectl"):
        connect(context="qa")
    # --kubeconfig wins over KUBECONFIG.
    assert connect(kubeconfig=second, context="dev").server == "https://dev.example:6443"
    with pytest.raises(NoCluster, match="current-context"):
        connect(kubeconfig=second)


def test_in_a_pod_without_a_kubeconfig_the_service_account(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kubernetes.config import incluster_config

    from meshrun.client import connection

    (tmp_path / "token").write_text("abc")
    (tmp_path / "ca.crt").write_text("not checked until a request")
    (tmp_path / "namespace").write_text("team-b\n")
    monkeypatch.setattr(incluster_config, "SERVICE_TOKEN_FILENAME", str(tmp_path / "token"))
    monkeypatch.setattr(incluster_config, "SERVICE_CERT_FILENAME", str(tmp_path / "ca.crt"))
    monkeypatch.setattr(connection, "SERVICE_ACCOUNT_NAMESPACE", tmp_path / "namespace")
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    with pytest.raises(NoCluster, match="no kubeconfig at"):
        connection.connect()
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    found = connection.connect()
    assert (found.context, found.namespace, found.server) == (
        None,
        "team-b",
        "https://10.0.0.1:443",
    )
    monkeypatch.setenv("POD_NAMESPACE", "team-c")
    assert connection.connect().namespace == "team-c"
    assert connection.connect(namespace="x").namespace == "x"


def test_a_job_naming_another_namespace_than_asked_is_refused_as_kubectl_does() -> None:
    from kubernetes.client import ApiClient, Configuration

    from meshrun.client import JobClient
    from meshrun.client.connection import Connection
    from meshrun.client.errors import ClientError

    nowhere = Connection(ApiClient(Configuration()), "team", None, "https://nowhere.example")
    manifest = {"metadata": {"name": "llm", "namespace": "other"}, "spec": {}}
    with pytest.raises(ClientError, match="job llm names namespace other, not team: pass -n other"):
        JobClient(namespace="team", connection=nowhere).create(manifest)


def test_a_wait_that_ends_in_another_phase_names_the_one_it_waited_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    condition = {"type": "Succeeded", "status": "True", "reason": "Completed", "message": "done"}
    done = Job(
        {"metadata": {"name": "j"}, "status": {"phase": "Succeeded", "conditions": [condition]}}
    )
    client = object.__new__(JobClient)
    monkeypatch.setattr(client, "watch", lambda name, timeout, interval: iter([done]))
    with pytest.raises(JobEnded) as ended:
        client.wait("j", ("Failed",))
    assert str(ended.value) == "job j Succeeded, not Failed: Completed: done"
    assert client.wait("j", ("Succeeded",)) is done
