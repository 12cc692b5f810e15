"""The platform's default queue (--default-queue): a job that names no queue still meets Kueue,
in the platform's LocalQueue, instead of running outside every quota."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from kueue_support import Kubectl, KueueEnv
from meshrun_operator import names
from operator_harness import Cluster, OperatorProcess, job_manifest
from waiting import wait_for

from meshrun.api.crd import PLURAL

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]


def test_a_job_without_a_queue_is_queued_in_the_default_one(
    kubeconfig: str,
    kubectl: Kubectl,
    kueue_env: KueueEnv,
    crds_installed: list[str],
    tmp_path: Path,
) -> None:
    namespace = kueue_env.namespaces["team-a"]
    extra = ["--default-queue", "team-a"]  # the team's LocalQueue (kueue_objects.local_queue)
    operator = OperatorProcess(kubeconfig, namespace, tmp_path, extra=extra).start()
    team = Cluster(kubectl, namespace)
    name = f"unqueued-{uuid.uuid4().hex[:5]}"
    try:
        team.apply(job_manifest(name))  # no spec.scheduling.queueName, no queue label

        def workload() -> dict[str, Any] | None:
            out = kubectl("get", "workloads", "-n", namespace, "-l",
                          f"{names.LABEL_JOB}={name}", "-o", "json").stdout  # fmt: skip
            items: list[dict[str, Any]] = json.loads(out)["items"]
            return items[0] if items else None

        found = wait_for(workload, 60, f"a Workload for {name}", describe=operator.log_tail)
        assert found["spec"]["queueName"] == "team-a"
        # Kueue governs it: once the operator has read the Workload back, the job's Suspended
        # condition carries Kueue's verdict instead of the operator's own "Queued" (the
        # reason it sets while the Workload is being created).
        kueues = ("Pending", "Admitted", "QuotaReserved")

        def reason() -> str | None:
            found: str | None = team.condition(name, "Suspended").get("reason")
            return found

        wait_for(lambda: reason() in kueues, 60, "Kueue's verdict on the job", describe=reason)
        assert team.job(name)["spec"].get("scheduling", {}).get("queueName") is None
    finally:
        kubectl("delete", PLURAL, name, "-n", namespace, "--wait=true", "--timeout=30s",
                check=False)  # fmt: skip
        operator.stop()
        print(f"--- operator log ---\n{operator.log_tail(40)}")
