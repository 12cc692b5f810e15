"""Watch gaps: objects deleted while a watch was down are dropped from what the operator holds.

When a watch breaks and its resourceVersion has been compacted meanwhile, the API server answers
410 Gone and kopf lists the resource again. kopf (1.45) then indexes every listed object anew,
but keeps what it held for objects that are no longer there: their DELETED events were lost in
the gap, and a listing says nothing about what is missing. Such a ghost pod would keep a job
"Running" without it, or waiting forever for it to go; a ghost job would be reconciled and given
new children.

A listing shows in the watch handlers as events of type None (the first one at start too). Soon
after one, the Auditor asks the API server for a consistent list of the jobs and of the
operator's pods (metadata only), and drops every job and pod it holds that is absent from that
list although it was last seen before the list's resourceVersion: absent then means deleted.
Jobs first, so a job deleted in the gap is forgotten before its pods are, and never looks as
if its pods had vanished. Dropped pods are hidden from the reconciler by their uid
(``LiveIndex``); kopf's index keeps the entry, since it offers no way to remove one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from typing import Any

from meshrun.api.crd import GROUP, PLURAL, VERSION
from meshrun_operator import metrics, names
from meshrun_operator.client.errors import NO_ANSWER, ApiError
from meshrun_operator.client.kube import Kube, core_path, group_path

logger = logging.getLogger("meshrun.operator")

METADATA_ONLY = "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io,application/json"
"""Ask for names, uids and versions only (PartialObjectMetadataList), not whole objects."""
PAGE = 500


def older(version: str | None, than: str) -> bool:
    """True when resourceVersion ``version`` is at or before ``than`` (etcd revisions); False
    when either is not an integer (the API does not promise an order then)."""
    try:
        return int(version or "") <= int(than)
    except ValueError:
        return False


class LiveIndex:
    """kopf's pod index without the pods an audit found gone (the reconciler's view of it)."""

    def __init__(self, index: Any, ghosts: set[str]) -> None:
        self.index, self.ghosts = index, ghosts

    def get(self, key: Any, default: Any = ()) -> Any:
        store = self.index.get(key)
        if store is None:
            return default
        return tuple(pod for pod in store if getattr(pod, "uid", None) not in self.ghosts)


async def list_uids(
    kube: Kube, what: str, namespaces: Iterable[str] | None
) -> tuple[str, set[str]]:
    """(resourceVersion of the list, uids listed) of the operator's pods (``what`` "pods") or
    of the jobs: cluster-wide (``namespaces`` None) or in each of ``namespaces`` (then the
    smallest resourceVersion of those lists)."""
    versions: list[str] = []
    uids: set[str] = set()
    for namespace in [None] if namespaces is None else list(namespaces):
        token: str | None = None
        while True:
            page = await _page(kube, what, namespace, token)
            uids.update(item["metadata"]["uid"] for item in page.get("items") or [])
            meta = page.get("metadata") or {}
            token = meta.get("continue") or None
            if token is None:
                versions.append(str(meta.get("resourceVersion", "")))
                break
    return min(versions, key=lambda v: int(v) if v.isdigit() else 0, default=""), uids


async def _page(kube: Kube, what: str, namespace: str | None, token: str | None) -> Any:
    query = {"limit": str(PAGE)}
    if token:
        query["continue"] = token
    if what == "pods":
        query["labelSelector"] = names.LABEL_JOB
        path = core_path("pods", namespace)
    else:
        path = group_path(GROUP, VERSION, PLURAL, namespace)
    return await kube.call("list", what, "GET", path, query=query, accept=METADATA_ONLY)


class Auditor:
    """Runs an audit a little after each listing (several listings in a burst: one audit)."""

    def __init__(
        self,
        kube: Kube,
        jobs: dict[str, dict[str, Any]],
        forget: Callable[[str], None],
        versions: Any,
        namespaces: tuple[str, ...],
        delay: float = 2.0,
    ) -> None:
        self.kube, self.jobs, self.forget = kube, jobs, forget
        self.versions = versions
        """kopf's index of the operator's pods: uid -> (resourceVersion, namespace)."""
        self.namespaces = namespaces
        """The namespaces served, or () for all of them."""
        self.delay = delay
        self.ghosts: set[str] = set()
        """uids of pods found gone: hidden from the reconciler (LiveIndex)."""
        self._task: asyncio.Task[None] | None = None

    def soon(self) -> None:
        """A listing was seen: audit in ``delay`` seconds unless one is already due."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._later(), name="meshrun-relist-audit")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _later(self) -> None:
        await asyncio.sleep(self.delay)
        try:
            await self.audit()
        except (ApiError, *NO_ANSWER) as error:
            logger.warning("watch audit failed, retried at the next listing: %s", error)

    def _where(self, seen: Iterable[str]) -> list[str] | None:
        """Cluster-wide (None), or only the served namespaces where something is held (the
        operator's RBAC ends at the served namespaces)."""
        if not self.namespaces:
            return None
        return sorted(set(seen) & set(self.namespaces))

    async def audit(self) -> tuple[list[str], list[str]]:
        """Drop the jobs, then the pods, deleted while unseen; their uids."""
        namespaces = [str(body["metadata"]["namespace"]) for body in self.jobs.values()]
        version, listed = await list_uids(self.kube, PLURAL, self._where(namespaces))
        gone_jobs = [
            uid
            for uid, body in list(self.jobs.items())
            if uid not in listed and older(body["metadata"].get("resourceVersion"), version)
        ]
        for uid in gone_jobs:
            logger.warning("job %s was deleted while a watch was down: forgotten", uid)
            self.forget(uid)
        held = {uid: next(iter(self.versions[uid])) for uid in list(self.versions)}
        namespaces = [namespace for _, namespace in held.values()]
        version, listed = await list_uids(self.kube, "pods", self._where(namespaces))
        gone_pods = [
            uid
            for uid, (seen, _) in held.items()
            if uid not in listed and uid not in self.ghosts and older(seen, version)
        ]
        # A ghost the index no longer holds needs no hiding: the set stays within the index.
        self.ghosts.intersection_update(held)
        self.ghosts.update(gone_pods)
        metrics.WATCH_GHOSTS.labels(kind="job").inc(len(gone_jobs))
        metrics.WATCH_GHOSTS.labels(kind="pod").inc(len(gone_pods))
        if gone_pods:
            logger.warning("%d pods were deleted while a watch was down: dropped", len(gone_pods))
        return gone_jobs, gone_pods
