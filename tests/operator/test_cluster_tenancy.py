"""On the real control plane: each job gets its NetworkPolicy, and trainer pods carry no service
account token unless the job's template asks for one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from meshrun_operator import names
from meshrun_operator.children.netpolicy import (
    METADATA_ADDRESSES,
    OperatorPeer,
    build_network_policy,
)
from meshrun_operator.children.owner import JobRef
from operator_harness import (
    FAST_FLAGS,
    Cluster,
    OperatorProcess,
    admission_refusal,
    job_manifest,
)
from test_cluster_stalls import assert_cleaned_up, one_pod_per_index
from waiting import wait_for

from meshrun.api.spec import Egress
from meshrun.envcontract import METRICS_PORT

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
        uid = cluster.job("sealed")["metadata"]["uid"]
        own = {names.LABEL_JOB: "sealed", names.LABEL_JOB_UID: uid}
        assert spec["podSelector"] == {"matchLabels": own}
        job_pods, from_operator = spec["ingress"]
        assert job_pods["from"] == [{"podSelector": spec["podSelector"]}]
        assert from_operator["ports"] == [{"port": METRICS_PORT, "protocol": "TCP"}]
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


def refuse_network_policies(namespace: str) -> list[dict[str, Any]]:
    """Admission that forbids NetworkPolicies in one namespace."""
    rules = [{"apiGroups": ["networking.k8s.io"], "apiVersions": ["v1"],
              "operations": ["CREATE"], "resources": ["networkpolicies"]}]  # fmt: skip
    name = f"no-netpol-{namespace}"[:63]
    return admission_refusal(namespace, name, rules, "NetworkPolicies are managed centrally here")


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


def test_the_api_server_accepts_a_restricted_egress_policy(cluster: Cluster) -> None:
    egress = Egress(policy="Restricted", allowed_cidrs=["0.0.0.0/0", "10.20.0.0/16", "::/0"])
    job = JobRef("egress", cluster.ns, "0d5c3c44-5d0e-4a8e-9c43-2f6f0d2f8a11")
    policy = build_network_policy(job, OperatorPeer("meshrun-system", OPERATOR_LABELS), egress)
    policy["metadata"].pop("ownerReferences")  # no such job: validation is what is tested
    out = cluster.kubectl(
        "create", "--dry-run=server", "-o", "json", "-n", cluster.ns, "-f", "-",
        input=json.dumps(policy),
    )  # fmt: skip
    accepted = json.loads(out.stdout)["spec"]
    assert accepted["policyTypes"] == ["Ingress", "Egress"]
    blocks = [
        peer["ipBlock"] for rule in accepted["egress"] for peer in rule["to"] if "ipBlock" in peer
    ]
    assert blocks == [
        {"cidr": "0.0.0.0/0", "except": list(METADATA_ADDRESSES[:5])},
        {"cidr": "10.20.0.0/16"},
        {"cidr": "::/0", "except": list(METADATA_ADDRESSES[5:])},
    ]
    # DNS: port 53 of the cluster's DNS pods only, not of every pod.
    dns = accepted["egress"][0]
    assert dns["to"][0]["podSelector"] == {"matchLabels": {"k8s-app": "kube-dns"}}


def test_a_job_with_restricted_egress_runs_behind_its_egress_policy(
    cluster: Cluster, operator_process: OperatorProcess
) -> None:
    egress = {"policy": "Restricted", "allowedCIDRs": ["10.20.0.0/16"]}
    # The shared cluster's CRD is whichever checkout applied it last: this test needs its own.
    crds = Path(__file__).resolve().parents[2] / "crds"
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crds))
    wait_for(
        lambda: (
            cluster.apply(
                job_manifest("walled", networking={"egress": egress}), check=False
            ).returncode
            == 0
        ),
        30,
        "the CRD with spec.networking served",
    )
    cluster.wait_running_pods("walled", 2)
    cluster.wait_phase("walled", "Running")
    out = cluster.kubectl("get", "networkpolicy", "walled", "-n", cluster.ns, "-o", "json")
    spec = json.loads(out.stdout)["spec"]
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    dns, gang, cidrs = spec["egress"]
    assert {p["port"] for p in dns["ports"]} == {53}
    own = {names.LABEL_JOB: "walled", names.LABEL_JOB_UID: cluster.job("walled")["metadata"]["uid"]}
    assert gang["to"] == [{"podSelector": {"matchLabels": own}}]
    assert cidrs["to"] == [{"ipBlock": {"cidr": "10.20.0.0/16"}}]
    assert_cleaned_up(cluster, "walled")
