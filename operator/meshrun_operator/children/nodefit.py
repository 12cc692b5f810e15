"""Whether a job's pods may go on a node, as far as the node watch tells (seen.nodes.NodeInfo).

A node counts when it is Ready and not cordoned, the pod tolerates its NoSchedule and NoExecute
taints, and its labels satisfy the pod's ``nodeSelector`` and required node affinity (the
``matchExpressions`` of ``nodeSelectorTerms``: one term must match, every expression of it).
The same rules as the scheduler's NodeUnschedulable, TaintToleration and NodeAffinity filters,
https://kubernetes.io/docs/concepts/scheduling-eviction/assign-pod-node/.

Left out, because the scheduler judges them anyway and a preference built without them costs
locality at worst, never a placement: ``matchFields`` (node names), pod (anti-)affinity,
topology spread constraints, resources other than the accelerator, and the pod count limit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from meshrun_operator.seen.nodes import NodeInfo

NodeFilter = Callable[[NodeInfo], bool]
"""True when a pod may go on the node."""


def tolerates(tolerations: Sequence[Mapping[str, Any]], taint: tuple[str, str, str]) -> bool:
    """True when one of ``tolerations`` tolerates ``taint`` (key, value, effect)."""
    key, value, effect = taint
    for toleration in tolerations:
        if toleration.get("effect") and toleration["effect"] != effect:
            continue
        if toleration.get("key") and toleration["key"] != key:
            continue
        if toleration.get("operator") == "Exists":
            return True
        # Equal (the default) needs the key itself and the same value.
        if toleration.get("key") == key and str(toleration.get("value") or "") == value:
            return True
    return False


def _expression(labels: Mapping[str, str], expression: Mapping[str, Any]) -> bool:
    key, operator = str(expression.get("key")), expression.get("operator")
    values = [str(v) for v in expression.get("values") or []]
    present = key in labels
    if operator == "In":
        return present and labels[key] in values
    if operator == "NotIn":
        return not present or labels[key] not in values
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if operator in ("Gt", "Lt") and present and len(values) == 1:
        try:
            label, bound = int(labels[key]), int(values[0])
        except ValueError:
            return False
        return label > bound if operator == "Gt" else label < bound
    return False


def required_terms_match(labels: Mapping[str, str], terms: Sequence[Mapping[str, Any]]) -> bool:
    """True when one of ``nodeSelectorTerms`` matches ``labels`` (a term without expressions
    matches nothing, as in the scheduler; its ``matchFields`` are not judged)."""
    for term in terms:
        expressions = term.get("matchExpressions") or []
        if expressions and all(_expression(labels, e) for e in expressions):
            return True
        if not expressions and term.get("matchFields"):
            return True  # only node names asked for: not judged here
    return False


def node_filter(pod_spec: Mapping[str, Any]) -> NodeFilter:
    """Which nodes a pod with ``pod_spec`` (a podTemplate's spec) may go on."""
    tolerations: list[Mapping[str, Any]] = list(pod_spec.get("tolerations") or [])
    selector = {str(k): str(v) for k, v in (pod_spec.get("nodeSelector") or {}).items()}
    required = (
        ((pod_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        )
        or {}
    ).get("nodeSelectorTerms") or []

    def fits(node: NodeInfo) -> bool:
        if not node.view.ready or node.unschedulable:
            return False
        if any(not tolerates(tolerations, taint) for taint in node.taints):
            return False
        if any(node.labels.get(k) != v for k, v in selector.items()):
            return False
        return not required or required_terms_match(node.labels, required)

    return fits
