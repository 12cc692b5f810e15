"""The nodes as the operator needs them: whether each is Ready (and since when), its labels (the
topology domains status.placement shows), and what placing a stage needs (its accelerators and
whether pods may go there: children/placer.py), from a list and a watch of the operator's own.

kopf handles every watch event with its whole machinery (a worker task, a memory and loggers per
object, every handler in turn): for the operator's pods and jobs that is fine, for every node of
a cluster of thousands it is not: at 5,000 nodes, taking in the initial listing alone kept the
operator busy for a minute, and no job is looked at before every index is filled. Here the nodes
are listed in small pages and watched from the list's version (with bookmarks) by a task of their
own; each event is reduced at once to a small ``NodeInfo`` (label strings interned: most values
repeat across nodes) and the whole object dropped, and a heartbeat, which changes nothing kept,
goes no further. A change of readiness, or a deletion, concerns every job (``on_change``).

A watch that cannot resume (410 Gone) lists again, and the nodes absent from the new list are
dropped as deleted. Any other failure (an error answer, none, a malformed event, a bug) is
logged and the watch starts again after a backoff (background.py); /healthz fails when the
watch ended or has received nothing (no page, no event, no bookmark) for its deadline.

As with kopf's index, a node the operator does not hold counts as deleted, and the jobs are
looked at only once the first listing is complete (``listed``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from meshrun.api.hardware import PRODUCT_LABEL
from meshrun_operator import metrics
from meshrun_operator.background import Liveness
from meshrun_operator.client.errors import ApiError
from meshrun_operator.client.rest import Rest
from meshrun_operator.seen.views import ACCELERATOR, NodeView, node_view, whole_quantity

logger = logging.getLogger("meshrun.operator")

PAGE = 100
"""Nodes per page of the listing."""
WATCH_SECONDS = 270
"""How long the API server keeps one watch open (a new one follows, from the last version)."""


KEPT_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
"""Taints that keep a pod off a node unless it tolerates them (PreferNoSchedule does not)."""


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """What the operator keeps of one node."""

    view: NodeView
    """Whether it is Ready, and since when."""
    labels: Mapping[str, str]
    """Its labels (interned strings)."""
    accelerators: int = 0
    """status.allocatable of the accelerator (nvidia.com/gpu; 0 when it has none)."""
    unschedulable: bool = False
    """spec.unschedulable (cordoned)."""
    taints: tuple[tuple[str, str, str], ...] = ()
    """(key, value, effect) of its NoSchedule and NoExecute taints (interned strings)."""


def node_info(body: Mapping[str, Any]) -> NodeInfo:
    """Reduce a node object to its readiness, labels, accelerators and schedulability."""
    labels = (body.get("metadata") or {}).get("labels") or {}
    spec = body.get("spec") or {}
    allocatable = (body.get("status") or {}).get("allocatable") or {}
    taints = tuple(
        (sys.intern(str(t.get("key") or "")), sys.intern(str(t.get("value") or "")), effect)
        for t in spec.get("taints") or []
        if (effect := sys.intern(str(t.get("effect")))) in KEPT_EFFECTS
    )
    return NodeInfo(
        view=node_view(body),
        labels={sys.intern(str(k)): sys.intern(str(v)) for k, v in labels.items()},
        accelerators=whole_quantity(allocatable.get(ACCELERATOR)),
        unschedulable=bool(spec.get("unschedulable")),
        taints=taints,
    )


class NodeLabels:
    """The nodes' labels in the shape of a kopf index, as runtime/kueue_link.py reads them:
    ``get(node)`` -> its labels, once."""

    def __init__(self, nodes: Mapping[str, NodeInfo]) -> None:
        self.nodes = nodes

    def get(self, node: str, default: Any = ()) -> Any:
        info = self.nodes.get(node)
        return default if info is None else (info.labels,)


class NodeWatch:
    """Every node's readiness and labels, kept current by a list and a watch of its own.

    Read it like kopf's index of node readiness: ``name in watch``, ``watch[name]`` -> the
    node's ``NodeView``, once.
    """

    def __init__(
        self,
        rest: Rest,
        on_change: Callable[[], None],
        deadline: float = 300.0,
        watch_seconds: int = WATCH_SECONDS,
    ) -> None:
        self.rest = rest
        self.watch_seconds = watch_seconds
        """How long the API server keeps one watch open (a new one follows)."""
        # A quiet cluster sends nothing but a new watch's answer for a whole watch.
        self.liveness = Liveness("node watch", max(deadline, 2.0 * (watch_seconds + 30)))
        self.on_change = on_change
        """Called when a node's readiness changes or it is deleted."""
        self.nodes: dict[str, NodeInfo] = {}
        self.labels = NodeLabels(self.nodes)
        self._products: Counter[str] = Counter()
        """Nodes per value of their GPU product label."""
        self.listed = asyncio.Event()
        """Set once the first listing is complete."""
        self._task: asyncio.Task[None] | None = None

    def __contains__(self, name: object) -> bool:
        return name in self.nodes

    def __getitem__(self, name: str) -> tuple[NodeView]:
        return (self.nodes[name].view,)

    def gpu_products(self) -> frozenset[str] | None:
        """The GPU products some node has (its nvidia.com/gpu.product label); None before the
        first listing is complete."""
        if not self.listed.is_set():
            return None
        return frozenset(product for product, count in self._products.items() if count > 0)

    def start(self) -> None:
        """Start listing and watching (a task of the running loop)."""
        self._task = asyncio.create_task(self._run(), name="meshrun-nodes")
        self.liveness.task = self._task

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _run(self) -> None:
        version = ""
        while True:
            try:
                if not version:
                    version = await self._list()
                version = await self._watch(version)
            except ApiError as error:
                if error.status == 410:  # the version was compacted away: list again
                    version = ""
                    continue
                await self.liveness.failed(error)
            except (Exception, asyncio.CancelledError) as error:
                await self.liveness.failed(error)

    async def _list(self) -> str:
        found: dict[str, NodeInfo] = {}
        query = {"limit": str(PAGE)}
        while True:
            metrics.API_REQUESTS.labels(verb="list", resource="nodes").inc()
            page = await self.rest.request("GET", "/api/v1/nodes", query=query)
            for item in page.get("items") or []:
                found[str(item["metadata"]["name"])] = node_info(item)
            del page["items"]  # a page of whole nodes is the largest thing the operator reads
            self.liveness.progressed()
            meta = page.get("metadata") or {}
            if not meta.get("continue"):
                break
            query["continue"] = str(meta["continue"])
        gone = [name for name in self.nodes if name not in found]
        changed = {n: i for n, i in found.items() if self.nodes.get(n) != i}
        self._apply(changed, gone)
        self.listed.set()
        return str(meta.get("resourceVersion") or "")

    async def _watch(self, version: str) -> str:
        query = {
            "watch": "true",
            "resourceVersion": version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(self.watch_seconds),
        }
        metrics.API_REQUESTS.labels(verb="watch", resource="nodes").inc()
        async for line in self.rest.lines("/api/v1/nodes", query, self.watch_seconds + 30):
            kind, obj = _event(line)
            self.liveness.progressed()
            meta = obj.get("metadata") or {}
            name = str(meta.get("name") or "")
            if kind in ("ADDED", "MODIFIED"):
                info = node_info(obj)
                if self.nodes.get(name) != info:  # a heartbeat changes nothing kept
                    self._apply({name: info}, [])
            elif kind == "DELETED" and name in self.nodes:
                self._apply({}, [name])
            version = str(meta.get("resourceVersion") or version)
        self.liveness.progressed()  # the API server ended the watch: it answers
        return version

    def _apply(self, changed: Mapping[str, NodeInfo], gone: list[str]) -> None:
        touched = bool(gone)
        for name in gone:
            self._count_product(self.nodes.pop(name, None), -1)
        for name, info in changed.items():
            old = self.nodes.get(name)
            self._count_product(old, -1)
            self._count_product(info, 1)
            self.nodes[name] = info
            touched = touched or (old is not None and old.view.ready != info.view.ready)
        if touched:
            self.on_change()

    def _count_product(self, info: NodeInfo | None, change: int) -> None:
        product = info.labels.get(PRODUCT_LABEL) if info is not None else None
        if product:
            self._products[product] += change


def _event(line: bytes) -> tuple[str, dict[str, Any]]:
    """(type, object) of one watch event; an ERROR event raises its ApiError."""
    event = json.loads(line)
    kind, obj = str(event.get("type")), event.get("object") or {}
    if kind == "ERROR":
        raise ApiError(int(obj.get("code") or 500), str(obj.get("reason")), json.dumps(obj))
    return kind, obj
