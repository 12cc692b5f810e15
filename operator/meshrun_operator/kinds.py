"""The kinds of object the operator makes, in one table: where each is served, and how the
operator follows the jobs' objects of it.

A row names the kind, the API versions it is made at (group, version, plural; the first is the
one used when no other is asked for), whether kopf lists and watches the jobs' objects of that
kind by the job-name label (server-side), and for a child watched on its own, the kopf index of
their controllers' uids and whether its drift is judged: one the watch no longer shows while the
gang runs is created again. A kind the operator makes only when it is set to (the per-job
NetworkPolicy) is ``optional``: watched only then.

How each is built is the children's (builders.py, netpolicy.py, kueue.py), and how a restored
one is created again the runtime's (actions.RESTORERS). The API client finds every path here
(client/kube.py), the kopf wiring every watch and index (runtime/handlers.py, main.py): a new
child kind is a row here and its builder.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Served:
    """One API version a kind is served at."""

    group: str
    """The API group; empty for the core group (``/api/v1``)."""
    version: str
    plural: str
    """The resource's name in URL paths and RBAC rules."""

    @property
    def api_version(self) -> str:
        """``group/version``, or the version alone in the core group."""
        return f"{self.group}/{self.version}" if self.group else self.version


@dataclass(frozen=True)
class Kind:
    """One kind of object the operator makes."""

    kind: str
    served: tuple[Served, ...]
    """The API versions it is made at; the first where none is named."""
    labelled: bool = False
    """kopf lists and watches only the objects carrying the job-name label (the jobs')."""
    index: str = ""
    """The kopf index of the jobs' objects of this kind (their controllers' uids by namespace
    and job name), and the watch that pokes a job when one of them is deleted; empty: none."""
    restored: bool = False
    """Drift is judged: one the index does not show while the gang runs is created again."""
    optional: bool = False
    """Made (and watched) only when the operator is set to (``--no-network-policy``)."""

    def at(self, api_version: str | None = None) -> Served:
        """Where the kind is served at ``api_version`` (the first one when None); KeyError
        for a version it is not made at."""
        if api_version is None:
            return self.served[0]
        for served in self.served:
            if served.api_version == api_version:
                return served
        raise KeyError(f"{self.kind} is not made at {api_version}")

    @property
    def plural(self) -> str:
        """The resource's plural (the same at every version made)."""
        return self.served[0].plural


POD = Kind("Pod", (Served("", "v1", "pods"),), labelled=True)
SERVICE = Kind(
    "Service",
    (Served("", "v1", "services"),),
    labelled=True,
    index="meshrun_services",
    restored=True,
)
NETWORK_POLICY = Kind(
    "NetworkPolicy",
    (Served("networking.k8s.io", "v1", "networkpolicies"),),
    labelled=True,
    index="meshrun_policies",
    restored=True,
    optional=True,
)
POD_GROUP = Kind(
    "PodGroup",
    (
        Served("scheduling.volcano.sh", "v1beta1", "podgroups"),
        Served("scheduling.x-k8s.io", "v1alpha1", "podgroups"),
    ),
)
WORKLOAD = Kind("Workload", (Served("kueue.x-k8s.io", "v1beta2", "workloads"),), labelled=True)
EVENT = Kind("Event", (Served("", "v1", "events"),))
"""Not a child: the Events the operator posts on a job, made through the same door."""

KINDS: dict[str, Kind] = {
    k.kind: k for k in (POD, SERVICE, NETWORK_POLICY, POD_GROUP, WORKLOAD, EVENT)
}
"""Every kind by name, in the order their drift is judged and restored."""


def watched(optional: bool) -> tuple[Kind, ...]:
    """The kinds indexed on their own; the ``optional`` ones only when the operator makes
    them."""
    return tuple(k for k in KINDS.values() if k.index and (optional or not k.optional))
