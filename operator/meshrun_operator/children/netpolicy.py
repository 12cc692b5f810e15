"""The NetworkPolicy every job gets: only its own pods reach its pods, and the operator port 9400.

A job's pods listen on the rendezvous port (29500), on the ports NCCL and gloo open at random for
their rings, and on the trainer's metrics port (9400, /progress and /metrics). Without a policy
every pod of the cluster can connect to them, so one tenant could join or disturb another's
rendezvous. The policy selects the job's pods and admits ingress only from pods of the same job
(any port: the collective ports are not fixed) and, on port 9400 only, from the operator's own
pods. Egress is left alone (a trainer reads its data and checkpoints where the user says) unless
the job asks for ``spec.networking.egress.policy: Restricted`` or the platform restricts every
job's egress (``--default-egress Restricted``, :class:`PlatformEgress`, which a job cannot
open): then its pods may reach the cluster's DNS pods on port 53, each other, the platform's
CIDRs and the CIDRs the job lists (inside the platform's, when the platform restricts), never
a cloud metadata address (``METADATA_ADDRESSES``: they hand out the node's cloud credentials).
NetworkPolicies add up, so a cluster admin can admit more (say, Prometheus on 9400) with a policy
of their own. Enforcement is the network plugin's: without one that implements NetworkPolicy the
object has no effect.
"""

from __future__ import annotations

import argparse
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from meshrun.api.spec import Egress
from meshrun.envcontract import METRICS_PORT
from meshrun_operator import names
from meshrun_operator.children.owner import JobRef, child_metadata
from meshrun_operator.children.platform import DnsPeer, PlatformEgress
from meshrun_operator.client.credentials import own_namespace
from meshrun_operator.kinds import NETWORK_POLICY


@dataclass(frozen=True)
class OperatorPeer:
    """Where the operator's own pods run, so the policy can let them read /progress."""

    namespace: str
    """The operator's namespace."""
    labels: Mapping[str, str] = field(default_factory=dict)
    """Labels that select the operator's pods there (the chart's selector labels)."""


def parse_labels(text: str) -> dict[str, str]:
    """``k=v,k2=v2`` as a dict; ValueError naming the bad item."""
    labels = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"{item!r} is not key=value")
        labels[key] = value
    return labels


METADATA_ADDRESSES = (
    "169.254.169.254/32",  # instance metadata: AWS, GCP, Azure, OCI, OpenStack
    "168.63.129.16/32",  # Azure's wireserver (VM agent, extensions, health)
    "100.100.100.200/32",  # Alibaba Cloud's instance metadata
    "169.254.170.2/32",  # AWS ECS task credentials
    "169.254.170.23/32",  # AWS EKS Pod Identity agent
    "fd00:ec2::254/128",  # AWS instance metadata over IPv6
    "fd00:ec2::23/128",  # AWS EKS Pod Identity agent over IPv6
)
"""The cloud metadata and credential endpoints: carved out of every CIDR a restricted job
allows, so a trainer cannot fetch the node's (or another pod's) cloud credentials."""

DNS_PORTS = [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]


def egress_rules(
    job: JobRef, egress: Egress, floor: PlatformEgress | None = None
) -> list[dict[str, Any]]:
    """What a job with restricted egress may reach: the cluster's DNS pods, its own pods, the
    platform's CIDRs and its own."""
    floor = floor or PlatformEgress()
    own_pods = {"podSelector": {"matchLabels": names.job_labels(job.name, job.uid)}}
    dns = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": floor.dns.namespace}},
        "podSelector": {"matchLabels": dict(floor.dns.labels)},
    }
    rules: list[dict[str, Any]] = [{"to": [dns], "ports": DNS_PORTS}, {"to": [own_pods]}]
    cidrs = dict.fromkeys([*floor.allowed_cidrs, *(egress.allowed_cidrs or [])])
    blocks = [{"ipBlock": _ip_block(cidr)} for cidr in cidrs]
    if blocks:
        rules.append({"to": blocks})
    return rules


def _ip_block(cidr: str) -> dict[str, Any]:
    network = ipaddress.ip_network(cidr, strict=False)
    block: dict[str, Any] = {"cidr": str(network)}
    carved = [
        str(m)
        for m in map(ipaddress.ip_network, METADATA_ADDRESSES)
        if m.version == network.version and m.subnet_of(network)  # type: ignore[arg-type]
    ]
    if carved:
        block["except"] = carved
    return block


def build_network_policy(
    job: JobRef,
    operator: OperatorPeer | None,
    egress: Egress | None = None,
    floor: PlatformEgress | None = None,
) -> dict[str, Any]:
    """The job's NetworkPolicy (named like the job, owned by it, garbage-collected with it).

    ``operator`` None (the operator runs outside the cluster): no pod but the job's own may
    connect, and progress comes from the pod annotation only. ``egress`` restricted, or the
    platform's ``floor``: the pods' egress is limited too (:func:`egress_rules`).
    """
    own_pods = {"podSelector": {"matchLabels": names.job_labels(job.name, job.uid)}}
    ingress: list[dict[str, Any]] = [{"from": [own_pods]}]
    if operator is not None:
        # An empty "from" would admit everyone: the peer always names a namespace.
        peer: dict[str, Any] = {
            "namespaceSelector": {
                "matchLabels": {"kubernetes.io/metadata.name": operator.namespace}
            },
            "podSelector": {"matchLabels": dict(operator.labels)},
        }
        ingress.append({"from": [peer], "ports": [{"protocol": "TCP", "port": METRICS_PORT}]})
    spec: dict[str, Any] = {
        "podSelector": {"matchLabels": names.job_labels(job.name, job.uid)},
        "policyTypes": ["Ingress"],
        "ingress": ingress,
    }
    floor = floor or PlatformEgress()
    if floor.restricted or (egress is not None and egress.policy == "Restricted"):
        spec["policyTypes"] = ["Ingress", "Egress"]
        spec["egress"] = egress_rules(
            job, egress or Egress(policy="Restricted", allowed_cidrs=None), floor
        )
    return {
        "apiVersion": NETWORK_POLICY.at().api_version,
        "kind": NETWORK_POLICY.kind,
        "metadata": child_metadata(job, names.network_policy_name(job.name), {}),
        "spec": spec,
    }


@dataclass(frozen=True)
class PolicyOptions:
    """Each job gets a NetworkPolicy (``--no-network-policy`` turns them off)."""

    operator: OperatorPeer | None = None
    """The operator's pods, let in on port 9400; None when it runs outside the cluster."""
    egress: PlatformEgress = field(default_factory=PlatformEgress)
    """The platform's egress for every job."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command-line flags of the per-job NetworkPolicy."""
    group = parser.add_argument_group("network policy (who may connect to a job's pods)")
    group.add_argument(
        "--no-network-policy",
        action="store_true",
        help="create no NetworkPolicy per job (any pod may then reach the job's ports)",
    )
    group.add_argument(
        "--operator-namespace",
        help="the operator's namespace, let in on port 9400 (default: its own, from "
        "POD_NAMESPACE or its service account; none outside a pod)",
    )
    group.add_argument(
        "--operator-labels",
        default="",
        help="k=v,... selecting the operator's pods in that namespace (default: all its pods)",
    )
    group.add_argument(
        "--default-egress",
        choices=["Open", "Restricted"],
        default="Open",
        help="Restricted: every job's egress is restricted (DNS, its own pods, "
        "--egress-allowed-cidrs and the CIDRs it lists inside them), and no job can open it; "
        "Open (the default): a job restricts its own with spec.networking.egress",
    )
    group.add_argument(
        "--egress-allowed-cidrs",
        default="",
        help="CIDRs,... every restricted job may reach (the metadata addresses carved out)",
    )
    group.add_argument(
        "--dns-namespace",
        default="kube-system",
        help="namespace of the cluster's DNS pods, the only ones a restricted job reaches on "
        "port 53 (default kube-system)",
    )
    group.add_argument(
        "--dns-labels",
        default="k8s-app=kube-dns",
        help="k=v,... selecting the DNS pods there (default k8s-app=kube-dns)",
    )


def from_args(args: argparse.Namespace, parser: argparse.ArgumentParser) -> PolicyOptions | None:
    """The NetworkPolicy settings asked for on the command line; bad values exit 2."""
    restricted = args.default_egress == "Restricted"
    if args.no_network_policy:
        if restricted:
            parser.error(
                "--default-egress Restricted needs the per-job NetworkPolicy (drop "
                "--no-network-policy)"
            )
        return None
    try:
        labels = parse_labels(args.operator_labels)
        dns = DnsPeer(args.dns_namespace, parse_labels(args.dns_labels))
    except ValueError as error:
        parser.error(f"--operator-labels or --dns-labels: {error}")
    cidrs = tuple(filter(None, (c.strip() for c in args.egress_allowed_cidrs.split(","))))
    for cidr in cidrs:
        try:
            ipaddress.ip_network(cidr, strict=False)
        except ValueError as error:
            parser.error(f"--egress-allowed-cidrs: {error}")
    namespace = args.operator_namespace or own_namespace()
    peer = OperatorPeer(namespace, labels) if namespace else None
    return PolicyOptions(peer, PlatformEgress(restricted, cidrs, dns))
