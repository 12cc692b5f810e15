"""The nodes as the operator needs them: whether each is Ready (and since when), its labels (the
topology domains status.placement shows), and what placing a stage needs (its accelerators and
whether pods may go there: placer.py), from a list and a watch of the operator's own.

kopf handles every watch event with its whole machinery (a worker task, a memory and loggers per
object, every handler in turn): for the operator's pods and jobs that is fine, for every node of
a cluster of thousands it is not: at 5,000 nodes, taking in the initial listing alone kept the
operator busy for a minute, and no job is looked at before every index is filled. Here the nodes
are listed in pages and watched from the list's version (with bookmarks) on a thread of their
own; each event is reduced at once to a small ``NodeInfo`` (label strings interned: most values
repeat across nodes), and only a change of what the operator keeps reaches the event loop: a
heartbeat does not. A change of readiness, or a deletion, concerns every job (``on_change``).

A watch that cannot resume (410 Gone) lists again, and the nodes absent from the new list are
dropped as deleted. As with kopf's index, a node the operator does not hold counts as deleted,
and the jobs are looked at only once the first listing is complete (``listed``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from meshrun_operator.apiclient import NO_ANSWER, ApiTimeout
from meshrun_operator.observe import ACCELERATOR, NodeView, node_view, whole_quantity

logger = logging.getLogger("meshrun.operator")

PAGE = 500
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
    """The nodes' labels as kueue_link reads kopf's index: ``get(node)`` -> its labels, once."""

    def __init__(self, nodes: Mapping[str, NodeInfo]) -> None:
        self.nodes = nodes

    def get(self, node: str, default: Any = ()) -> Any:
        info = self.nodes.get(node)
        return default if info is None else (info.labels,)


class NodeWatch:
    """Every node's readiness and labels, kept current by a list and a watch on a thread.

    Read it like kopf's index of node readiness: ``name in watch``, ``watch[name]`` -> the
    node's ``NodeView``, once. It is changed on the event loop only.
    """

    def __init__(
        self, api: client.ApiClient, on_change: Callable[[], None], timeout: ApiTimeout
    ) -> None:
        self.core = client.CoreV1Api(api)
        self.on_change = on_change
        """Called on the event loop when a node's readiness changes or it is deleted."""
        self.timeout = timeout
        self.nodes: dict[str, NodeInfo] = {}
        self.labels = NodeLabels(self.nodes)
        self.listed = asyncio.Event()
        """Set once the first listing is complete."""
        self._seen: dict[str, NodeInfo] = {}
        """The thread's own copy: only what differs from it is handed to the event loop."""
        self._stop = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

    def __contains__(self, name: object) -> bool:
        return name in self.nodes

    def __getitem__(self, name: str) -> tuple[NodeView]:
        return (self.nodes[name].view,)

    def start(self) -> None:
        """Start listing and watching (from the event loop that reads it)."""
        self._loop = asyncio.get_running_loop()
        threading.Thread(target=self._run, name="meshrun-nodes", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    # The thread.

    def _run(self) -> None:
        version = ""
        while not self._stop.is_set():
            try:
                if not version:
                    version = self._list()
                version = self._watch(version)
            except ApiException as error:
                if error.status == 410:  # the version was compacted away: list again
                    version = ""
                    continue
                logger.warning("node watch: %s; retrying", error)
                time.sleep(2)
            except (*NO_ANSWER, ValueError) as error:
                logger.warning("node watch interrupted: %r; retrying", error)
                time.sleep(2)

    def _list(self) -> str:
        found: dict[str, NodeInfo] = {}
        token: str | None = None
        while True:
            response: Any = self.core.list_node(
                limit=PAGE,
                _continue=token,
                _preload_content=False,
                _request_timeout=self.timeout.request,
            )
            page = json.loads(response.data)
            for item in page.get("items") or []:
                found[str(item["metadata"]["name"])] = node_info(item)
            meta = page.get("metadata") or {}
            token = meta.get("continue") or None
            if token is None:
                break
        gone = [name for name in self._seen if name not in found]
        changed = {n: i for n, i in found.items() if self._seen.get(n) != i}
        self._seen = found
        self._post(self._apply, changed, gone, True)
        return str(meta.get("resourceVersion") or "")

    def _watch(self, version: str) -> str:
        response: Any = self.core.list_node(
            watch=True,
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=WATCH_SECONDS,
            _preload_content=False,
            _request_timeout=(self.timeout.connect, WATCH_SECONDS + 30),
        )
        try:
            lines: Iterator[str] = iter_resp_lines(response)  # type: ignore[no-untyped-call]
            for kind, obj in _events(lines):
                if self._stop.is_set():
                    break
                name = str((obj.get("metadata") or {}).get("name") or "")
                if kind in ("ADDED", "MODIFIED"):
                    info = node_info(obj)
                    if self._seen.get(name) != info:
                        self._seen[name] = info
                        self._post(self._apply, {name: info}, [], False)
                elif kind == "DELETED" and self._seen.pop(name, None) is not None:
                    self._post(self._apply, {}, [name], False)
                version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
        finally:
            response.release_conn()
        return version

    def _post(self, fn: Callable[..., None], *args: Any) -> None:
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop is closed: the operator is stopping
            self._stop.set()

    # The event loop.

    def _apply(self, changed: Mapping[str, NodeInfo], gone: list[str], listing: bool) -> None:
        touched = bool(gone)
        for name in gone:
            self.nodes.pop(name, None)
        for name, info in changed.items():
            old = self.nodes.get(name)
            self.nodes[name] = info
            touched = touched or (old is not None and old.view.ready != info.view.ready)
        if listing:
            self.listed.set()
        if touched:
            self.on_change()


def _events(lines: Iterator[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(type, object) of each watch event; an ERROR event raises its ApiException."""
    for line in lines:
        if not line.strip():
            continue
        event = json.loads(line)
        kind, obj = str(event.get("type")), event.get("object") or {}
        if kind == "ERROR":
            raise ApiException(status=int(obj.get("code") or 500), reason=str(obj.get("reason")))
        yield kind, obj
