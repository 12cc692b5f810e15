"""On the real control plane: each job gets its NetworkPolicy, and trainer pods carry no service
account token unless the job's template asks for one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from meshrun_operator import names
from operator_harness import FAST_FLAGS, Cluster, OperatorProcess, job_manifest
from test_cluster_stalls import assert_cleaned_up, one_pod_per_index
from waiting import wait_for

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


def refuse_network_policies(namespace: str) -> list[dict[str, object]]:
    """A ValidatingAdmissionPolicy (and its binding) that forbids NetworkPolicies in one
    namespace, as a cluster admin's webhook or policy engine might."""
    name = f"no-netpol-{namespace}"[:63]
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": ["networking.k8s.io"],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE"],
                        "resources": ["networkpolicies"],
                    }
                ]
            },
            "validations": [
                {"expression": "false", "message": "NetworkPolicies are managed centrally here",
                 "reason": "Forbidden"}
            ],
        },
    }  # fmt: skip
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {
            "policyName": name,
            "validationActions": ["Deny"],
            "matchResources": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
            },
        },
    }
    return [policy, binding]


def test_a_refused_network_policy_holds_the_job_until_it_is_allowed(
    cluster: Cluster, operator_process: OperatorProcess, namespace: str
) -> None:
    objects = refuse_network_policies(namespace)
    for obj in objects:
        cluster.kubectl("apply", "-f", "-", input=json.dumps(obj))
    try:
        # The admission policy takes effect within a second or two of its binding.
        probe = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                 "metadata": {"name": "probe", "namespace": namespace},
                 "spec": {"podSelector": {}}}  # fmt: skip
        wait_for(
            lambda: (
                cluster.kubectl(
                    "create", "--dry-run=server", "-f", "-", input=json.dumps(probe), check=False
                ).returncode
                != 0
            ),
            30,
            "the admission policy refusing NetworkPolicies",
        )
        cluster.apply(job_manifest("guarded"))
        refused = wait_for(
            lambda: (
                (c := cluster.condition("guarded", "CreationRefused")).get("status") == "True" and c
            ),
            60,
            "the job saying its NetworkPolicy was refused",
        )
        assert refused["reason"] == "Forbidden"
        assert "NetworkPolicies are managed centrally here" in refused["message"]
        assert cluster.pods("guarded") == []  # no pod runs open to every other pod
        assert cluster.status("guarded")["phase"] == "Pending"
    finally:
        for obj in reversed(objects):
            kind = str(obj["kind"]).lower()
            cluster.kubectl("delete", kind, obj["metadata"]["name"], check=False)  # type: ignore[index]
    cluster.wait_running_pods("guarded", 2, timeout=90)
    status = cluster.wait_phase("guarded", "Running")
    assert status["restarts"] == 0
    cluster.kubectl("get", "networkpolicy", "guarded", "-n", namespace)
    one_pod_per_index(cluster, "guarded", 2)
    assert_cleaned_up(cluster, "guarded")
