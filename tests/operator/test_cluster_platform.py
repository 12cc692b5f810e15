"""On the real control plane: the platform policy refuses what a tenant cannot loosen (the field
and the rule named, the job kept, no pod made), a required queue, a job above the operator's
--max-pods-per-job, the platform's egress that a job cannot open, a pod that copies a job's
name label joins neither its Service nor its peers, and a PodGroup of the job's name that
someone else made is not taken for the job's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from meshrun_operator import names
from operator_harness import Cluster, OperatorProcess, job_manifest, wait_seconds
from test_cluster_policies import COSCHEDULING_CRD
from test_cluster_stalls import assert_cleaned_up, one_pod_per_index
from waiting import wait_established, wait_for

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
    (
        "huge",
        {
            "resources": {"numNodes": 4, "numProcPerNode": 4},
            "training": {"steps": 10, "globalBatchSize": 32, "microBatchSize": 2},
        },
        "spec.resources.numNodes",
    ),
]


def test_the_platform_policy_refuses_naming_the_field_and_makes_no_pod(
    cluster: Cluster, kubeconfig: str, namespace: str, crds_installed: list[str], tmp_path: Path
) -> None:
    extra = ["--require-queue", "--max-pods-per-job", "3"]
    operator = OperatorProcess(kubeconfig, namespace, tmp_path, extra=extra).start()
    try:
        for name, changes, _ in REFUSED:
            spec = {"scheduling": QUEUED, **changes}
            cluster.apply(job_manifest(name, **spec))
        for name, _, field in REFUSED:
            status = cluster.wait_phase(name, "Failed")
            invalid = cluster.condition(name, "Invalid")
            assert invalid["status"] == "True", (name, invalid)
            assert invalid["message"].startswith(f"{field}: "), (name, invalid["message"])
            said = "--max-pods-per-job" if name == "huge" else "platform policy"
            assert said in invalid["message"], (name, invalid["message"])
            assert status["restarts"] == 0 and status.get("placement", []) == []
            # the event is posted beside the status, not before it: awaited too
            warnings = wait_for(
                lambda name=name: [e for e in cluster.events(name) if e["reason"] == "InvalidSpec"],
                30,
                f"{name}'s InvalidSpec event",
            )
            assert field in warnings[0]["message"], (name, warnings)
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
        uid = cluster.job("walled")["metadata"]["uid"]
        own = {names.LABEL_JOB: "walled", names.LABEL_JOB_UID: uid}
        assert gang["to"] == [{"podSelector": {"matchLabels": own}}]
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


def test_a_pod_that_copies_the_job_name_label_does_not_join_the_service(
    cluster: Cluster, operator_process: OperatorProcess, namespace: str
) -> None:
    cluster.apply(job_manifest("gang"))
    cluster.wait_running_pods("gang", 2)
    uid = cluster.job("gang")["metadata"]["uid"]
    # Anyone who may create pods in the namespace can copy the label, the hostname and the
    # subdomain of pod 0, and would answer the rendezvous through the Service's DNS name.
    intruder = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "intruder", "labels": {names.LABEL_JOB: "gang"}},
        "spec": {
            "hostname": "gang-0",
            "subdomain": "gang",
            "restartPolicy": "Never",
            "containers": [{"name": "trainer", "image": "meshrun/trainer:test"}],
        },
    }
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(intruder))
    wait_for(lambda: bool(pod_ip(cluster, "intruder")), 60, "the intruder running with an address")
    service = json.loads(cluster.kubectl("get", "service", "gang", "-n", namespace,
                                         "-o", "json").stdout)  # fmt: skip
    assert service["spec"]["selector"] == {names.LABEL_JOB: "gang", names.LABEL_JOB_UID: uid}
    job_pods = {"gang-0", "gang-1"}
    wait_for(lambda: endpoint_pods(cluster, "gang") == job_pods, 60, "the gang's two endpoints")
    wait_seconds(3)  # the endpoint controller has seen the intruder long since: still out
    assert endpoint_pods(cluster, "gang") == job_pods
    uids = {p["metadata"]["name"]: p["metadata"]["labels"].get(names.LABEL_JOB_UID)
            for p in cluster.live_pods("gang")}  # fmt: skip
    assert uids == {"gang-0": uid, "gang-1": uid, "intruder": None}
    cluster.kubectl("delete", "pod", "intruder", "-n", namespace, "--wait=false")


def pod_ip(cluster: Cluster, name: str) -> str:
    out = cluster.kubectl("get", "pod", name, "-n", cluster.ns, "-o", "jsonpath={.status.podIP}")
    return out.stdout.strip()


def endpoint_pods(cluster: Cluster, service: str) -> set[str]:
    """The pods the Service's EndpointSlices list."""
    out = cluster.kubectl("get", "endpointslices", "-n", cluster.ns, "-l",
                          f"kubernetes.io/service-name={service}", "-o", "json")  # fmt: skip
    return {
        endpoint["targetRef"]["name"]
        for item in json.loads(out.stdout)["items"]
        for endpoint in item.get("endpoints") or []
        if endpoint.get("targetRef")
    }


def test_a_podgroup_someone_else_made_with_the_jobs_name_is_not_taken_for_its_own(
    cluster: Cluster, operator_process: OperatorProcess, namespace: str
) -> None:
    cluster.apply(COSCHEDULING_CRD)
    crd = "crd/podgroups.scheduling.x-k8s.io"
    wait_established(cluster.kubectl, crd)
    # A gang of one: the coscheduling plugin would bind each pod alone, a partial gang.
    planted = {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": "cosched", "namespace": namespace},
        "spec": {"minMember": 1},
    }
    cluster.apply(planted)
    scheduling = {"schedulerName": "scheduler-plugins-scheduler"}
    cluster.apply(job_manifest("cosched", scheduling=scheduling))
    refused = wait_for(
        lambda: (
            (c := cluster.condition("cosched", "CreationRefused")).get("status") == "True" and c
        ),
        60,
        "the job saying its PodGroup's name is taken",
    )
    assert refused["reason"] == "NameConflict"
    assert "PodGroup cosched already exists and is not this job's" in refused["message"]
    wait_seconds(2)  # several passes: still no pod under someone else's group
    assert cluster.pods("cosched") == []
    group = json.loads(cluster.kubectl("get", "podgroups.scheduling.x-k8s.io", "cosched",
                                       "-n", namespace, "-o", "json").stdout)  # fmt: skip
    assert group["spec"] == {"minMember": 1} and not group["metadata"].get("ownerReferences")
