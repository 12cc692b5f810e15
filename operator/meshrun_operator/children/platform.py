"""The platform policy: what the platform team allows every job's pods, beyond the Pod Security
Standards level (podpolicy.py), in scheduling and identity. A job's author cannot loosen it.

The levels of podpolicy.py judge a pod's isolation from its node; they say nothing of where it
is scheduled, at which priority, under which identity or for how long it may refuse to stop.
The operator creates the pods with its own service account, so without these rules anyone who
may create a ParallelTrainingJob could have it create a pod

- bound to a node of its choosing past the scheduler, the gang and Kueue (``nodeName``), or onto
  the control plane (a toleration of its taints, or ``operator: Exists`` with no key, which
  tolerates every taint);
- scheduled by another scheduler than the one the job names (``schedulerName``);
- at ``system-node-critical`` priority, preempting everyone else's pods;
- under another runtime class (less isolation, or a node pool's runtime);
- holding its GPUs for a year after Kueue preempts it (``terminationGracePeriodSeconds`` with a
  trainer that traps SIGTERM: the preemptor waits for the grace period);
- as any service account of the namespace (a cloud identity through a workload-identity
  webhook), with service-account tokens projected for any audience;
- mounting nfs, iscsi or gitRepo volumes (a node-side mount of any server, a git clone run by
  the kubelet).

Each rule is an operator flag and a value of the chart (``platformPolicy``); the defaults are
safe. A template that breaks one makes the job Invalid, the field and the rule named, before any
pod is made. The same policy gives a job without a queue the platform's default Kueue queue, or
refuses it where a queue is required (:func:`with_queue`), and may restrict every job's egress
(:class:`PlatformEgress`, built into each job's NetworkPolicy by netpolicy.py), which a job can
narrow but not open (:func:`refuse_outside`).
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from meshrun.api.errors import SpecError
from meshrun.api.spec import Egress, JobSpec
from meshrun_operator import names
from meshrun_operator.children.podpolicy import RESTRICTED_VOLUMES, TEMPLATE

ANY = "*"
"""In a list of allowed names: every name (priority classes: every name but ``system-*``)."""

SYSTEM_PRIORITY_PREFIX = "system-"
"""Kubernetes reserves PriorityClass names with this prefix for its own critical pods
(system-node-critical, system-cluster-critical): allowed only when named one by one."""

CONTROL_PLANE_TAINTS = frozenset(
    {"node-role.kubernetes.io/control-plane", "node-role.kubernetes.io/master"}
)
"""The taints that keep workloads off control-plane nodes (kubeadm's, old and new)."""

DEFAULT_GRACE_SECONDS = 300
"""Longest terminationGracePeriodSeconds a template may set by default: time enough for a
checkpoint on the way out, short enough that a preemption or a suspend frees the GPUs."""


@dataclass(frozen=True)
class PlatformPolicy:
    """What every job's pods are allowed in scheduling and identity (the operator's flags)."""

    service_accounts: frozenset[str] = frozenset({"default"})
    """Service accounts a pod may run as (``*``: any of the namespace's)."""
    priority_classes: frozenset[str] = frozenset({ANY})
    """PriorityClasses a job may name (``*``: any but the ``system-`` ones, which must be
    listed by name)."""
    runtime_classes: frozenset[str] = frozenset()
    """RuntimeClasses a pod may name (``*``: any); none by default (the node's default)."""
    volume_types: frozenset[str] = RESTRICTED_VOLUMES
    """Volume types a template may use (``*``: any); hostPath is the pod policy level's."""
    token_audiences: frozenset[str] = frozenset()
    """Audiences a projected service-account token may be issued for (``*``: any)."""
    max_grace_seconds: int = DEFAULT_GRACE_SECONDS
    """Longest terminationGracePeriodSeconds a template may set."""
    default_queue: str | None = None
    """The Kueue LocalQueue of a job that names none."""
    require_queue: bool = False
    """A job that names no Kueue queue is refused (unless a default queue is set)."""


def _allows(allowed: frozenset[str], name: object) -> bool:
    return isinstance(name, str) and (ANY in allowed or name in allowed)


def _m(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _l(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def check(spec: JobSpec, policy: PlatformPolicy) -> None:
    """SpecError naming the first field of the job that breaks the platform policy."""
    for field, rule in violations(spec, policy):
        raise SpecError(field, f"{rule} (the operator's platform policy)")


NODE_NAME_RULE = (
    "may not be set: pods are placed by the scheduler, the gang and Kueue (use nodeSelector or "
    "affinity)"
)
SCHEDULER_RULE = "may not differ from spec.scheduling.schedulerName (name the scheduler there)"
PRIORITY_RULE = (
    "may not differ from spec.scheduling.priorityClassName (name the class there: it is also "
    "the gang's and the Workload's)"
)
NO_KEY_RULE = (
    "must name a taint (a toleration without a key tolerates every taint, the control plane's "
    "among them)"
)
NO_AUDIENCE_RULE = (
    "must name an audience (unset means the API server's; set automountServiceAccountToken "
    "for that one)"
)


def violations(spec: JobSpec, policy: PlatformPolicy) -> Iterator[tuple[str, str]]:
    """(field, rule) of each part of the job that breaks ``policy``. The template's shape was
    checked before (podpolicy.template_shape); what is not an object or list here breaks no
    rule of this policy and is the API server's to judge."""
    pod = _m(_m(spec.pod_template).get("spec"))
    where = f"{TEMPLATE}.spec"
    scheduling = spec.scheduling
    if pod.get("nodeName") not in (None, ""):
        yield f"{where}.nodeName", NODE_NAME_RULE
    if pod.get("schedulerName") not in (None, "", scheduling.scheduler_name):
        yield f"{where}.schedulerName", SCHEDULER_RULE
    if pod.get("priorityClassName") not in (None, "", scheduling.priority_class_name):
        yield f"{where}.priorityClassName", PRIORITY_RULE
    job_class = scheduling.priority_class_name
    if job_class and not _priority_allowed(policy.priority_classes, job_class):
        rule = f"PriorityClass {job_class} is not allowed ({_listed(policy.priority_classes)})"
        yield "spec.scheduling.priorityClassName", rule
    runtime = pod.get("runtimeClassName")
    if runtime is not None and not _allows(policy.runtime_classes, runtime):
        rule = f"RuntimeClass {runtime} is not allowed ({_listed(policy.runtime_classes)})"
        yield f"{where}.runtimeClassName", rule
    for key in ("serviceAccountName", "serviceAccount"):  # the second, deprecated, is an alias
        account = pod.get(key)
        if account not in (None, "") and not _allows(policy.service_accounts, account):
            rule = f"service account {account} is not allowed ({_listed(policy.service_accounts)})"
            yield f"{where}.{key}", rule
    grace = pod.get("terminationGracePeriodSeconds")
    if isinstance(grace, int | float) and grace > policy.max_grace_seconds:
        rule = (
            f"{grace} is more than the {policy.max_grace_seconds} s allowed (a preemption or a "
            "suspend waits that long for the pods to stop)"
        )
        yield f"{where}.terminationGracePeriodSeconds", rule
    for index, toleration in enumerate(map(_m, _l(pod.get("tolerations")))):
        taint = toleration.get("key")
        if taint in (None, ""):
            yield f"{where}.tolerations[{index}].key", NO_KEY_RULE
        elif taint in CONTROL_PLANE_TAINTS:
            rule = f"may not tolerate the control plane's taint {taint}"
            yield f"{where}.tolerations[{index}].key", rule
    yield from _volumes(_l(pod.get("volumes")), f"{where}.volumes", policy)


def _listed(allowed: frozenset[str]) -> str:
    return "allowed: " + (", ".join(sorted(allowed)) or "none")


def _priority_allowed(allowed: frozenset[str], name: str) -> bool:
    if name in allowed:
        return True
    return ANY in allowed and not name.startswith(SYSTEM_PRIORITY_PREFIX)


def _volumes(volumes: list[Any], where: str, policy: PlatformPolicy) -> Iterator[tuple[str, str]]:
    for index, volume in enumerate(map(_m, volumes)):
        field = f"{where}[{index}]"
        for kind in volume:
            if kind not in ("name", "hostPath") and not _allows(policy.volume_types, kind):
                rule = f"volume type {kind} is not allowed ({_listed(policy.volume_types)})"
                yield f"{field}.{kind}", rule
        sources = _l(_m(volume.get("projected")).get("sources"))
        for number, source in enumerate(map(_m, sources)):
            if "serviceAccountToken" not in source:
                continue
            audience = _m(source["serviceAccountToken"]).get("audience")
            path = f"{field}.projected.sources[{number}].serviceAccountToken.audience"
            if audience in (None, ""):
                yield path, NO_AUDIENCE_RULE
            elif not _allows(policy.token_audiences, audience):
                rule = f"a token for {audience} is not allowed ({_listed(policy.token_audiences)})"
                yield path, rule


def with_queue(spec: JobSpec, labels: Mapping[str, Any] | None, policy: PlatformPolicy) -> JobSpec:
    """``spec`` with the Kueue queue it runs in: its own ``spec.scheduling.queueName``, else its
    ``kueue.x-k8s.io/queue-name`` label, else the platform's default queue. SpecError when none
    is given and the platform requires one. A volcano job's queueName names volcano's queue: no
    Kueue default is put there."""
    scheduling = spec.scheduling
    label = _m(labels).get(names.KUEUE_QUEUE_LABEL)
    queue = scheduling.queue_name or (label if isinstance(label, str) and label else None)
    volcano = scheduling.scheduler_name == "volcano"
    if queue is None and policy.default_queue and not volcano:
        queue = policy.default_queue
    if queue is None and policy.require_queue:
        raise SpecError(
            "spec.scheduling.queueName",
            "must name a queue: every job on this cluster runs in one (the operator's "
            "platform policy requires a queue, and sets no default)",
        )
    if queue == scheduling.queue_name:
        return spec
    return dataclasses.replace(spec, scheduling=dataclasses.replace(scheduling, queue_name=queue))


@dataclass(frozen=True)
class DnsPeer:
    """Where the cluster's DNS pods run: the only pods a restricted job reaches on port 53."""

    namespace: str = "kube-system"
    """Their namespace."""
    labels: Mapping[str, str] = dataclasses.field(default_factory=lambda: {"k8s-app": "kube-dns"})
    """Labels that select them there (CoreDNS keeps kube-dns's k8s-app label)."""


@dataclass(frozen=True)
class PlatformEgress:
    """The platform's egress for every job (``--default-egress``): a job cannot open it."""

    restricted: bool = False
    """Every job's egress is restricted, whatever its spec.networking.egress.policy says."""
    allowed_cidrs: tuple[str, ...] = ()
    """CIDRs every restricted job may reach; a job's own must lie inside them when the
    platform restricts."""
    dns: DnsPeer = dataclasses.field(default_factory=DnsPeer)
    """The cluster's DNS pods."""


def refuse_outside(egress: Egress, floor: PlatformEgress) -> None:
    """SpecError naming a CIDR the job lists outside the platform's, when the platform
    restricts every job's egress (a job may narrow it, never widen it)."""
    if not floor.restricted:
        return
    allowed = [ipaddress.ip_network(cidr, strict=False) for cidr in floor.allowed_cidrs]
    for index, cidr in enumerate(egress.allowed_cidrs or []):
        network = ipaddress.ip_network(cidr, strict=False)
        if not any(
            network.version == a.version and network.subnet_of(a)  # type: ignore[arg-type]
            for a in allowed
        ):
            raise SpecError(
                f"spec.networking.egress.allowedCIDRs[{index}]",
                f"{cidr} is outside the egress this cluster allows every job "
                f"({', '.join(floor.allowed_cidrs) or 'no CIDR'}; the operator's platform policy)",
            )


def _names(text: str) -> frozenset[str]:
    return frozenset(filter(None, (part.strip() for part in text.split(","))))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The platform policy's flags (Helm values under platformPolicy)."""
    group = parser.add_argument_group(
        "platform policy (what every job's pods may use; comma-separated lists, * for any)"
    )
    group.add_argument(
        "--allowed-service-accounts",
        default="default",
        help="service accounts a job's pods may run as (default: default)",
    )
    group.add_argument(
        "--allowed-priority-classes",
        default=ANY,
        help="PriorityClasses a job may name; * (the default) allows all but the system- ones, "
        "which must be listed by name",
    )
    group.add_argument(
        "--allowed-runtime-classes",
        default="",
        help="RuntimeClasses a job's pods may name (default: none, the node's default runtime)",
    )
    group.add_argument(
        "--allowed-volume-types",
        default=",".join(sorted(RESTRICTED_VOLUMES)),
        help="volume types a pod template may use (default: the restricted level's; hostPath "
        "is --job-pod-policy's)",
    )
    group.add_argument(
        "--allowed-token-audiences",
        default="",
        help="audiences a projected service-account token may be issued for (default: none)",
    )
    group.add_argument(
        "--max-termination-grace-seconds",
        type=int,
        default=DEFAULT_GRACE_SECONDS,
        help="longest terminationGracePeriodSeconds a pod template may set (default "
        f"{DEFAULT_GRACE_SECONDS})",
    )
    group.add_argument(
        "--default-queue",
        default="",
        help="the Kueue LocalQueue of a job that names none (default: none, such a job runs "
        "outside Kueue unless --require-queue)",
    )
    group.add_argument(
        "--require-queue",
        action="store_true",
        help="refuse a job that names no Kueue queue (when no --default-queue is set)",
    )


def from_args(args: argparse.Namespace, parser: argparse.ArgumentParser) -> PlatformPolicy:
    """The platform policy asked for on the command line; bad values exit 2."""
    if args.max_termination_grace_seconds < 0:
        parser.error("--max-termination-grace-seconds: must be 0 or more")
    queued = args.default_queue or args.require_queue
    if queued and getattr(args, "no_kueue", False):
        parser.error("--default-queue and --require-queue need Kueue (drop --no-kueue)")
    return PlatformPolicy(
        service_accounts=_names(args.allowed_service_accounts),
        priority_classes=_names(args.allowed_priority_classes),
        runtime_classes=_names(args.allowed_runtime_classes),
        volume_types=_names(args.allowed_volume_types),
        token_audiences=_names(args.allowed_token_audiences),
        max_grace_seconds=args.max_termination_grace_seconds,
        default_queue=args.default_queue or None,
        require_queue=args.require_queue,
    )
