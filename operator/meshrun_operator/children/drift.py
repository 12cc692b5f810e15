"""A child of the job's whose labels or selector someone edited: what the operator judges by
them, how it tells, and the patch that sets them back.

The operator finds a job's Service and NetworkPolicy, and the pods they cover, by labels: the
job-name and job-uid labels pick the job's children out of the namespace, the Service's selector
gives the gang's pods their DNS names, and the NetworkPolicy's pod selector says whom it
guards. Edited (a label removed or changed, a selector pointed elsewhere), the child no longer
does its work while it still exists under the job's controller reference, so creating it again
finds the name taken by the job's own. Such a child is patched back instead, under its
resourceVersion (changed meanwhile: judged again at the next pass).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from meshrun_operator import names
from meshrun_operator.kinds import NETWORK_POLICY, SERVICE

SELECTOR_FIELD = {SERVICE.kind: "selector", NETWORK_POLICY.kind: "podSelector"}
"""The kinds whose drift is judged, and the field of their spec that selects the gang's pods."""


class Mark(NamedTuple):
    """What the children's index keeps of one child: the uid of the job that controls it, and
    whether its labels and selector are as the operator made them."""

    owner: str
    intact: bool


def mark(kind: str, job: str, metadata: Mapping[str, Any], owner: str, spec: object) -> Mark:
    """The index's entry for the job ``job``'s ``kind`` child controlled by ``owner``."""
    labels = metadata.get("labels")
    return Mark(owner, not drifted(kind, job, owner, labels, spec_selector(kind, spec)))


def own_labels(job: str, uid: str) -> dict[str, str]:
    """The labels every child of the job carries (children.owner.child_metadata)."""
    return {**names.job_labels(job, uid), names.LABEL_MANAGED_BY: names.MANAGED_BY}


def wanted_selector(kind: str, job: str, uid: str) -> dict[str, Any]:
    """The selector of the job's ``kind`` child, as the builders write it."""
    labels = names.job_labels(job, uid)
    return labels if kind == SERVICE.kind else {"matchLabels": labels}


def drifted(kind: str, job: str, uid: str, labels: object, selector: object) -> tuple[str, ...]:
    """What of the job's ``kind`` child (its ``labels`` and its spec's selector field) is no
    longer as the operator made it: ``labels``, ``selector``, both or neither."""
    changed = []
    own = own_labels(job, uid)
    if not isinstance(labels, Mapping) or any(labels.get(k) != v for k, v in own.items()):
        changed.append("labels")
    if kind in SELECTOR_FIELD and selector != wanted_selector(kind, job, uid):
        changed.append("selector")
    return tuple(changed)


def spec_selector(kind: str, spec: object) -> object:
    """The selector field of a ``kind`` child's ``spec`` (None when it has none)."""
    field = SELECTOR_FIELD.get(kind)
    return spec.get(field) if field and isinstance(spec, Mapping) else None


def repair_patch(
    kind: str, job: str, uid: str, labels: Mapping[str, str], resource_version: str
) -> list[dict[str, Any]]:
    """A JSON patch (RFC 6902) that sets the job's labels back among the child's ``labels`` and
    replaces its selector whole (a merge patch would keep keys someone added to it); applied
    only to the version judged: a changed resourceVersion makes the API server answer 409."""
    ops: list[dict[str, Any]] = [
        {"op": "replace", "path": "/metadata/resourceVersion", "value": resource_version},
        {"op": "add", "path": "/metadata/labels", "value": {**labels, **own_labels(job, uid)}},
    ]
    if kind in SELECTOR_FIELD:
        path = f"/spec/{SELECTOR_FIELD[kind]}"
        ops.append({"op": "add", "path": path, "value": wanted_selector(kind, job, uid)})
    return ops
