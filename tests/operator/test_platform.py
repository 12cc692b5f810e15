"""The platform policy (scheduling, identity, volumes, grace, queue) and the platform's egress,
checked when a job's spec is evaluated and built into its children (no cluster)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from meshrun_operator import names
from meshrun_operator.children.builders import build_pod
from meshrun_operator.children.netpolicy import OperatorPeer, build_network_policy
from meshrun_operator.children.owner import JobRef
from meshrun_operator.children.platform import DnsPeer, PlatformEgress, PlatformPolicy
from meshrun_operator.children.podpolicy import PodPolicy
from meshrun_operator.lifecycle.evaluation import Admission, Evaluations, evaluate
from meshrun_operator.main import admission, parse_args
from operator_factories import make_job

from meshrun.api.read import read_spec

pytestmark = pytest.mark.unit

T = "spec.podTemplate.spec"
NAMESPACE_LABEL = "kubernetes.io/metadata.name"
JOB = JobRef("train", "ns", "uid-1")


def pod(**spec: Any) -> dict[str, Any]:
    return {"spec": spec}


def refusal(
    policy: PlatformPolicy | None = None, labels: dict[str, str] | None = None, **job: Any
) -> tuple[str, str] | None:
    """(field, rule) the evaluation refuses the job with, or None when it may run."""
    rules = Admission(platform=policy or PlatformPolicy())
    ev = evaluate(make_job(**job)["spec"], "job", rules, labels)
    return None if ev.error is None else (ev.error.field, ev.error.rule)


def field_of(template: Any, policy: PlatformPolicy | None = None, **job: Any) -> str | None:
    refused = refusal(policy, podTemplate=template, **job)
    return None if refused is None else refused[0]


def token(audience: str | None) -> dict[str, Any]:
    source: dict[str, Any] = {"path": "t"} | ({"audience": audience} if audience else {})
    projected = {"sources": [{"configMap": {"name": "c"}}, {"serviceAccountToken": source}]}
    return pod(volumes=[{"name": "t", "projected": projected}])


# (case, template, the field the default platform policy refuses or None)
CASES: list[tuple[str, Any, str | None]] = [
    ("nothing", {}, None),
    ("nodeName", pod(nodeName="control-plane-0"), f"{T}.nodeName"),
    ("empty nodeName", pod(nodeName=""), None),
    ("tolerate everything", pod(tolerations=[{"operator": "Exists"}]), f"{T}.tolerations[0].key"),
    (
        "tolerate the control plane",
        pod(
            tolerations=[
                {"key": "gpu", "operator": "Exists"},
                {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"},
            ]
        ),
        f"{T}.tolerations[1].key",
    ),
    (
        "tolerate master",
        pod(tolerations=[{"key": "node-role.kubernetes.io/master"}]),
        f"{T}.tolerations[0].key",
    ),
    (
        "tolerate a pool",
        pod(tolerations=[{"key": "pool", "value": "a", "effect": "NoSchedule"}]),
        None,
    ),
    ("own scheduler", pod(schedulerName="my-scheduler"), f"{T}.schedulerName"),
    (
        "template priority",
        pod(priorityClassName="system-node-critical"),
        f"{T}.priorityClassName",
    ),
    ("runtime class", pod(runtimeClassName="runc-unsandboxed"), f"{T}.runtimeClassName"),
    (
        "grace of a year",
        pod(terminationGracePeriodSeconds=31536000),
        f"{T}.terminationGracePeriodSeconds",
    ),
    ("grace of 300 s", pod(terminationGracePeriodSeconds=300), None),
    ("another service account", pod(serviceAccountName="cloud-admin"), f"{T}.serviceAccountName"),
    ("the deprecated alias", pod(serviceAccount="cloud-admin"), f"{T}.serviceAccount"),
    ("the default service account", pod(serviceAccountName="default"), None),
    (
        "nfs",
        pod(volumes=[{"name": "d", "nfs": {"server": "s", "path": "/"}}]),
        f"{T}.volumes[0].nfs",
    ),
    (
        "iscsi",
        pod(volumes=[{"name": "d", "iscsi": {"targetPortal": "t", "iqn": "i", "lun": 0}}]),
        f"{T}.volumes[0].iscsi",
    ),
    (
        "gitRepo",
        pod(volumes=[{"name": "d", "gitRepo": {"repository": "r"}}]),
        f"{T}.volumes[0].gitRepo",
    ),
    ("pvc", pod(volumes=[{"name": "d", "persistentVolumeClaim": {"claimName": "c"}}]), None),
    (
        "token for a cloud",
        token("sts.amazonaws.com"),
        f"{T}.volumes[0].projected.sources[1].serviceAccountToken.audience",
    ),
    (
        "token for the API server",
        token(None),
        f"{T}.volumes[0].projected.sources[1].serviceAccountToken.audience",
    ),
]


@pytest.mark.parametrize(("template", "field"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_the_default_platform_policy_names_the_field_that_breaks_it(
    template: Any, field: str | None
) -> None:
    assert field_of(template) == field
    # Under every pod policy level, privileged included: the platform policy is another axis.
    for level in PodPolicy:
        ev = evaluate(make_job(podTemplate=template)["spec"], "job", Admission(level))
        assert (None if ev.error is None else ev.error.field) == field, level


def test_the_rule_is_said_with_what_is_allowed() -> None:
    refused = refusal(podTemplate=pod(serviceAccountName="cloud-admin"))
    assert refused is not None
    assert refused[1] == (
        "service account cloud-admin is not allowed (allowed: default) (the operator's platform "
        "policy)"
    )
    refused = refusal(podTemplate=pod(terminationGracePeriodSeconds=31536000))
    assert refused is not None and "31536000 is more than the 300 s allowed" in refused[1]
    refused = refusal(podTemplate=pod(tolerations=[{"operator": "Exists"}]))
    assert refused is not None and "tolerates every taint" in refused[1]


def test_what_the_platform_allows_passes() -> None:
    policy = PlatformPolicy(
        service_accounts=frozenset({"default", "reader"}),
        runtime_classes=frozenset({"nvidia"}),
        volume_types=frozenset({"nfs", "persistentVolumeClaim"}),
        token_audiences=frozenset({"vault"}),
        max_grace_seconds=30,
    )
    allowed = pod(serviceAccountName="reader", runtimeClassName="nvidia",
                  volumes=[{"name": "d", "nfs": {"server": "s", "path": "/"}}],
                  terminationGracePeriodSeconds=30)  # fmt: skip
    assert field_of(allowed, policy) is None
    assert field_of(pod(terminationGracePeriodSeconds=31), policy) == (
        f"{T}.terminationGracePeriodSeconds"
    )
    assert field_of(token("vault"), policy) == f"{T}.volumes[0].projected"  # not listed
    audiences = PlatformPolicy(token_audiences=frozenset({"vault"}))
    assert field_of(token("vault"), audiences) is None
    anyone = PlatformPolicy(service_accounts=frozenset({"*"}))
    assert field_of(pod(serviceAccountName="anything"), anyone) is None


def test_the_jobs_priority_class_is_checked_and_wins_over_the_templates() -> None:
    critical = {"priorityClassName": "system-node-critical"}
    assert refusal(scheduling=critical) == (
        "spec.scheduling.priorityClassName",
        "PriorityClass system-node-critical is not allowed (allowed: *) (the operator's platform "
        "policy)",
    )
    assert refusal(scheduling={"priorityClassName": "training"}) is None
    listed = PlatformPolicy(priority_classes=frozenset({"training"}))
    assert refusal(listed, scheduling={"priorityClassName": "research"}) is not None
    named = PlatformPolicy(priority_classes=frozenset({"*", "system-cluster-critical"}))
    assert refusal(named, scheduling={"priorityClassName": "system-cluster-critical"}) is None
    # The template may repeat the job's class, not name another one.
    same = pod(priorityClassName="training")
    assert field_of(same, scheduling={"priorityClassName": "training"}) is None
    other = pod(priorityClassName="urgent")
    assert field_of(other, scheduling={"priorityClassName": "training"}) == f"{T}.priorityClassName"
    # What a pod is built with: the job's class, whatever the template says.
    ev = evaluate(make_job(scheduling={"priorityClassName": "training"})["spec"], "job")
    assert ev.spec is not None and ev.plan is not None
    spec = dataclasses.replace(ev.spec, pod_template=other)
    assert build_pod(JOB, spec, ev.plan, 0, 0, {})["spec"]["priorityClassName"] == "training"


def test_the_template_may_name_only_the_jobs_scheduler() -> None:
    same = pod(schedulerName="volcano")
    assert field_of(same, scheduling={"schedulerName": "volcano"}) is None
    assert field_of(same) == f"{T}.schedulerName"


def test_a_job_without_a_queue_gets_the_default_or_is_refused() -> None:
    default = PlatformPolicy(default_queue="team-queue")
    rules = Admission(platform=default)
    ev = evaluate(make_job()["spec"], "job", rules)
    assert ev.error is None and ev.spec is not None
    assert ev.spec.scheduling.queue_name == "team-queue"
    own = evaluate(make_job(scheduling={"queueName": "mine"})["spec"], "job", rules)
    assert own.spec is not None and own.spec.scheduling.queue_name == "mine"
    labelled = evaluate(make_job()["spec"], "job", rules, {names.KUEUE_QUEUE_LABEL: "labelled"})
    assert labelled.spec is not None and labelled.spec.scheduling.queue_name == "labelled"
    # volcano's queueName names volcano's queue: no Kueue LocalQueue is put there.
    volcano = evaluate(make_job(scheduling={"schedulerName": "volcano"})["spec"], "job", rules)
    assert volcano.spec is not None and volcano.spec.scheduling.queue_name is None

    required = PlatformPolicy(require_queue=True)
    assert refusal(required) == (
        "spec.scheduling.queueName",
        "must name a queue: every job on this cluster runs in one (the operator's platform "
        "policy requires a queue, and sets no default)",
    )
    assert refusal(required, scheduling={"queueName": "mine"}) is None
    assert refusal(required, {names.KUEUE_QUEUE_LABEL: "labelled"}) is None
    # Without a platform queue, a job without one runs outside Kueue as before.
    plain = evaluate(make_job()["spec"], "job")
    assert plain.spec is not None and plain.spec.scheduling.queue_name is None


def test_the_evaluation_follows_the_queue_label() -> None:
    evaluations = Evaluations(Admission(platform=PlatformPolicy(require_queue=True)))
    spec = make_job()["spec"]
    assert evaluations.of("uid-1", spec, "job", 1).error is not None
    labelled = evaluations.of("uid-1", spec, "job", 1, {names.KUEUE_QUEUE_LABEL: "q"})
    assert labelled.error is None and labelled.spec is not None
    assert labelled.spec.scheduling.queue_name == "q"


def test_the_platform_flags() -> None:
    options = parse_args([])
    assert options.platform == PlatformPolicy()
    options = parse_args(
        ["--allowed-service-accounts", "default, reader", "--allowed-priority-classes", "a,b",
         "--allowed-runtime-classes", "nvidia", "--allowed-volume-types", "nfs,secret",
         "--allowed-token-audiences", "vault", "--max-termination-grace-seconds", "60",
         "--default-queue", "team", "--require-queue", "--default-egress", "Restricted",
         "--egress-allowed-cidrs", "10.0.0.0/8", "--dns-namespace", "dns",
         "--dns-labels", "app=coredns", "--operator-namespace", "ops"]
    )  # fmt: skip
    assert options.platform == PlatformPolicy(
        service_accounts=frozenset({"default", "reader"}),
        priority_classes=frozenset({"a", "b"}),
        runtime_classes=frozenset({"nvidia"}),
        volume_types=frozenset({"nfs", "secret"}),
        token_audiences=frozenset({"vault"}),
        max_grace_seconds=60,
        default_queue="team",
        require_queue=True,
    )
    rules = admission(options)
    assert rules.platform == options.platform
    assert rules.egress == PlatformEgress(True, ("10.0.0.0/8",), DnsPeer("dns", {"app": "coredns"}))
    for bad in (
        ["--default-queue", "q", "--no-kueue"],
        ["--default-egress", "Restricted", "--no-network-policy"],
        ["--egress-allowed-cidrs", "ten"],
        ["--max-termination-grace-seconds", "-1"],
    ):
        with pytest.raises(SystemExit):
            parse_args(bad)


def egress_of(job: dict[str, Any], floor: PlatformEgress) -> list[dict[str, Any]] | None:
    spec = read_spec(job["spec"])
    policy = build_network_policy(JOB, OperatorPeer("ops"), spec.networking.egress, floor)
    rules: list[dict[str, Any]] | None = policy["spec"].get("egress")
    return rules


def test_the_dns_rule_reaches_the_clusters_dns_pods_only() -> None:
    rules = egress_of(make_job(networking={"egress": {"policy": "Restricted"}}), PlatformEgress())
    assert rules is not None
    assert rules[0] == {
        "to": [
            {
                "namespaceSelector": {
                    "matchLabels": {"kubernetes.io/metadata.name": "kube-system"}
                },
                "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
            }
        ],
        "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
    }


def test_every_metadata_address_is_carved_out() -> None:
    egress = {"policy": "Restricted", "allowedCIDRs": ["0.0.0.0/0", "::/0", "168.63.0.0/16"]}
    rules = egress_of(make_job(networking={"egress": egress}), PlatformEgress())
    assert rules is not None
    v4, v6, azure = (peer["ipBlock"] for peer in rules[2]["to"])
    assert v4["except"] == ["169.254.169.254/32", "168.63.129.16/32", "100.100.100.200/32",
                            "169.254.170.2/32", "169.254.170.23/32"]  # fmt: skip
    assert v6["except"] == ["fd00:ec2::254/128", "fd00:ec2::23/128"]
    assert azure == {"cidr": "168.63.0.0/16", "except": ["168.63.129.16/32"]}


def test_the_platforms_egress_cannot_be_opened_by_a_job() -> None:
    floor = PlatformEgress(restricted=True, allowed_cidrs=("10.0.0.0/8",))
    rules = egress_of(make_job(), floor)  # the job says nothing (Open by default)
    assert rules is not None and rules[2]["to"] == [{"ipBlock": {"cidr": "10.0.0.0/8"}}]
    opened = make_job(networking={"egress": {"policy": "Open", "allowedCIDRs": ["0.0.0.0/0"]}})
    ev = evaluate(opened["spec"], "job", Admission(egress=floor))
    assert ev.error is not None
    assert ev.error.field == "spec.networking.egress.allowedCIDRs[0]"
    assert "0.0.0.0/0 is outside the egress this cluster allows every job" in ev.error.rule
    inside = make_job(networking={"egress": {"policy": "Restricted",
                                             "allowedCIDRs": ["10.1.0.0/16"]}})  # fmt: skip
    assert evaluate(inside["spec"], "job", Admission(egress=floor)).error is None
    rules = egress_of(inside, floor)
    assert rules is not None
    assert [p["ipBlock"]["cidr"] for p in rules[2]["to"]] == ["10.0.0.0/8", "10.1.0.0/16"]
    # An operator without a platform floor leaves an Open job's egress alone.
    assert egress_of(make_job(), PlatformEgress()) is None
