"""On the real control plane: the platform policy refuses what a tenant cannot loosen (the field
and the rule named, the job kept, no pod made), a required queue, and the platform's egress
that a job cannot open."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from meshrun_operator import names
from operator_harness import Cluster, OperatorProcess, job_manifest
from test_cluster_stalls import assert_cleaned_up, one_pod_per_index

from meshrun.api.crd import PLURAL

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

T = "spec.podTemplate.spec"
QUEUED = {"queueName": "team"}

# (job, its spec's changes, the field its Invalid condition names first)
REFUSED: list[tuple[str, dict[str, Any], str]] = [
    ("pinned", {"podTemplate": {"spec": {"nodeName": "control-plane"}}}, f"{T}.nodeName"),
    (
        "tolerant",
        {"podTemplate": {"spec": {"tolerations": [{"operator": "Exists"}]}}},
        f"{T}.tolerations[0].key",
    ),
    (
        "critical",
        {"scheduling": {**QUEUED, "priorityClassName": "system-node-critical"}},
        "spec.scheduling.priorityClassName",
    ),
    (
        "stubborn",
        {"podTemplate": {"spec": {"terminationGracePeriodSeconds": 31536000}}},
        f"{T}.terminationGracePeriodSeconds",
    ),
    (
        "mounted",
        {
            "podTemplate": {
                "spec": {"volumes": [{"name": "d", "nfs": {"server": "s", "path": "/"}}]}
            }
        },
        f"{T}.volumes[0].nfs",
    ),
    (
        "identity",
        {"podTemplate": {"spec": {"serviceAccountName": "cloud-admin"}}},
        f"{T}.serviceAccountName",
    ),
    ("unqueued", {"scheduling": {}}, "spec.scheduling.queueName"),
]


def test_the_platform_policy_refuses_naming_the_field_and_makes_no_pod(
    cluster: Cluster, kubeconfig: str, namespace: str, crds_installed: list[str], tmp_path: Path
) -> None:
    operator = OperatorProcess(kubeconfig, namespace, tmp_path, extra=["--require-queue"]).start()
    try:
        for name, changes, _ in REFUSED:
            spec = {"scheduling": QUEUED, **changes}
            cluster.apply(job_manifest(name, **spec))
        for name, _, field in REFUSED:
            status = cluster.wait_phase(name, "Failed")
            invalid = cluster.condition(name, "Invalid")
            assert invalid["status"] == "True", (name, invalid)
            assert invalid["message"].startswith(f"{field}: "), (name, invalid["message"])
            assert "platform policy" in invalid["message"], (name, invalid["message"])
            assert status["restarts"] == 0 and status.get("placement", []) == []
            warnings = [e for e in cluster.events(name) if e["reason"] == "InvalidSpec"]
            assert warnings and field in warnings[0]["message"], (name, warnings)
        # Nothing was made and nothing is lost: no pod, no Service, the jobs as they were sent.
        for name, changes, _ in REFUSED:
            assert cluster.pods(name) == [], name
            template = cluster.job(name)["spec"].get("podTemplate")
            assert template == changes.get("podTemplate"), name
        services = cluster.kubectl("get", "services", "-n", namespace, "-o", "json").stdout
        assert json.loads(services)["items"] == []
    finally:
        operator.stop()
        print(f"--- operator log ---\n{operator.log_tail(40)}")


def test_the_platforms_egress_cannot_be_opened_by_a_job(
    cluster: Cluster, kubeconfig: str, namespace: str, crds_installed: list[str], tmp_path: Path
) -> None:
    extra = ["--default-egress", "Restricted", "--egress-allowed-cidrs", "10.0.0.0/8,0.0.0.0/0"]
    operator = OperatorProcess(kubeconfig, namespace, tmp_path, extra=extra).start()
    try:
        # The job says Open; the platform's restriction stays.
        opened = {"egress": {"policy": "Open"}}
        cluster.apply(job_manifest("walled", networking=opened))
        wide = {"egress": {"policy": "Restricted", "allowedCIDRs": ["::/0"]}}
        cluster.apply(job_manifest("wide", networking=wide))
        cluster.wait_running_pods("walled", 2)
        cluster.wait_phase("walled", "Running")
        out = cluster.kubectl("get", "networkpolicy", "walled", "-n", namespace, "-o", "json")
        spec = json.loads(out.stdout)["spec"]  # accepted by the API server's validation
        assert spec["policyTypes"] == ["Ingress", "Egress"]
        dns, gang, cidrs = spec["egress"]
        assert dns["to"] == [
            {
                "namespaceSelector": {
                    "matchLabels": {"kubernetes.io/metadata.name": "kube-system"}
                },
                "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
            }
        ]
        assert {p["port"] for p in dns["ports"]} == {53}
        assert gang["to"] == [{"podSelector": {"matchLabels": {names.LABEL_JOB: "walled"}}}]
        ten, everywhere = (peer["ipBlock"] for peer in cidrs["to"])
        assert ten == {"cidr": "10.0.0.0/8"}
        assert everywhere["cidr"] == "0.0.0.0/0"
        assert {"169.254.169.254/32", "168.63.129.16/32", "100.100.100.200/32",
                "169.254.170.2/32", "169.254.170.23/32"} == set(everywhere["except"])  # fmt: skip
        # A CIDR outside the platform's is refused, not added.
        cluster.wait_phase("wide", "Failed")
        message = cluster.condition("wide", "Invalid")["message"]
        assert message.startswith("spec.networking.egress.allowedCIDRs[0]: ::/0 is outside")
        assert cluster.pods("wide") == []
        one_pod_per_index(cluster, "walled", 2)
        assert_cleaned_up(cluster, "walled")
    finally:
        cluster.kubectl("delete", PLURAL, "--all", "-n", namespace, "--wait=false", check=False)
        operator.stop()
        print(f"--- operator log ---\n{operator.log_tail(40)}")
