"""Which topology domains (values of ``spec.scheduling.topologyKey``, e.g. racks) each pipeline
stage of a job should go to, from the nodes' free accelerators. Pure: placer.py gathers what it
reads (the node watch, the operator's own pods, what other jobs were promised).

A domain's room is how many of the job's pods it can take: over its nodes that the pods may go on
(nodefit.py), each node's free accelerators divided by the pod's, less what other jobs' pods not
yet bound were promised there. Stages are placed in order, each by best fit:

- a stage that fits one domain gets the domain with the least room that holds it (a small stage
  fills a partly used rack rather than breaking into an empty one);
- a stage that fits none gets the fewest domains: the roomiest first, and for the last part the
  domain with the least room that holds the rest (the way Kueue's topology-aware scheduling fits
  a pod set that outgrows one domain).

Domains taken by earlier stages of the job count as taken. Among equals the domain nearest the
previous stage's, in the domains' natural order (rack-2 next to rack-1 and rack-3), wins: a
pipeline's neighbouring stages then sit in neighbouring domains, which often share the next level
up (a block or a spine switch).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence

from meshrun_operator.children.nodefit import NodeFilter
from meshrun_operator.seen.nodes import NodeInfo

StagePlacement = dict[str, int]
"""Domain -> how many of a stage's pods go there, in the order the domains were chosen."""


def natural_key(value: str) -> tuple[str | int, ...]:
    """``rack-2`` before ``rack-10``: the digit runs compared as numbers."""
    parts = re.split(r"(\d+)", value)
    return tuple(int(part) if i % 2 else part for i, part in enumerate(parts))


def domain_room(
    topology_key: str,
    nodes: Mapping[str, NodeInfo],
    per_pod: int,
    used: Mapping[str, int],
    promised: Mapping[str, int],
    fits: NodeFilter,
) -> dict[str, int]:
    """Pods of ``per_pod`` accelerators each domain can take: ``used`` accelerators per node are
    held by pods bound there, ``promised`` accelerators per domain wait for pods not yet bound."""
    room: dict[str, int] = {}
    for name, node in nodes.items():
        domain = node.labels.get(topology_key)
        if domain is None or not fits(node):
            continue
        free = max(node.accelerators - used.get(name, 0), 0)
        room[domain] = room.get(domain, 0) + free // per_pod
    for domain, accelerators in promised.items():
        if domain in room:
            room[domain] = max(room[domain] - -(-accelerators // per_pod), 0)
    return room


def choose(stages: Sequence[int], room: Mapping[str, int]) -> list[StagePlacement] | None:
    """Where each stage's pods go (``stages``: pods per stage, in pipeline order), or None when
    the domains cannot hold them all."""
    if sum(stages) > sum(room.values()):
        return None
    left = dict(room)
    order = {d: i for i, d in enumerate(sorted(room, key=natural_key))}
    placements: list[StagePlacement] = []
    near: str | None = None
    for pods in stages:

        def distance(domain: str, near: str | None = near) -> int:
            return 0 if near is None else abs(order[domain] - order[near])

        placement = _place(pods, left, distance, order)
        if placement is None:
            return None
        for domain, count in placement.items():
            left[domain] -= count
        placements.append(placement)
        near = next(reversed(placement)) if placement else near
    return placements


def _place(
    pods: int, left: Mapping[str, int], distance: Callable[[str], int], order: Mapping[str, int]
) -> StagePlacement | None:
    """One stage of ``pods`` pods over the domains' room ``left``."""

    def tightest(candidates: list[str]) -> str:
        return min(candidates, key=lambda d: (left[d], distance(d), order[d]))

    if pods <= 0:
        return {}
    whole = [d for d in left if left[d] >= pods]
    if whole:
        return {tightest(whole): pods}
    placement: StagePlacement = {}
    rest = pods
    for domain in sorted(
        (d for d in left if left[d] > 0), key=lambda d: (-left[d], distance(d), order[d])
    ):
        if left[domain] >= rest:
            last = tightest([d for d in left if d not in placement and left[d] >= rest])
            placement[last] = rest
            return placement
        placement[domain] = left[domain]
        rest -= left[domain]
    return None
