"""On the real control plane: a slow trainer and a stuck API server never stall the operator.

A job whose rank-0 /progress endpoint dribbles bytes does not delay another job's pods; an API
server that stops answering leaves /healthz passing (a restart would not help, and would list
everything again from it) while it reports the job whose reconcile cannot complete, and, once
the API server answers again, the operator carries on by itself.
"""

from __future__ import annotations

import json
import random
import re
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from api_proxy import ApiProxy
from meshrun_operator import names
from operator_harness import FAST_FLAGS, Cluster, OperatorProcess, job_manifest, wait_seconds
from waiting import wait_for

from meshrun.api.crd import PLURAL
from meshrun.envcontract import METRICS_PORT

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

DRIBBLE_SECONDS = 90.0


class DribblingTrainer:
    """Port 9400 on a loopback address of this test alone: answers /progress with headers at
    once, then one byte every 0.2 s for DRIBBLE_SECONDS (each read is quick, the whole is not)."""

    def __init__(self) -> None:
        self.ip = f"127.{random.randint(1, 254)}.{random.randint(1, 254)}.{random.randint(2, 254)}"
        self.listener = socket.create_server((self.ip, METRICS_PORT))
        self.connections = 0
        self.open = 0
        self.lock = threading.Lock()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._dribble, args=(connection,), daemon=True).start()

    def _dribble(self, connection: socket.socket) -> None:
        with self.lock:
            self.connections += 1
            self.open += 1
        try:
            with connection:
                connection.recv(4096)
                connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n")
                deadline = time.monotonic() + DRIBBLE_SECONDS
                while time.monotonic() < deadline:
                    connection.sendall(b" ")
                    time.sleep(0.2)
        except OSError:
            pass
        finally:
            with self.lock:
                self.open -= 1

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def trainer() -> Iterator[DribblingTrainer]:
    server = DribblingTrainer()
    yield server
    server.close()


def health(port: int) -> tuple[int, dict[str, Any]]:
    """The HTTP status of /healthz (0 when nothing answers) and its probes' answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=3) as response:
            return int(response.status), json.loads(response.read())
    except urllib.error.HTTPError as error:
        return int(error.code), {}
    except (OSError, ValueError):
        return 0, {}


def stalled_jobs(port: int) -> int | None:
    """Jobs /healthz reports stalled while it passes; None when it does not pass."""
    code, probes = health(port)
    return int(probes["resync"]["stalledJobs"]) if code == 200 else None


def reconciles(operator: OperatorProcess) -> float:
    """Reconciles the operator completed so far."""
    found = re.search(r"^meshrun_operator_reconcile_seconds_count (\S+)$", operator.metrics(), re.M)
    return float(found.group(1)) if found else 0.0


def one_pod_per_index(cluster: Cluster, job: str, count: int) -> None:
    pods = cluster.live_pods(job)
    assert sorted(p["metadata"]["name"] for p in pods) == [f"{job}-{i}" for i in range(count)]


def assert_cleaned_up(cluster: Cluster, *jobs: str) -> None:
    """Deleting the jobs leaves no pod, Service or NetworkPolicy of theirs behind."""
    for job in jobs:
        cluster.kubectl("delete", PLURAL, job, "-n", cluster.ns, "--wait=true")
    for job in jobs:
        wait_for(
            lambda job=job: not cluster.pods(job) and not children(cluster, job),
            60,
            f"pods, Service and NetworkPolicy of {job} garbage-collected",
        )


def children(cluster: Cluster, job: str) -> list[dict[str, object]]:
    """The Services and NetworkPolicies labelled with ``job``."""
    kinds = "services,networkpolicies"
    where = ["-n", cluster.ns, "-l", names.selector(job), "-o", "json"]
    items: list[dict[str, object]] = json.loads(cluster.kubectl("get", kinds, *where).stdout)[
        "items"
    ]
    return items


def test_a_trainer_whose_progress_dribbles_delays_no_other_job(
    cluster: Cluster,
    kubeconfig: str,
    namespace: str,
    crds_installed: list[str],
    tmp_path: Path,
    trainer: DribblingTrainer,
) -> None:
    flags = [f for f in FAST_FLAGS if f != "--no-progress-http"]
    operator = OperatorProcess(kubeconfig, namespace, tmp_path, flags=flags).start()
    try:
        cluster.apply(job_manifest("slow"))
        cluster.wait_running_pods("slow", 2)
        # Rank 0's pod now has the dribbling trainer's address (KWOK keeps a pod IP once set).
        ip = {"podIP": trainer.ip, "podIPs": [{"ip": trainer.ip}]}
        cluster.kubectl(
            "patch", "pod", "slow-0", "-n", namespace, "--subresource=status",
            "--type=merge", "-p", json.dumps({"status": ip}),
        )  # fmt: skip
        wait_for(lambda: trainer.connections > 0, 30, "the operator reading slow-0's /progress")
        asked = time.monotonic()
        cluster.apply(job_manifest("quick"))
        cluster.wait_running_pods("quick", 2, timeout=30)
        took = time.monotonic() - asked
        print(f"job quick's pods Running {took:.1f} s after it was applied, behind the dribble")
        # The old loop waited for every job's reconcile: the dribble (90 s) held it all.
        assert took < 15, f"job quick's pods took {took:.1f} s behind a dribbling /progress"
        # The read was cut at its deadline, and the pod is left alone for a while after.
        wait_for(lambda: trainer.open == 0, 10, "the operator hanging up on the dribble")
        assert trainer.connections == 1
        for job in ("slow", "quick"):
            cluster.wait_phase(job, "Running")
            for index in range(2):
                cluster.finish(f"{job}-{index}", "Succeeded")
        for job in ("slow", "quick"):
            status = cluster.wait_phase(job, "Succeeded")
            assert status["restarts"] == 0
            one_pod_per_index(cluster, job, 2)
        assert health(operator.health_port)[0] == 200
        # Ended jobs leave the periodic pass: no reconcile (no re-planning) while nothing changes.
        wait_seconds(1)
        before = reconciles(operator)
        wait_seconds(2.5)  # five resync periods
        assert reconciles(operator) == before
        assert_cleaned_up(cluster, "slow", "quick")
    finally:
        operator.stop()
        print(f"--- operator log ---\n{operator.log_tail(60)}")


def test_a_stuck_api_server_is_reported_by_healthz_and_the_operator_recovers(
    cluster: Cluster, kubeconfig: str, namespace: str, crds_installed: list[str], tmp_path: Path
) -> None:
    proxy = ApiProxy(kubeconfig)
    through_proxy = proxy.kubeconfig(tmp_path / "proxied-kubeconfig")
    # A delete that got no answer stays expected until its expectation expires (it may have
    # been carried out): keep that short here.
    extra = ["--api-timeout-seconds", "2", "--stall-seconds", "6"]
    extra += ["--expectations-timeout-seconds", "5"]
    operator = OperatorProcess(through_proxy, namespace, tmp_path, extra=extra).start()
    try:
        cluster.apply(job_manifest("stuck", runPolicy={"activeDeadlineSeconds": 15}))
        cluster.wait_running_pods("stuck", 2)
        cluster.wait_phase("stuck", "Running")
        assert stalled_jobs(operator.health_port) == 0
        # The API server stops answering; when the deadline passes, the reconcile must delete
        # the pods and write the status, and every such request times out.
        proxy.freeze()
        frozen = time.monotonic()
        wait_for(
            lambda: (stalled_jobs(operator.health_port) or 0) >= 1,
            60,
            "/healthz passing and reporting the job whose reconcile cannot complete",
        )
        reported_after = time.monotonic() - frozen
        print(f"/healthz reported the stalled job {reported_after:.1f} s after the freeze")
        assert operator.proc is not None and operator.proc.poll() is None
        assert "reconcile of job" in operator.log_tail(200)  # timed out, said so, went on
        proxy.thaw()
        status = cluster.wait_phase("stuck", "Failed", timeout=60)
        assert cluster.condition("stuck", "Failed")["reason"] == "DeadlineExceeded"
        assert status["restarts"] == 0
        wait_for(lambda: not cluster.live_pods("stuck"), 30, "the unfinished pods deleted")
        wait_for(lambda: stalled_jobs(operator.health_port) == 0, 30, "no stalled job reported")
        # Deadline 15 s after the job started, stall limit 6 s, kopf's probe cache 10 s.
        assert reported_after < 45, f"reported {reported_after:.0f} s after the freeze"
        assert_cleaned_up(cluster, "stuck")
    finally:
        proxy.thaw()
        operator.stop()
        proxy.close()
        print(f"--- operator log ---\n{operator.log_tail(60)}")
