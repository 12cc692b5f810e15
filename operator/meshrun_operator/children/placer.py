"""Choosing the topology domains of a job's stages when its pods are created (domains.py decides;
this gathers what it decides on), so each pod can prefer its stage's domains by node affinity.

With ``spec.scheduling.topologyKey`` a stage's pods should share a domain (a rack). A preferred
inter-pod affinity says so without choosing the domain, but it is slow and works poorly: the
scheduler scores it over every pod and node (its cost grows with both), and pods created
together find no peer yet to be near. The operator knows the nodes (the node watch) and its own
pods (the pods index), so it picks the domains itself, and the pods prefer them by node
affinity, which the scheduler checks per node in no time.

What it counts: each node's allocatable accelerators, less what the operator's pods bound there
request (pods that ended hold nothing); and the domains promised to the stages of other jobs
whose pods are not all bound yet, so that jobs created together do not pick the same rack. It
does not see other workloads' pods: a node they fill looks free, and the preference (never a
requirement) then costs locality, not a placement.

No choice (None), and the pods keep the inter-pod preference, when: the job asks no accelerators
(a CPU job: nothing to count), no node the pods may go on carries the key, or the domains lack
room for the job (the inter-pod affinity still groups what the scheduler can place). Without the
node watch (``--no-watch-nodes``) there is no placer at all.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from meshrun.api.spec import CPU, JobSpec
from meshrun.planner.plan import Plan
from meshrun_operator.children.domains import StagePlacement, choose, domain_room
from meshrun_operator.children.nodefit import node_filter
from meshrun_operator.children.owner import JobRef, pod_stage
from meshrun_operator.children.podtemplate import select_product
from meshrun_operator.jobstatus import PodPhase
from meshrun_operator.seen.nodes import NodeInfo

logger = logging.getLogger("meshrun.operator")

ENDED = frozenset({PodPhase.SUCCEEDED.value, PodPhase.FAILED.value})


@dataclass(frozen=True)
class Promise:
    """The domains chosen for one attempt of a job, held for it until its pods are bound."""

    namespace: str
    name: str
    attempt: int
    topology_key: str
    per_pod: int
    """Accelerators per pod."""
    stages: tuple[StagePlacement, ...]
    """Per stage, domain -> pods."""

    @property
    def pods(self) -> int:
        return sum(sum(stage.values()) for stage in self.stages)


class Placer:
    """Chooses and remembers the domains of each job's stages (one per operator)."""

    def __init__(self, nodes: Mapping[str, NodeInfo], pods_index: Any) -> None:
        self.nodes = nodes
        """The node watch's nodes (kept current by it)."""
        self.pods_index = pods_index
        """kopf's index of the operator's pods: (namespace, job) -> its PodViews."""
        self.promises: dict[str, Promise] = {}
        """By job uid."""

    def forget(self, uid: str) -> None:
        self.promises.pop(uid, None)

    def choose(
        self, job: JobRef, spec: JobSpec, plan: Plan, attempt: int
    ) -> dict[int, tuple[str, ...]] | None:
        """Stage -> its domains, best first, for the pods of ``attempt``; None: no choice.

        One choice per attempt: pods created later in the same attempt (after a refusal) get
        the domains their stage already has.
        """
        key = spec.scheduling.topology_key
        if key is None or spec.resources.accelerator == CPU:
            return None
        promise = self.promises.get(job.uid)
        if promise is None or promise.attempt != attempt or promise.topology_key != key:
            promise = self._promise(job, spec, plan, attempt, key)
            if promise is None:
                self.promises.pop(job.uid, None)
                return None
            self.promises[job.uid] = promise
        return {stage: tuple(domains) for stage, domains in enumerate(promise.stages)}

    def _promise(
        self, job: JobRef, spec: JobSpec, plan: Plan, attempt: int, key: str
    ) -> Promise | None:
        per_pod = spec.resources.num_proc_per_node
        stages = [0] * plan.layout.pp
        for index in range(spec.resources.num_nodes):
            stages[pod_stage(plan, index)] += 1
        used = self._used(job.uid)
        pod_spec = copy.deepcopy((spec.pod_template or {}).get("spec") or {})
        select_product(pod_spec, spec.resources.accelerator_product)  # as build_pod does
        fits = node_filter(pod_spec)
        room = domain_room(key, self.nodes, per_pod, used, self._promised(job.uid, key), fits)
        placements = choose(stages, room)
        if placements is None:
            logger.info(
                "job %s/%s: no room for its stages in the domains of %s (%d domains, room for "
                "%d pods); its pods prefer their stage's peers instead",
                job.namespace, job.name, key, len(room), sum(room.values()),
            )  # fmt: skip
            return None
        return Promise(job.namespace, job.name, attempt, key, per_pod, tuple(placements))

    def capacity(self, uid: str, spec: JobSpec) -> int | None:
        """Pods of the job's size its pods may go on the nodes for (spec.elastic): the nodes'
        allocatable accelerators less what the operator's other pods hold, the job's own pods'
        places counted as free; None for a CPU job (nothing to count)."""
        if spec.resources.accelerator == CPU:
            return None
        per_pod = spec.resources.num_proc_per_node
        used = self._used(uid)
        fits = node_filter((spec.pod_template or {}).get("spec") or {})
        return sum(
            max(node.accelerators - used.get(name, 0), 0) // per_pod
            for name, node in self.nodes.items()
            if fits(node)
        )

    def _used(self, uid: str) -> dict[str, int]:
        """Accelerators per node held by the live, bound pods of jobs other than ``uid``."""
        used: dict[str, int] = {}
        for store in self.pods_index.values():
            for pod in store:
                if pod.node and pod.phase not in ENDED and pod.owner_uid != uid:
                    used[pod.node] = used.get(pod.node, 0) + pod.accelerators
        return used

    def _promised(self, uid: str, key: str) -> dict[str, int]:
        """Accelerators per domain promised to other jobs' pods that are not bound yet; a
        promise whose pods are all bound is kept no longer."""
        promised: dict[str, int] = {}
        for other, promise in list(self.promises.items()):
            if other == uid or promise.topology_key != key:
                continue
            pods = self.pods_index.get((promise.namespace, promise.name)) or ()
            bound: dict[str, int] = {}
            for pod in pods:
                if pod.attempt == promise.attempt and pod.node and pod.node in self.nodes:
                    domain = self.nodes[pod.node].labels.get(key, "")
                    bound[domain] = bound.get(domain, 0) + 1
            unbound = promise.pods - sum(bound.values())
            if unbound <= 0:
                del self.promises[other]
                continue
            wanted: dict[str, int] = {}
            for stage in promise.stages:
                for domain, count in stage.items():
                    wanted[domain] = wanted.get(domain, 0) + count
            for domain, count in wanted.items():
                waiting = min(max(count - bound.get(domain, 0), 0), unbound)
                promised[domain] = promised.get(domain, 0) + waiting * promise.per_pod
        return promised
