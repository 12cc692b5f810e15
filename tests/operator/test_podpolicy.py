"""The job pod policy (Pod Security Standards levels) and the pod template's shape, checked when a
job's spec is evaluated; the per-job egress NetworkPolicy (no cluster)."""

from __future__ import annotations

from typing import Any

import pytest
from meshrun_operator.children.netpolicy import (
    METADATA_ADDRESSES,
    OperatorPeer,
    build_network_policy,
)
from meshrun_operator.children.owner import JobRef
from meshrun_operator.children.platform import PlatformPolicy
from meshrun_operator.children.podpolicy import PodPolicy
from meshrun_operator.lifecycle.evaluation import Admission, evaluate
from operator_factories import make_job

from meshrun.api.read import read_spec

pytestmark = pytest.mark.unit

TEMPLATE = "spec.podTemplate.spec"
C0 = f"{TEMPLATE}.containers[0]"


def error_of(template: Any, policy: PodPolicy = PodPolicy.BASELINE) -> str | None:
    """The field the evaluation refuses, or None when the job may run."""
    # Any volume type as far as the platform policy goes: the levels' own rules are tested.
    rules = Admission(policy, platform=PlatformPolicy(volume_types=frozenset({"*"})))
    ev = evaluate(make_job(podTemplate=template)["spec"], "job", rules)
    return None if ev.error is None else ev.error.field


def container(**security: Any) -> dict[str, Any]:
    return {"spec": {"containers": [{"name": "trainer", "securityContext": security}]}}


def pod(**spec: Any) -> dict[str, Any]:
    return {"spec": spec}


# (template, the field baseline refuses or None, the field restricted refuses or None)
CASES: list[tuple[str, Any, str | None, str | None]] = [
    ("nothing", {}, None, None),
    ("plain sidecar", pod(containers=[{"name": "side", "image": "busybox"}]), None, None),
    ("hostNetwork", pod(hostNetwork=True), f"{TEMPLATE}.hostNetwork", f"{TEMPLATE}.hostNetwork"),
    ("hostPID", pod(hostPID=True), f"{TEMPLATE}.hostPID", f"{TEMPLATE}.hostPID"),
    ("hostIPC", pod(hostIPC=True), f"{TEMPLATE}.hostIPC", f"{TEMPLATE}.hostIPC"),
    ("hostNetwork false", pod(hostNetwork=False), None, None),
    (
        "hostPath",
        pod(volumes=[{"name": "root", "hostPath": {"path": "/"}}]),
        f"{TEMPLATE}.volumes[0].hostPath",
        f"{TEMPLATE}.volumes[0].hostPath",
    ),
    ("nfs volume", pod(volumes=[{"name": "d", "nfs": {"server": "s", "path": "/"}}]), None,
     f"{TEMPLATE}.volumes[0].nfs"),
    ("pvc volume", pod(volumes=[{"name": "d", "persistentVolumeClaim": {"claimName": "c"}}]),
     None, None),
    ("privileged", container(privileged=True), f"{C0}.securityContext.privileged",
     f"{C0}.securityContext.privileged"),
    (
        "privileged init container",
        pod(initContainers=[{"name": "i", "securityContext": {"privileged": True}}]),
        f"{TEMPLATE}.initContainers[0].securityContext.privileged",
        f"{TEMPLATE}.initContainers[0].securityContext.privileged",
    ),
    ("IPC_LOCK", container(capabilities={"add": ["IPC_LOCK"]}),
     f"{C0}.securityContext.capabilities.add[0]", f"{C0}.securityContext.capabilities.add[0]"),
    ("SYS_ADMIN", container(capabilities={"add": ["CHOWN", "SYS_ADMIN"]}),
     f"{C0}.securityContext.capabilities.add[1]", f"{C0}.securityContext.capabilities.add[0]"),
    ("NET_BIND_SERVICE", container(capabilities={"add": ["NET_BIND_SERVICE"]}), None, None),
    ("drop only some", container(capabilities={"drop": ["NET_RAW"]}), None,
     f"{C0}.securityContext.capabilities.drop"),
    ("seccomp Unconfined", container(seccompProfile={"type": "Unconfined"}),
     f"{C0}.securityContext.seccompProfile.type", f"{C0}.securityContext.seccompProfile.type"),
    ("pod seccomp Unconfined", pod(securityContext={"seccompProfile": {"type": "Unconfined"}}),
     f"{TEMPLATE}.securityContext.seccompProfile.type",
     f"{TEMPLATE}.securityContext.seccompProfile.type"),
    ("seccomp Localhost", container(seccompProfile={"type": "Localhost",
                                                    "localhostProfile": "p.json"}), None, None),
    ("procMount", container(procMount="Unmasked"), f"{C0}.securityContext.procMount",
     f"{C0}.securityContext.procMount"),
    ("unsafe sysctl", pod(securityContext={"sysctls": [{"name": "kernel.msgmax", "value": "1"}]}),
     f"{TEMPLATE}.securityContext.sysctls[0].name", f"{TEMPLATE}.securityContext.sysctls[0].name"),
    ("safe sysctl", pod(securityContext={"sysctls": [{"name": "net.ipv4.tcp_syncookies",
                                                      "value": "1"}]}), None, None),
    ("hostPort", pod(containers=[{"name": "trainer", "ports": [{"containerPort": 80,
                                                                "hostPort": 80}]}]),
     f"{C0}.ports[0].hostPort", f"{C0}.ports[0].hostPort"),
    ("AppArmor field", container(appArmorProfile={"type": "Unconfined"}),
     f"{C0}.securityContext.appArmorProfile.type", f"{C0}.securityContext.appArmorProfile.type"),
    (
        "AppArmor annotation",
        {"metadata": {"annotations": {
            "container.apparmor.security.beta.kubernetes.io/trainer": "unconfined"}}},
        "spec.podTemplate.metadata.annotations."
        "container.apparmor.security.beta.kubernetes.io/trainer",
        "spec.podTemplate.metadata.annotations."
        "container.apparmor.security.beta.kubernetes.io/trainer",
    ),
    ("SELinux type", container(seLinuxOptions={"type": "spc_t"}),
     f"{C0}.securityContext.seLinuxOptions.type", f"{C0}.securityContext.seLinuxOptions.type"),
    ("SELinux user", container(seLinuxOptions={"user": "system_u"}),
     f"{C0}.securityContext.seLinuxOptions.user", f"{C0}.securityContext.seLinuxOptions.user"),
    ("SELinux level", container(seLinuxOptions={"level": "s0:c1"}), None, None),
    ("Windows hostProcess", container(windowsOptions={"hostProcess": True}),
     f"{C0}.securityContext.windowsOptions.hostProcess",
     f"{C0}.securityContext.windowsOptions.hostProcess"),
    ("allowPrivilegeEscalation", container(allowPrivilegeEscalation=True), None,
     f"{C0}.securityContext.allowPrivilegeEscalation"),
    ("runAsNonRoot false", pod(securityContext={"runAsNonRoot": False}), None,
     f"{TEMPLATE}.securityContext.runAsNonRoot"),
    ("container runAsNonRoot false", container(runAsNonRoot=False), None,
     f"{C0}.securityContext.runAsNonRoot"),
    ("runAsUser 0", container(runAsUser=0), None, f"{C0}.securityContext.runAsUser"),
    ("runAsUser 1000", container(runAsUser=1000), None, None),
    ("nulls are unset", pod(automountServiceAccountToken=None,
                            securityContext={"runAsNonRoot": None, "seccompProfile": None},
                            containers=[{"name": "trainer", "securityContext": {
                                "allowPrivilegeEscalation": None, "privileged": None,
                                "runAsNonRoot": None, "capabilities": {"drop": None}}}]),
     None, None),
    ("null sections are unset", {"spec": None, "metadata": {"annotations": None}}, None, None),
    ("null pod fields are unset", pod(securityContext=None, initContainers=None,
                                      containers=[{"name": "side", "securityContext": None}]),
     None, None),
]  # fmt: skip


@pytest.mark.parametrize(
    ("template", "baseline", "restricted"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_the_pod_policy_levels_name_the_field_that_breaks_them(
    template: Any, baseline: str | None, restricted: str | None
) -> None:
    assert error_of(template, PodPolicy.PRIVILEGED) is None
    assert error_of(template, PodPolicy.BASELINE) == baseline
    assert error_of(template, PodPolicy.RESTRICTED) == restricted


def test_the_rule_says_which_policy_refused() -> None:
    ev = evaluate(make_job(podTemplate=pod(hostNetwork=True))["spec"], "job")
    assert ev.error is not None and "job pod policy is baseline" in ev.error.rule
    assert "host namespaces" in ev.error.rule


@pytest.mark.parametrize(
    ("template", "field"),
    [
        ("x", "spec.podTemplate"),
        ({"spec": "x"}, "spec.podTemplate.spec"),
        ({"metadata": []}, "spec.podTemplate.metadata"),
        ({"metadata": {"labels": {"a": 1}}}, "spec.podTemplate.metadata.labels.a"),
        (pod(securityContext="x"), f"{TEMPLATE}.securityContext"),
        (pod(containers="x"), f"{TEMPLATE}.containers"),
        (pod(containers=["x"]), f"{TEMPLATE}.containers[0]"),
        (pod(containers=[{"name": "c", "env": {"A": "1"}}]), f"{C0}.env"),
        (pod(containers=[{"name": "c", "volumeMounts": [None]}]), f"{C0}.volumeMounts[0]"),
        (pod(containers=[{"name": "c", "resources": []}]), f"{C0}.resources"),
        (pod(containers=[{"image": "busybox"}]), f"{C0}.name"),
        (container(capabilities=["ALL"]), f"{C0}.securityContext.capabilities"),
        (pod(volumes=[3]), f"{TEMPLATE}.volumes[0]"),
        (pod(affinity="near"), f"{TEMPLATE}.affinity"),
        (pod(nodeSelector={"deep": {"a": {"a": "b"}}}), f"{TEMPLATE}.nodeSelector.deep"),
        (pod(notAPodField=1), f"{TEMPLATE}.notAPodField"),
        # A set value of the wrong type: Kubernetes' schema refuses it before any pod policy.
        (pod(hostNetwork="true"), f"{TEMPLATE}.hostNetwork"),
        (container(privileged=1), f"{C0}.securityContext.privileged"),
        (container(allowPrivilegeEscalation=1), f"{C0}.securityContext.allowPrivilegeEscalation"),
        (pod(securityContext={"runAsNonRoot": 0}), f"{TEMPLATE}.securityContext.runAsNonRoot"),
        (container(runAsNonRoot="no"), f"{C0}.securityContext.runAsNonRoot"),
        (container(capabilities={"drop": "ALL"}), f"{C0}.securityContext.capabilities.drop"),
        (
            container(windowsOptions={"hostProcess": 1}),
            f"{C0}.securityContext.windowsOptions.hostProcess",
        ),
    ],
)
def test_a_malformed_template_is_invalid_with_its_field_named_under_any_policy(
    template: Any, field: str
) -> None:
    for policy in PodPolicy:
        ev = evaluate(make_job(podTemplate=template)["spec"], "job", Admission(policy))
        assert ev.error is not None and ev.error.field == field, (policy, ev.error)


def test_restricted_egress_needs_the_per_job_network_policy() -> None:
    spec = make_job(networking={"egress": {"policy": "Restricted"}})["spec"]
    assert evaluate(spec, "job").error is None
    refused = evaluate(spec, "job", Admission(network_policies=False)).error
    assert refused is not None and refused.field == "spec.networking.egress.policy"


def test_a_bad_egress_cidr_is_invalid_with_its_index() -> None:
    egress = {"policy": "Restricted", "allowedCIDRs": ["10.0.0.0/8", "ten"]}
    spec = make_job(networking={"egress": egress})["spec"]
    error = evaluate(spec, "job").error
    assert error is not None and error.field == "spec.networking.egress.allowedCIDRs[1]"


JOB = JobRef("train", "ns", "uid-1")


def test_an_open_job_gets_an_ingress_only_policy() -> None:
    settings = read_spec(make_job()["spec"])
    policy = build_network_policy(JOB, OperatorPeer("ops"), settings.networking.egress)
    assert policy["spec"]["policyTypes"] == ["Ingress"] and "egress" not in policy["spec"]


def test_restricted_egress_allows_dns_the_gang_and_the_cidrs_never_the_metadata_address() -> None:
    egress = {"policy": "Restricted",
              "allowedCIDRs": ["0.0.0.0/0", "10.20.0.0/16", "::/0", "2001:db8::/32"]}  # fmt: skip
    settings = read_spec(make_job(networking={"egress": egress})["spec"])
    policy = build_network_policy(JOB, OperatorPeer("ops"), settings.networking.egress)
    spec = policy["spec"]
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    dns, gang, cidrs = spec["egress"]
    # Port 53 of the cluster's DNS pods only (test_platform.py checks the whole rule).
    assert dns["to"][0]["podSelector"] == {"matchLabels": {"k8s-app": "kube-dns"}}
    assert dns["ports"] == [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]
    own = {"meshrun.dev/job-name": "train", "meshrun.dev/job-uid": "uid-1"}
    assert gang == {"to": [{"podSelector": {"matchLabels": own}}]}
    assert cidrs["to"] == [
        {"ipBlock": {"cidr": "0.0.0.0/0", "except": list(METADATA_ADDRESSES[:5])}},
        {"ipBlock": {"cidr": "10.20.0.0/16"}},
        {"ipBlock": {"cidr": "::/0", "except": list(METADATA_ADDRESSES[5:])}},
        {"ipBlock": {"cidr": "2001:db8::/32"}},
    ]
    # Only DNS and the gang when no CIDR is listed.
    bare = read_spec(make_job(networking={"egress": {"policy": "Restricted"}})["spec"])
    assert len(build_network_policy(JOB, None, bare.networking.egress)["spec"]["egress"]) == 2
