"""The real node runs real containers: pod IPs on the CNI bridge, pods reach each other by their
headless-Service DNS names, Service ClusterIPs work, and the taint keeps other pods away."""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path
from typing import Any

import pytest
from realnode_support import BASE_IMAGE, REAL_NODE_LABEL, Kubectl
from waiting import wait_for

# The timeout covers fixture set-up: on a fresh machine the first test builds the real node
# (kubelet, kube-proxy, CoreDNS from Go modules, the debootstrap base image).
pytestmark = [pytest.mark.cluster, pytest.mark.timeout(3600)]

PROBE = (Path(__file__).parent / "peer_probe.py").read_text()
# hack/realnode/common.sh POD_CIDR: the bridge's host-local range.
POD_CIDR = ipaddress.ip_network("10.244.0.0/24")
TOLERATION = {"key": REAL_NODE_LABEL, "operator": "Equal", "value": "true", "effect": "NoSchedule"}


def peer_pod(name: str, peer: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": "peer"}},
        "spec": {
            "hostname": name,
            "subdomain": "peers",
            "restartPolicy": "Never",
            "nodeSelector": {REAL_NODE_LABEL: "true"},
            "tolerations": [TOLERATION],
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "probe",
                    "image": BASE_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["python3", "-c", PROBE],
                    "env": [
                        {"name": "SELF", "value": name},
                        {
                            "name": "PEER_FQDN",
                            "value": f"{peer}.peers.{namespace}.svc.cluster.local",
                        },
                    ],
                    "ports": [{"containerPort": 8080}],
                }
            ],
        },
    }


def headless_service(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "peers", "namespace": namespace},
        "spec": {
            "clusterIP": "None",
            "selector": {"app": "peer"},
            "publishNotReadyAddresses": True,
            "ports": [{"name": "http", "port": 8080}],
        },
    }


def get_pod(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    pod: dict[str, Any] = json.loads(
        kubectl("get", "pod", name, "-n", namespace, "-o", "json").stdout
    )
    return pod


def test_two_pods_reach_each_other_by_headless_service_names(
    kubectl: Kubectl, namespace: str, real_node: str
) -> None:
    objects = [headless_service(namespace), peer_pod("peer-a", "peer-b", namespace)]
    objects.append(peer_pod("peer-b", "peer-a", namespace))
    kubectl(
        "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects})
    )

    def finished() -> dict[str, dict[str, Any]] | None:
        pods = {name: get_pod(kubectl, namespace, name) for name in ("peer-a", "peer-b")}
        phases = {p["status"].get("phase") for p in pods.values()}
        return pods if phases <= {"Succeeded", "Failed"} else None

    pods = wait_for(
        finished,
        180,
        "peer-a and peer-b to finish on the real node",
        interval=1,
        describe=lambda: kubectl("get", "pods,events", "-n", namespace, check=False).stdout,
    )
    reports = {}
    for name, pod in pods.items():
        logs = kubectl("logs", name, "-n", namespace).stdout
        assert pod["status"]["phase"] == "Succeeded", f"{name} failed:\n{logs}"
        assert pod["spec"]["nodeName"] == real_node
        # A real runtime, not KWOK's simulation, ran the container.
        container_id = pod["status"]["containerStatuses"][0]["containerID"]
        assert container_id.startswith("containerd://"), container_id
        assert ipaddress.ip_address(pod["status"]["podIP"]) in POD_CIDR
        reports[name] = json.loads(logs.strip().splitlines()[-1])

    ip = {name: pod["status"]["podIP"] for name, pod in pods.items()}
    for name, peer in (("peer-a", "peer-b"), ("peer-b", "peer-a")):
        report = reports[name]
        assert report["selfIp"] == ip[name]
        # CoreDNS answered the headless name with the peer's pod IP, and the peer answered.
        assert report["peerIp"] == ip[peer], report
        assert report["peerReply"] == peer, report
        assert report["peerFetchedFromMe"] is True, report
        # kube-proxy routes the kubernetes Service's ClusterIP to the API server.
        assert report["apiReachable"] is True
        assert (
            report["apiServiceIp"]
            == kubectl(
                "get", "service", "kubernetes", "-n", "default", "-o", "jsonpath={.spec.clusterIP}"
            ).stdout
        )


def test_taint_keeps_pods_without_the_toleration_off_the_real_node(
    kubectl: Kubectl, namespace: str, real_node: str
) -> None:
    pod = peer_pod("intruder", "nobody", namespace)
    del pod["spec"]["tolerations"]
    kubectl("apply", "-f", "-", input=json.dumps(pod))

    def refused() -> str | None:
        events = kubectl(
            "get",
            "events",
            "-n",
            namespace,
            "--field-selector",
            "involvedObject.name=intruder,reason=FailedScheduling",
            "-o",
            "json",
        ).stdout
        messages = [e["message"] for e in json.loads(events)["items"]]
        return next((m for m in messages if "untolerated taint" in m), None)

    # kube-scheduler 1.34 counts the nodes it filtered out by taint without naming the taint:
    # "1 node(s) had untolerated taint(s)"; the real node is the only tainted one.
    message = wait_for(refused, 60, "a FailedScheduling event naming an untolerated taint")
    assert "1 node(s) had untolerated taint" in message, message
    assert get_pod(kubectl, namespace, "intruder")["spec"].get("nodeName") is None
