"""On the real control plane: two operators with leader election, only the Lease holder acts.

A leader frozen in place (SIGSTOP: a partitioned node, a paused VM) while a pod fails is
replaced within the lease duration, the standby restarts the gang once, and the old leader,
when it wakes up, writes nothing; a leader killed outright is replaced the
same way; a leader stopped cleanly hands the Lease over at once.
"""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path

import pytest
from operator_harness import Cluster, OperatorProcess, job_manifest, wait_seconds
from test_cluster_stalls import assert_cleaned_up, one_pod_per_index
from waiting import wait_for

from meshrun.api.crd import PLURAL

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

LEASE_SECONDS = 4.0
RENEW_DEADLINE = 3.0
RETRY = 0.5


def elected(kubeconfig: str, namespace: str, tmp_path: Path, name: str) -> OperatorProcess:
    flags = [
        "--leader-election",
        "--leader-election-namespace", namespace,
        "--leader-election-lease", "meshrun-test",
        "--lease-duration-seconds", str(LEASE_SECONDS),
        "--lease-renew-deadline-seconds", str(RENEW_DEADLINE),
        "--lease-retry-seconds", str(RETRY),
    ]  # fmt: skip
    return OperatorProcess(kubeconfig, namespace, tmp_path, extra=flags, name=name).start()


def leads(operator: OperatorProcess) -> bool:
    return re.search(r"^meshrun_operator_leader 1\.0$", operator.metrics(), re.M) is not None


def writes(operator: OperatorProcess) -> float:
    """Writes this operator sent to the API server, its Lease excepted."""
    total = 0.0
    for resource, verb, value in re.findall(
        r'^meshrun_operator_api_requests_total\{resource="([^"]+)",verb="([^"]+)"\} (\S+)$',
        operator.metrics(),
        re.M,
    ):
        if verb in ("create", "delete", "patch", "update") and resource != "leases":
            total += float(value)
    return total


def takeover(standby: OperatorProcess, since: float, what: str) -> float:
    wait_for(lambda: leads(standby), 30, f"{standby.log_path.stem} to take the lease ({what})")
    return time.monotonic() - since


def test_only_the_lease_holder_acts_and_a_standby_takes_over(
    cluster: Cluster, kubeconfig: str, namespace: str, crds_installed: list[str], tmp_path: Path
) -> None:
    a = elected(kubeconfig, namespace, tmp_path, "a")
    b: OperatorProcess | None = None
    try:
        wait_for(lambda: leads(a), 30, "operator a to take the free lease")
        b = elected(kubeconfig, namespace, tmp_path, "b")
        cluster.apply(job_manifest("gang"))
        cluster.wait_running_pods("gang", 2)
        cluster.wait_phase("gang", "Running")
        assert not leads(b) and writes(b) == 0, "the standby acted"
        assert writes(a) > 0
        holder = "jsonpath={.spec.holderIdentity}"
        lease = cluster.kubectl("get", "lease", "meshrun-test", "-n", namespace, "-o", holder)
        assert lease.stdout.strip(), "the Lease names its holder"

        # The leader freezes (its node lost the network) and a pod fails while it is frozen:
        # b takes over once the lease ran out and restarts the gang.
        assert a.proc is not None
        before = writes(a)
        a.proc.send_signal(signal.SIGSTOP)
        frozen = time.monotonic()
        cluster.finish("gang-1", "Failed", exit_code=1)
        took = takeover(b, frozen, "a frozen")
        print(f"takeover after the leader froze: {took:.1f} s")
        assert took < LEASE_SECONDS + 4 * RETRY + 5, f"takeover took {took:.1f} s"
        wait_for(lambda: cluster.status("gang").get("restarts") == 1, 60, "b restarting gang")
        restarted = {p["metadata"]["uid"] for p in cluster.wait_running_pods("gang", 2, attempt=1)}
        # a wakes up past its lease, with the failed pod's events waiting in its watch: it must
        # notice it no longer leads before writing anything (no second restart, no pods).
        a.proc.send_signal(signal.SIGCONT)
        cluster.apply(job_manifest("after"))
        cluster.wait_running_pods("after", 2)
        wait_seconds(3 * RETRY + 1)
        assert writes(a) == before, "the old leader wrote after it lost the lease"
        assert not leads(a) and leads(b)
        assert cluster.status("gang")["restarts"] == 1, "the gang was restarted twice"
        live = cluster.live_pods("gang")
        assert {p["metadata"]["uid"] for p in live} == restarted, "a second set of pods"

        # The leader dies without a word: a takes over within the lease duration.
        b.kill()
        took = takeover(a, time.monotonic(), "b killed")
        print(f"takeover after the leader was killed: {took:.1f} s")
        assert took < LEASE_SECONDS + 4 * RETRY + 5, f"takeover took {took:.1f} s"
        for job in ("gang", "after"):
            for index in range(2):
                cluster.finish(f"{job}-{index}", "Succeeded")
        assert cluster.wait_phase("gang", "Succeeded")["restarts"] == 1
        assert cluster.wait_phase("after", "Succeeded")["restarts"] == 0
        for job in ("gang", "after"):
            one_pod_per_index(cluster, job, 2)

        # A clean stop hands the lease over at once (no wait for it to run out).
        b = elected(kubeconfig, namespace, tmp_path, "b2")
        stopped = time.monotonic()
        a.stop()
        took = takeover(b, stopped, "a stopped")
        print(f"takeover after a clean stop: {took:.1f} s")
        assert took < LEASE_SECONDS, f"takeover after a clean stop took {took:.1f} s"
        assert_cleaned_up(cluster, "gang", "after")
        assert cluster.kubectl("get", PLURAL, "-n", namespace, "-o", "name").stdout == ""
    finally:
        if a.proc is not None and a.proc.poll() is None:
            a.proc.send_signal(signal.SIGCONT)
        for operator in (a, b):
            if operator is not None:
                operator.stop()
                print(f"--- {operator.log_path.name} ---\n{operator.log_tail(30)}")
