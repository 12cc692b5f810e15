"""Kueue, pure part three: an admission turned into what each pod of the gang needs.

Kueue admits a Workload by writing ``status.admission``: per pod set the ResourceFlavor of
each resource and, with topology-aware scheduling, a topology assignment (how many pods go to
which domain). Kueue's own job integrations apply it by merging the flavors' node labels and
tolerations into the pod template and letting Kueue's ungater place gated pods; the operator
creates its pods itself, so it places each pod directly: the flavors' node labels and
tolerations, plus a node selector naming the pod's domain. Pods of a pod set take the domains
in the assignment's order, in pod-index order, so consecutive ranks share a domain and every
attempt of the gang lands on the same nodes. The pods also carry the labels and annotations by
which Kueue counts them as this Workload's (not as foreign usage of the nodes).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from meshrun_operator.kueue import (
    PODSET_LABEL,
    PREFERRED_TOPOLOGY_ANNOTATION,
    REQUIRED_TOPOLOGY_ANNOTATION,
    UNCONSTRAINED_TOPOLOGY_ANNOTATION,
    WORKLOAD_ANNOTATION,
    PodSetPlan,
)


class AdmissionError(ValueError):
    """An admission the pods cannot follow (a conflict, a missing flavor or pod set): like
    Kueue's FailedToStart, retrying does not help."""


@dataclass(frozen=True)
class PodAdmission:
    """What one pod gets from its Workload's admission, merged into the pod as built."""

    pod_set: str
    """The pod set's name (also the ``kueue.x-k8s.io/podset`` label)."""
    node_selector: dict[str, str] = field(default_factory=dict)
    """The flavors' node labels, plus the pod's topology domain (e.g. its hostname)."""
    tolerations: list[dict[str, Any]] = field(default_factory=list)
    """The flavors' tolerations (e.g. of a tainted GPU pool)."""
    labels: dict[str, str] = field(default_factory=dict)
    """Kueue's pod set label and any admission check's labels."""
    annotations: dict[str, str] = field(default_factory=dict)
    """The Workload's name and the topology annotation Kueue counts TAS pods by."""


def _level_value(values: Mapping[str, Any], index: int) -> str:
    if values.get("universal") is not None:
        return str(values["universal"])
    individual = values.get("individual") or {}
    root = str(individual["roots"][index])
    return f"{individual.get('prefix') or ''}{root}{individual.get('suffix') or ''}"


def topology_domains(assignment: Mapping[str, Any]) -> list[tuple[dict[str, str], int]]:
    """A ``topologyAssignment`` unpacked: (node selector, pod count) per domain, in order.

    The v1beta2 format stores domains in slices; per level a value is either ``universal`` (one
    for every domain of the slice) or ``individual`` (``prefix`` + root + ``suffix``), and pod
    counts are ``universal`` or ``individual`` the same way.
    """
    levels = [str(level) for level in assignment.get("levels") or []]
    domains = []
    for piece in assignment.get("slices") or []:
        counts = piece.get("podCounts") or {}
        per_level = piece.get("valuesPerLevel") or []
        for i in range(int(piece["domainCount"])):
            selector = {level: _level_value(per_level[k], i) for k, level in enumerate(levels)}
            count = (
                counts["universal"]
                if counts.get("universal") is not None
                else counts["individual"][i]
            )
            domains.append((selector, int(count)))
    return domains


def _merge(target: dict[str, str], extra: Mapping[str, str], what: str, pod_set: str) -> None:
    for key, value in extra.items():
        if target.get(key, value) != value:
            raise AdmissionError(
                f"pod set {pod_set}: {what} {key} is both {target[key]!r} and {value!r}"
            )
        target[key] = str(value)


def add_tolerations(target: list[dict[str, Any]], extra: Sequence[Mapping[str, Any]]) -> None:
    """Append the tolerations of ``extra`` that ``target`` lacks."""
    for toleration in extra:
        if dict(toleration) not in target:
            target.append(dict(toleration))


def _topology_annotation(pod_set_spec: Mapping[str, Any]) -> dict[str, str]:
    request = pod_set_spec.get("topologyRequest") or {}
    if request.get("required"):
        return {REQUIRED_TOPOLOGY_ANNOTATION: str(request["required"])}
    if request.get("preferred"):
        return {PREFERRED_TOPOLOGY_ANNOTATION: str(request["preferred"])}
    return {UNCONSTRAINED_TOPOLOGY_ANNOTATION: "true"}


def _pod_set_base(
    workload: Mapping[str, Any],
    assignment: Mapping[str, Any],
    flavors: Mapping[str, Mapping[str, Any]],
) -> PodAdmission:
    """What every pod of one pod set gets: flavors, admission check updates, Kueue's keys."""
    name = str(assignment["name"])
    base = PodAdmission(
        pod_set=name,
        labels={PODSET_LABEL: name},
        annotations={WORKLOAD_ANNOTATION: str(workload["metadata"]["name"])},
    )
    for flavor_name in sorted(set((assignment.get("flavors") or {}).values())):
        flavor = flavors.get(flavor_name)
        if flavor is None:
            raise AdmissionError(f"pod set {name}: ResourceFlavor {flavor_name} not found")
        spec = flavor.get("spec") or {}
        _merge(base.node_selector, spec.get("nodeLabels") or {}, "node label", name)
        add_tolerations(base.tolerations, spec.get("tolerations") or [])
    for check in (workload.get("status") or {}).get("admissionChecks") or []:
        if check.get("state") != "Ready":
            continue
        for update in check.get("podSetUpdates") or []:
            if update.get("name") == name:
                _merge(base.labels, update.get("labels") or {}, "label", name)
                _merge(base.annotations, update.get("annotations") or {}, "annotation", name)
                _merge(base.node_selector, update.get("nodeSelector") or {}, "node label", name)
                add_tolerations(base.tolerations, update.get("tolerations") or [])
    return base


def admit_pods(
    workload: Mapping[str, Any],
    flavors: Mapping[str, Mapping[str, Any]],
    sets: Sequence[PodSetPlan],
) -> dict[int, PodAdmission]:
    """Per pod index, what the Workload's admission asks of that pod.

    ``flavors``: the ResourceFlavor objects by name (at least those the admission names);
    ``sets``: the job's pod sets (kueue.pod_sets of its plan). Raises AdmissionError when the
    admission does not cover every pod.
    """
    admission = (workload.get("status") or {}).get("admission")
    if not admission:
        raise AdmissionError(f"Workload {workload['metadata']['name']} is not admitted")
    specs = {str(p.get("name")): p for p in (workload.get("spec") or {}).get("podSets") or []}
    assignments = {str(a["name"]): a for a in admission.get("podSetAssignments") or []}
    result: dict[int, PodAdmission] = {}
    for pod_set in sets:
        assignment = assignments.get(pod_set.name)
        if assignment is None:
            raise AdmissionError(f"the admission has no assignment for pod set {pod_set.name}")
        base = _pod_set_base(workload, assignment, flavors)
        domains: list[dict[str, str]] = []
        if assignment.get("topologyAssignment"):
            base.annotations.update(_topology_annotation(specs.get(pod_set.name) or {}))
            for selector, count in topology_domains(assignment["topologyAssignment"]):
                domains.extend([selector] * count)
            if len(domains) < len(pod_set.pod_indices):
                raise AdmissionError(
                    f"pod set {pod_set.name}: the topology assignment places {len(domains)} "
                    f"of {len(pod_set.pod_indices)} pods"
                )
        for position, index in enumerate(pod_set.pod_indices):
            pod = copy.deepcopy(base)
            if domains:
                _merge(pod.node_selector, domains[position], "node label", pod_set.name)
            result[index] = pod
    return result


def apply_admission(pod: Mapping[str, Any], admission: PodAdmission) -> dict[str, Any]:
    """A copy of ``pod`` with its admission merged in. A node label the pod already selects
    with another value is a conflict (AdmissionError): the pod could never be placed."""
    result = copy.deepcopy(dict(pod))
    metadata = result.setdefault("metadata", {})
    spec = result.setdefault("spec", {})
    where = f"pod {metadata.get('name')}"
    _merge(metadata.setdefault("labels", {}), admission.labels, "label", where)
    _merge(metadata.setdefault("annotations", {}), admission.annotations, "annotation", where)
    _merge(spec.setdefault("nodeSelector", {}), admission.node_selector, "node label", where)
    add_tolerations(spec.setdefault("tolerations", []), admission.tolerations)
    return result
