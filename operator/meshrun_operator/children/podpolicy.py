"""The pod policy a platform team sets for every job (``--job-pod-policy``): the Kubernetes Pod
Security Standards' levels, checked on a job's pod template when its spec is evaluated.

A job's author writes ``spec.podTemplate``; the operator creates the pods with its own service
account. Without a check here, anyone who may create a ParallelTrainingJob could have the
operator create a pod with ``hostNetwork``, ``privileged`` or a hostPath of ``/``. The levels are
Kubernetes' own (https://kubernetes.io/docs/concepts/security/pod-security-standards/):

- ``privileged``: no check (InfiniBand pods that need ``IPC_LOCK`` or ``hostNetwork``);
- ``baseline`` (the default): no host namespaces, hostPath, host ports, privileged containers,
  added capabilities beyond the baseline list, unsafe sysctls, /proc mounts, Unconfined
  seccomp or AppArmor, custom SELinux users, roles or types, or Windows host processes;
- ``restricted``: baseline, and only the volume types restricted allows, runAsNonRoot, no root
  user, no privilege escalation, every capability dropped but NET_BIND_SERVICE, and seccomp
  RuntimeDefault or Localhost.

The operator's own defaults (podtemplate.restricted_security) fill in what the template leaves
unset (a null is unset), so only what the template sets explicitly can break a level, and a
field set to anything but the value a level requires breaks it. :func:`template_shape`
first checks that the template has the shape of a PodTemplateSpec where the operator edits it,
so a malformed one is refused with its field named rather than failing every reconcile.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator, Mapping
from enum import StrEnum
from typing import Any

from meshrun.api.errors import SpecError

TEMPLATE = "spec.podTemplate"


class PodPolicy(StrEnum):
    """A Pod Security Standards level."""

    PRIVILEGED = "privileged"
    BASELINE = "baseline"
    RESTRICTED = "restricted"


BASELINE_CAPABILITIES = frozenset(
    {
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "MKNOD",
        "NET_BIND_SERVICE",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    }
)
SAFE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
    }
)
SELINUX_TYPES = frozenset(
    {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
)
RESTRICTED_VOLUMES = frozenset(
    {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
)
VOLUME_META = frozenset({"name"})
APPARMOR_PREFIX = "container.apparmor.security.beta.kubernetes.io/"
CONTAINER_LISTS = ("initContainers", "containers")
OBJECTS = ("securityContext", "resources", "affinity")
LISTS = ("volumes", "env", "volumeMounts", "ports", "tolerations")


def _object(value: object, field: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        shown = "null" if value is None else type(value).__name__
        raise SpecError(field, f"must be an object, got {shown} (leave the field out to unset it)")
    return value


def _list(value: object, field: str) -> list[Any]:
    if not isinstance(value, list):
        shown = "null" if value is None else type(value).__name__
        raise SpecError(field, f"must be a list, got {shown} (leave the field out to unset it)")
    return value


def _entries(value: object, field: str) -> None:
    for index, item in enumerate(_list(value, field)):
        _object(item, f"{field}[{index}]")


def _m(value: object) -> Mapping[str, Any]:
    """``value`` when it is an object, else empty (a deeper shape is the API server's to judge)."""
    return value if isinstance(value, Mapping) else {}


def _l(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _other_than(value: object, required: bool) -> bool:
    """Whether ``value`` is set to anything but ``required``. A null is unset, as a missing key
    is: the operator's defaults fill both in (podtemplate.restricted_security), so a rule that
    tested for the forbidden value alone would let a null, a number or a string through."""
    return value is not None and value is not required


def template_shape(template: object) -> None:
    """SpecError unless the template is a PodTemplateSpec where the operator reads or edits it:
    ``metadata`` and ``spec`` objects, string labels and annotations, containers a list of
    objects, and their security contexts, resources, env, mounts and ports of the right kind."""
    root = _object(template, TEMPLATE)
    if "metadata" in root:
        meta = _object(root["metadata"], f"{TEMPLATE}.metadata")
        for key in ("labels", "annotations"):
            if key in meta:
                values = _object(meta[key], f"{TEMPLATE}.metadata.{key}")
                for name, value in values.items():
                    if not isinstance(value, str):
                        where = f"{TEMPLATE}.metadata.{key}.{name}"
                        raise SpecError(where, f"must be a string, got {value!r}")
    if "spec" not in root:
        return
    spec = _object(root["spec"], f"{TEMPLATE}.spec")
    where = f"{TEMPLATE}.spec"
    for key in OBJECTS:
        if key in spec:
            _object(spec[key], f"{where}.{key}")
    for key in ("volumes", "tolerations"):
        if key in spec:
            _entries(spec[key], f"{where}.{key}")
    for kind in CONTAINER_LISTS:
        if kind not in spec:
            continue
        for index, container in enumerate(_list(spec[kind], f"{where}.{kind}")):
            path = f"{where}.{kind}[{index}]"
            fields = _object(container, path)
            for key in OBJECTS[:2]:
                if key in fields:
                    _object(fields[key], f"{path}.{key}")
            for key in LISTS[1:4]:
                if key in fields:
                    _entries(fields[key], f"{path}.{key}")
            security = fields.get("securityContext") or {}
            if "capabilities" in security:
                _object(security["capabilities"], f"{path}.securityContext.capabilities")


def check(template: object, policy: PodPolicy) -> None:
    """SpecError naming the first field of the template that breaks ``policy`` (or its shape)."""
    if template is None:
        return
    template_shape(template)
    if policy is PodPolicy.PRIVILEGED:
        return
    for field, rule in violations(_m(template), policy):
        raise SpecError(field, f"{rule} (the operator's job pod policy is {policy})")


def violations(template: Mapping[str, Any], policy: PodPolicy) -> Iterator[tuple[str, str]]:
    """(field, rule) of each part of a well-shaped template that breaks ``policy``."""
    spec = _m(template.get("spec"))
    where = f"{TEMPLATE}.spec"
    restricted = policy is PodPolicy.RESTRICTED
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if _other_than(spec.get(key), False):
            yield f"{where}.{key}", "host namespaces are not allowed (must be false or unset)"
    pod_security = _m(spec.get("securityContext"))
    yield from _security(pod_security, f"{where}.securityContext", restricted, pod=True)
    for index, sysctl in enumerate(_l(pod_security.get("sysctls"))):
        name = _m(sysctl).get("name")
        if name not in SAFE_SYSCTLS:
            field = f"{where}.securityContext.sysctls[{index}].name"
            yield field, f"sysctl {name!r} is not one of the safe sysctls"
    annotations = _m(_m(template.get("metadata")).get("annotations"))
    for key, value in annotations.items():
        if key.startswith(APPARMOR_PREFIX) and not _apparmor_annotation_ok(value):
            field = f"{TEMPLATE}.metadata.annotations.{key}"
            yield field, f"AppArmor profile {value!r} is not allowed (runtime/default, localhost/*)"
    for index, volume in enumerate(map(_m, _l(spec.get("volumes")))):
        field = f"{where}.volumes[{index}]"
        if "hostPath" in volume:
            yield f"{field}.hostPath", "hostPath volumes are not allowed"
        if restricted:
            kinds = [k for k in volume if k not in VOLUME_META and k not in RESTRICTED_VOLUMES]
            for kind in kinds:
                yield f"{field}.{kind}", f"volume type {kind} is not allowed under restricted"
    every: list[Mapping[str, Any]] = []
    for kind in (*CONTAINER_LISTS, "ephemeralContainers"):
        for index, container in enumerate(map(_m, _l(spec.get(kind)))):
            path = f"{where}.{kind}[{index}]"
            security = _m(container.get("securityContext"))
            every.append(security)
            yield from _security(security, f"{path}.securityContext", restricted, pod=False)
            for port_index, port in enumerate(map(_m, _l(container.get("ports")))):
                if port.get("hostPort") not in (None, 0):
                    yield f"{path}.ports[{port_index}].hostPort", "host ports are not allowed"
    # Restricted: runAsNonRoot true for the pod, or for every container (the operator's own
    # trainer container among them when the template has none).
    containers_say = bool(every) and all(s.get("runAsNonRoot") is True for s in every)
    if restricted and _other_than(pod_security.get("runAsNonRoot"), True) and not containers_say:
        yield f"{where}.securityContext.runAsNonRoot", "must be true or unset under restricted"


def _security(
    security: Mapping[str, Any], path: str, restricted: bool, pod: bool
) -> Iterator[tuple[str, str]]:
    """The rules on a pod's or a container's securityContext."""
    if not pod:
        if _other_than(security.get("privileged"), False):
            yield f"{path}.privileged", "privileged containers are not allowed (false or unset)"
        if security.get("procMount") not in (None, "Default"):
            yield f"{path}.procMount", "only the Default /proc mount is allowed"
        capabilities = _m(security.get("capabilities"))
        allowed = {"NET_BIND_SERVICE"} if restricted else BASELINE_CAPABILITIES
        for index, name in enumerate(_l(capabilities.get("add"))):
            if name not in allowed:
                yield f"{path}.capabilities.add[{index}]", f"capability {name} may not be added"
        drop = capabilities.get("drop")
        if restricted and drop is not None and "ALL" not in _l(drop):
            yield f"{path}.capabilities.drop", "must drop ALL under restricted"
        if restricted and _other_than(security.get("allowPrivilegeEscalation"), False):
            yield f"{path}.allowPrivilegeEscalation", "must be false or unset under restricted"
        if restricted and _other_than(security.get("runAsNonRoot"), True):
            yield f"{path}.runAsNonRoot", "must be true or unset under restricted"
    seccomp = _m(security.get("seccompProfile")).get("type")
    confined = seccomp in (None, "RuntimeDefault", "Localhost")
    if seccomp == "Unconfined" or (restricted and not confined):
        yield f"{path}.seccompProfile.type", f"seccomp profile {seccomp} is not allowed"
    apparmor = _m(security.get("appArmorProfile")).get("type")
    if apparmor not in (None, "RuntimeDefault", "Localhost"):
        yield f"{path}.appArmorProfile.type", f"AppArmor profile {apparmor} is not allowed"
    selinux = _m(security.get("seLinuxOptions"))
    if selinux.get("type", "") not in SELINUX_TYPES:
        yield f"{path}.seLinuxOptions.type", f"SELinux type {selinux.get('type')!r} is not allowed"
    for key in ("user", "role"):
        if selinux.get(key):
            yield f"{path}.seLinuxOptions.{key}", f"a custom SELinux {key} is not allowed"
    if _other_than(_m(security.get("windowsOptions")).get("hostProcess"), False):
        yield f"{path}.windowsOptions.hostProcess", "Windows host processes are not allowed"
    if restricted and security.get("runAsUser") == 0:
        yield f"{path}.runAsUser", "must not be 0 (root) under restricted"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The operator's ``--job-pod-policy`` flag (Helm value jobPodPolicy)."""
    parser.add_argument(
        "--job-pod-policy",
        choices=[level.value for level in PodPolicy],
        default=PodPolicy.BASELINE.value,
        help="the Pod Security Standards level every job's podTemplate must meet, checked when "
        "its spec is evaluated (a job that breaks it is Invalid, the field named); default "
        "baseline; privileged lets jobs use hostNetwork, IPC_LOCK and the like (InfiniBand)",
    )


def from_args(args: argparse.Namespace) -> PodPolicy:
    return PodPolicy(args.job_pod_policy)


def _apparmor_annotation_ok(value: object) -> bool:
    return value == "runtime/default" or (isinstance(value, str) and value.startswith("localhost/"))
