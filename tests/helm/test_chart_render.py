"""The rendered chart: lint, schema errors, hardening, RBAC per mode, server-side dry run.

Marked ``cluster``: these need the helm binary ``make tools`` builds, and the dry run needs the
API server.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
from helm_support import CHART, ROOT, Kubectl, find, helm, render, template, values_args
from meshrun_operator.children.platform import DnsPeer, PlatformEgress, PlatformPolicy
from meshrun_operator.main import parse_args

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]

NAMESPACED = {"watchNamespaces": ["team-a", "team-b"]}
# Resources the operator must never be able to touch, in any mode.
FORBIDDEN_RESOURCES = {"secrets", "configmaps", "serviceaccounts", "roles", "rolebindings", "*"}
# No update (the operator patches), no escalate/bind/impersonate, no wildcard.
USED_VERBS = {"get", "list", "watch", "create", "patch", "delete"}
# Kueue's cluster-scoped objects the operator reads (operator.kueue, the default).
KUEUE_CLUSTER_READS = {"clusterqueues", "resourceflavors", "workloadpriorityclasses"}


def rules_of(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [rule for obj in find(objects, kind) for rule in obj["rules"]]


def is_aggregated(role: dict[str, Any]) -> bool:
    """One of the ClusterRoles for users (aggregated into edit, admin, view), not the operator."""
    labels = role["metadata"].get("labels") or {}
    return any(key.startswith("rbac.authorization.k8s.io/aggregate-to-") for key in labels)


def deployment(values: dict[str, Any] | None = None) -> dict[str, Any]:
    (found,) = find(render(values), "Deployment")
    return found


@pytest.mark.parametrize("values", [{}, NAMESPACED], ids=["cluster-wide", "namespaced"])
def test_helm_lint_strict_passes(values: dict[str, Any]) -> None:
    out = helm("lint", "--strict", str(CHART), *values_args(values)).stdout
    assert "0 chart(s) failed" in out


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"operator": {"workers": 0}}, "/operator/workers"),
        ({"operator": {"resyncSeconds": "-1"}}, "/operator/resyncSeconds"),
        ({"watchNamespace": ["a"]}, "'watchNamespace' not allowed"),
        ({"watchNamespaces": ["Team_A"]}, "/watchNamespaces/0"),
        ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
        ({"metrics": {"service": {"port": 70000}}}, "/metrics/service/port"),
        ({"jobPodPolicy": "lenient"}, "/jobPodPolicy"),
        (
            {"metrics": {"serviceMonitor": {"enabled": True}, "service": {"enabled": False}}},
            "metrics.serviceMonitor.enabled: needs metrics.service.enabled=true",
        ),
        (
            {"serviceAccount": {"create": False, "name": ""}},
            "serviceAccount.name: must name an existing ServiceAccount",
        ),
        (
            {"platformPolicy": {"maxTerminationGracePeriodSeconds": -1}},
            "/platformPolicy/maxTerminationGracePeriodSeconds",
        ),
        ({"platformPolicy": {"serviceAccount": ["a"]}}, "'serviceAccount' not allowed"),
        ({"operator": {"maxPodsPerJob": 0}}, "/operator/maxPodsPerJob"),
        ({"networkPolicy": {"defaultEgress": "Closed"}}, "/networkPolicy/defaultEgress"),
        ({"networkPolicy": {"dns": {"selector": "kube-dns"}}}, "/networkPolicy/dns/selector"),
        (
            {"networkPolicy": {"enabled": False, "defaultEgress": "Restricted"}},
            "networkPolicy.defaultEgress: Restricted needs networkPolicy.enabled=true",
        ),
        (
            {"platformPolicy": {"requireQueue": True}, "operator": {"kueue": False}},
            "platformPolicy.defaultQueue and requireQueue need operator.kueue=true",
        ),
    ],
)
def test_bad_values_fail_naming_the_value(values: dict[str, Any], message: str) -> None:
    proc = template(values, check=False)
    assert proc.returncode != 0
    assert message in proc.stderr


def test_deployment_is_hardened_and_probed() -> None:
    deploy = deployment()
    spec = deploy["spec"]
    assert spec["replicas"] == 1 and spec["strategy"] == {"type": "Recreate"}
    pod = spec["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 1000
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["containers"]
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": 8080, "health": 8081}
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    assert container["image"] == "meshrun/operator:0.1.0"


def test_rendered_flags_parse_to_the_values() -> None:
    values = {
        "watchNamespaces": ["team-a", "team-b"],
        "jobPodPolicy": "restricted",
        "operator": {
            "watchNodes": False,
            "progressHttp": False,
            "resyncSeconds": 0.5,
            "statusIntervalSeconds": 3,
            "workers": 8,
            "healthPort": 9091,
        },
    }
    (container,) = deployment(values)["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["python", "-m", "meshrun_operator"]
    # The operator's own parser accepts every flag the chart renders, with the values' meaning.
    options = parse_args(container["args"])
    assert options.namespaces == ("team-a", "team-b")
    assert options.watch_nodes is False and options.progress_http is False
    assert options.resync_seconds == 0.5 and options.workers == 8
    assert options.status_interval_seconds == 3
    assert options.health_port == 9091 and options.metrics_port == 8080
    # Leader election by default: a second replica, or an old pod, never acts with the leader.
    assert options.leader is not None and options.leader.namespace == "meshrun-system"
    assert options.network_policy is not None and options.network_policy.operator is not None
    assert options.network_policy.operator.namespace == "meshrun-system"
    assert options.pod_policy == "restricted"
    assert (
        parse_args(deployment()["spec"]["template"]["spec"]["containers"][0]["args"]).pod_policy
        == "baseline"
    )


def test_the_platform_policy_values_become_the_operators_flags() -> None:
    (container,) = deployment()["spec"]["template"]["spec"]["containers"]
    defaults = parse_args(container["args"])
    assert defaults.platform == PlatformPolicy()  # the chart's defaults are the operator's
    assert defaults.max_pods_per_job == parse_args([]).max_pods_per_job == 1024
    assert defaults.network_policy is not None
    assert defaults.network_policy.egress == PlatformEgress()
    values = {
        "platformPolicy": {
            "serviceAccounts": ["default", "reader"],
            "priorityClasses": ["training", "system-cluster-critical"],
            "runtimeClasses": ["nvidia"],
            "volumeTypes": ["persistentVolumeClaim", "nfs"],
            "tokenAudiences": ["vault"],
            "maxTerminationGracePeriodSeconds": 60,
            "defaultQueue": "team-queue",
            "requireQueue": True,
        },
        "operator": {"maxPodsPerJob": 64},
        "networkPolicy": {
            "defaultEgress": "Restricted",
            "egressAllowedCIDRs": ["10.0.0.0/8", "fd00::/8"],
            "dns": {"namespace": "dns", "selector": "app=coredns,tier=node"},
        },
    }
    (container,) = deployment(values)["spec"]["template"]["spec"]["containers"]
    options = parse_args(container["args"])
    assert options.max_pods_per_job == 64
    assert options.platform == PlatformPolicy(
        service_accounts=frozenset({"default", "reader"}),
        priority_classes=frozenset({"training", "system-cluster-critical"}),
        runtime_classes=frozenset({"nvidia"}),
        volume_types=frozenset({"persistentVolumeClaim", "nfs"}),
        token_audiences=frozenset({"vault"}),
        max_grace_seconds=60,
        default_queue="team-queue",
        require_queue=True,
    )
    assert options.network_policy is not None
    assert options.network_policy.egress == PlatformEgress(
        True, ("10.0.0.0/8", "fd00::/8"), DnsPeer("dns", {"app": "coredns", "tier": "node"})
    )


def test_cluster_wide_mode_binds_the_job_rules_cluster_wide() -> None:
    objects = render()
    assert find(objects, "Role", "-jobs") == [] and find(objects, "RoleBinding", "-jobs") == []
    (jobs,) = find(objects, "ClusterRole", "-jobs")
    pods = [r for r in jobs["rules"] if r["resources"] == ["pods"]]
    assert pods and set(pods[0]["verbs"]) == {"list", "watch", "get", "create", "delete"}
    assert len(find(objects, "ClusterRoleBinding")) == 2


def test_namespaced_mode_grants_jobs_rules_only_in_listed_namespaces() -> None:
    objects = render(NAMESPACED)
    roles = find(objects, "Role", "-jobs")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    bindings = find(objects, "RoleBinding", "-jobs")
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    for binding in bindings:
        (subject,) = binding["subjects"]
        assert subject["namespace"] == "meshrun-system"
    # What is granted cluster-wide is read-only and on cluster-scoped objects only.
    cluster_rules = [
        rule for role in find(objects, "ClusterRole", "-cluster") for rule in role["rules"]
    ]
    assert {res for r in cluster_rules for res in r["resources"]} == {
        "customresourcedefinitions",
        "nodes",
        "namespaces",
        *KUEUE_CLUSTER_READS,
    }
    assert {verb for r in cluster_rules for verb in r["verbs"]} == {"list", "watch", "get"}


@pytest.mark.parametrize("values", [{}, NAMESPACED], ids=["cluster-wide", "namespaced"])
def test_no_rule_reaches_secrets_or_wildcards(values: dict[str, Any]) -> None:
    objects = render(values)
    operator_roles = [r for r in find(objects, "ClusterRole") if not is_aggregated(r)]
    for rule in [rule for role in operator_roles for rule in role["rules"]] + rules_of(
        objects, "Role"
    ):
        assert not FORBIDDEN_RESOURCES & set(rule["resources"]), rule
        assert "*" not in rule["apiGroups"], rule
        # update: the finalizers subresource (owner references) and the leader's own Lease.
        named_lease = rule["resources"] == ["leases"] and rule.get("resourceNames")
        updates = rule["resources"] == ["paralleltrainingjobs/finalizers"] or named_lease
        assert set(rule["verbs"]) <= (USED_VERBS | {"update"} if updates else USED_VERBS), rule


def test_optional_permissions_follow_their_values() -> None:
    objects = render({"operator": {"watchNodes": False}, "rbac": {"podGroups": False}})
    resources = {res for r in rules_of(objects, "ClusterRole") for res in r["resources"]}
    assert "nodes" not in resources and "podgroups" not in resources
    assert "nodes" in {res for r in rules_of(render(), "ClusterRole") for res in r["resources"]}
    assert find(render({"rbac": {"create": False}}), "ClusterRole") == []


def test_service_monitor_scrapes_the_metrics_service() -> None:
    objects = render({"metrics": {"serviceMonitor": {"enabled": True, "labels": {"p": "x"}}}})
    (monitor,) = find(objects, "ServiceMonitor")
    (service,) = find(objects, "Service", "-metrics")
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]
    assert monitor["metadata"]["labels"]["p"] == "x"
    assert find(render(), "ServiceMonitor") == []


@pytest.mark.parametrize("mode", ["cluster-wide", "namespaced"])
def test_server_side_dry_run_accepts_every_object(
    mode: str,
    kubectl: Kubectl,
    namespace: str,
    new_namespace: Callable[[str], str],
    crds_installed: list[str],
) -> None:
    values: dict[str, Any] = {}
    if mode == "namespaced":
        values = {"watchNamespaces": [new_namespace("team-a"), new_namespace("team-b")]}
    manifest = template(values, namespace=namespace).stdout
    out = kubectl("apply", "--dry-run=server", "-f", "-", input=manifest).stdout
    kinds = [line.split("/")[0] for line in out.splitlines() if "(server dry run)" in line]
    expected = {"serviceaccount", "deployment.apps", "service"}
    assert expected <= set(kinds), out
    roles = [k for k in kinds if k.startswith("role.rbac")]
    # The jobs' Role per served namespace, and the leader's in the release namespace.
    assert len(roles) == (3 if mode == "namespaced" else 1), out


def test_kind_e2e_jobs_pass_the_api_servers_validation(
    kubectl: Kubectl, namespace: str, crds_installed: list[str]
) -> None:
    """What `make e2e-kind` submits is accepted by the CRD's schema and CEL rules."""
    examples = sorted(str(p) for p in (ROOT / "examples").glob("*.yaml"))
    jobs = subprocess.run(
        [sys.executable, str(ROOT / "hack/e2e_kind_jobs.py"), "meshrun/trainer:e2e", *examples],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    out = kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-", input=jobs).stdout
    accepted = [line for line in out.splitlines() if "created (server dry run)" in line]
    assert len(accepted) == len(examples), out


def test_operator_pod_meets_pod_security_restricted(
    kubectl: Kubectl, new_namespace: Callable[[str], str]
) -> None:
    """The API server's PodSecurity admission, asked to warn at `restricted`, has nothing to say.

    Workload objects get warnings (not rejections) for their pod template, so a dry run in a
    namespace labelled warn=restricted checks the Deployment's pod against the strictest Pod
    Security Standard (https://kubernetes.io/docs/concepts/security/pod-security-standards/).
    """
    namespace = new_namespace("pss")
    kubectl(
        "label", "namespace", namespace,
        "pod-security.kubernetes.io/warn=restricted",
        "pod-security.kubernetes.io/warn-version=latest",
    )  # fmt: skip
    manifest = template(namespace=namespace).stdout
    good = kubectl("apply", "--dry-run=server", "-f", "-", input=manifest)
    assert "deployment.apps" in good.stdout and "PodSecurity" not in good.stderr, good.stderr
    # The same check does object to a root container, so silence above means compliance.
    weakened = manifest.replace("runAsNonRoot: true", "runAsNonRoot: false")
    bad = kubectl("apply", "--dry-run=server", "-f", "-", input=weakened)
    assert 'would violate PodSecurity "restricted:latest"' in bad.stderr


def test_kueue_permissions_and_flag_follow_operator_kueue() -> None:
    def kueue_grants(objects: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
        return {
            (kind, resource, verb)
            for kind in ("ClusterRole", "Role")
            for rule in rules_of(objects, kind)
            if "kueue.x-k8s.io" in rule["apiGroups"]
            for resource in rule["resources"]
            for verb in rule["verbs"]
        }

    jobs = {("workloads", "list"), ("workloads", "watch"), ("workloads", "create")}
    jobs |= {("workloads/status", "patch"), ("localqueues", "get")}
    expected = {("Role", res, verb) for res, verb in jobs}
    expected |= {("ClusterRole", res, "get") for res in KUEUE_CLUSTER_READS}
    assert kueue_grants(render(NAMESPACED)) == expected
    off = {**NAMESPACED, "operator": {"kueue": False}}
    assert kueue_grants(render(off)) == set()
    (on_args, off_args) = (
        deployment(values)["spec"]["template"]["spec"]["containers"][0]["args"]
        for values in (NAMESPACED, off)
    )
    assert "--no-kueue" in off_args and "--no-kueue" not in on_args
    assert parse_args(off_args).kueue is False and parse_args(on_args).kueue is True
