"""One job's children as the watches show them, with what the operator knows beyond the watch
(creates and deletes in flight, tombstones of deleted pods), reduced to an Observed.

Children are the job's by their controller reference (the job's API group, kind, name and uid,
``views.job_controller``): the pods index and the tombstones are keyed by namespace and the
job-name label, which an earlier job of the same name (still terminating) or an orphan
(``--cascade=orphan``) also carries; those come out as ``foreign``, never as the job's own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from meshrun_operator.seen.expectations import Expectations, Tombstones
from meshrun_operator.seen.views import NodeView, Observed


def observe(
    body: Mapping[str, Any],
    pods_index: Any,
    nodes_index: Any,
    expectations: Expectations,
    tombstones: Tombstones,
) -> Observed:
    """What is known of the job's children now (kopf's live indexes of pods and nodes)."""
    meta = body["metadata"]
    uid = meta.get("uid")
    store = pods_index.get((meta["namespace"], meta["name"]), []) if pods_index is not None else []
    own = [p for p in store if p.owner_uid == uid]
    # A pod with the job's name label that meshrun did not make is none of the operator's
    # business: it is neither waited for nor deleted (a name it holds is a NameConflict).
    foreign = tuple(p for p in store if p.owner_uid != uid and p.managed)
    creating, deleting = expectations.settle(str(uid), own)
    pods = tuple(replace(p, deleting=True) if p.uid in deleting else p for p in own)
    nodes, since = None, {}
    if nodes_index is not None:
        # Only the nodes the pods use: a node missing from the index has been deleted.
        used = {p.node for p in (*pods, *foreign) if p.node}
        views: dict[str, NodeView] = {
            name: next(iter(nodes_index[name])) for name in used if name in nodes_index
        }
        nodes = {name: view.ready for name, view in views.items()}
        since = {n: v.since for n, v in views.items() if not v.ready and v.since is not None}
    products = getattr(nodes_index, "gpu_products", None)  # the node watch keeps labels
    return Observed(
        pods=pods,
        nodes=nodes,
        products=products() if products is not None else None,
        not_ready_since=since,
        foreign=foreign,
        gone=tombstones.of(meta["namespace"], meta["name"], str(uid)),
        expected=creating,
    )
