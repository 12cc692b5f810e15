"""On the real control plane: each job gets its NetworkPolicy, and trainer pods carry no service
account token unless the job's template asks for one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from meshrun_operator import names
from operator_harness import FAST_FLAGS, Cluster, OperatorProcess, job_manifest
from test_operator_cluster_stalls import assert_cleaned_up, one_pod_per_index

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

OPERATOR_LABELS = {"app.kubernetes.io/name": "meshrun", "app.kubernetes.io/component": "operator"}


def token_volumes(pod: dict[str, object]) -> list[str]:
    """The projected service account token volumes the API server's admission added."""
    volumes = (pod.get("spec") or {}).get("volumes") or []  # type: ignore[attr-defined]
    return [v["name"] for v in volumes if v["name"].startswith("kube-api-access-")]


def test_each_job_gets_its_network_policy_and_no_token_unless_asked(
    cluster: Cluster, kubeconfig: str, namespace: str, crds_installed: list[str], tmp_path: Path
) -> None:
    labels = ",".join(f"{k}={v}" for k, v in OPERATOR_LABELS.items())
    extra = ["--operator-namespace", "meshrun-system", "--operator-labels", labels]
    operator = OperatorProcess(kubeconfig, namespace, tmp_path, FAST_FLAGS + extra).start()
    try:
        asks = {"spec": {"automountServiceAccountToken": True}}
        cluster.apply(job_manifest("sealed"))
        cluster.apply(job_manifest("token", podTemplate=asks))
        for job in ("sealed", "token"):
            cluster.wait_running_pods(job, 2)
            cluster.wait_phase(job, "Running")
        out = cluster.kubectl("get", "networkpolicy", "sealed", "-n", namespace, "-o", "json")
        policy = json.loads(out.stdout)  # accepted by the API server's validation
        (owner,) = policy["metadata"]["ownerReferences"]
        assert owner["uid"] == cluster.job("sealed")["metadata"]["uid"]
        spec = policy["spec"]
        assert spec["podSelector"] == {"matchLabels": {names.LABEL_JOB: "sealed"}}
        job_pods, from_operator = spec["ingress"]
        assert job_pods["from"] == [{"podSelector": spec["podSelector"]}]
        assert from_operator["ports"] == [{"port": names.METRICS_PORT, "protocol": "TCP"}]
        assert from_operator["from"][0]["podSelector"] == {"matchLabels": OPERATOR_LABELS}
        # The service account admission mounts a token only where the template asked for it.
        for pod in cluster.live_pods("sealed"):
            assert pod["spec"]["automountServiceAccountToken"] is False
            assert token_volumes(pod) == []
        for pod in cluster.live_pods("token"):
            assert len(token_volumes(pod)) == 1
        for job in ("sealed", "token"):
            assert cluster.status(job)["restarts"] == 0
            one_pod_per_index(cluster, job, 2)
        assert_cleaned_up(cluster, "sealed", "token")
    finally:
        operator.stop()
        print(f"--- operator log ---\n{operator.log_tail(40)}")
