"""Reading the API server's audit log: every request once, with who sent it and when.

The policy (hack/peer/audit-policy.yaml) omits the RequestReceived stage, so a request appears
once when it completes, or twice when it is long-running (a watch: ResponseStarted, then
ResponseComplete when it ends); the first record of each audit ID is the one kept.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Request:
    """One API request as the API server recorded it."""

    user: str
    agent: str
    """The client's User-Agent (the local control plane's parts all share one user)."""
    verb: str
    resource: str
    """``resource`` or ``resource/subresource``; the URL path for non-resource requests."""
    namespace: str
    name: str
    code: int
    received: float
    """When the API server received it (seconds since the epoch)."""
    done: float
    """When its record was written (response complete, or started for a watch)."""
    body: Mapping[str, Any] | None
    """The request body where the policy keeps it (the operators' writes to their jobs)."""

    @property
    def key(self) -> str:
        """``verb resource``, the unit of the per-job tables."""
        return f"{self.verb} {self.resource}"


def _epoch(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _request(event: Mapping[str, Any]) -> Request:
    ref = event.get("objectRef") or {}
    resource = ref.get("resource") or event.get("requestURI", "").split("?")[0]
    if ref.get("subresource"):
        resource = f"{resource}/{ref['subresource']}"
    return Request(
        user=str((event.get("user") or {}).get("username", "")),
        agent=str(event.get("userAgent", "")),
        verb=str(event.get("verb", "")),
        resource=str(resource),
        namespace=str(ref.get("namespace", "")),
        name=str(ref.get("name", "")),
        code=int((event.get("responseStatus") or {}).get("code", 0)),
        received=_epoch(event["requestReceivedTimestamp"]),
        done=_epoch(event["stageTimestamp"]),
        body=event.get("requestObject"),
    )


class AuditLog:
    """The audit log, read incrementally; requests accumulate in ``requests``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.inode = path.stat().st_ino if path.exists() else 0
        self.offset = path.stat().st_size if path.exists() else 0
        self.seen: set[str] = set()
        self.requests: list[Request] = []

    def read(self) -> None:
        """Take in what the API server appended since the last read (whole lines only).

        The API server rotates its audit log at 100 MB (audit-<time>.log beside it): the rest of
        the rotated file is read first, then the new file from its start.
        """
        if self.path.stat().st_ino != self.inode:
            for rotated in sorted(self.path.parent.glob("audit-*.log")):
                if rotated.stat().st_ino == self.inode:
                    self._take(rotated)
            self.inode, self.offset = self.path.stat().st_ino, 0
        self._take(self.path)

    def _take(self, path: Path) -> None:
        with path.open("rb") as log:
            log.seek(self.offset)
            data = log.read()
        end = data.rfind(b"\n") + 1
        self.offset += end
        for line in data[:end].splitlines():
            event = json.loads(line)
            audit_id = event.get("auditID", "")
            if audit_id in self.seen:
                continue
            self.seen.add(audit_id)
            self.requests.append(_request(event))
        if len(self.seen) > 1_000_000:  # a watch ends within minutes; old IDs cannot recur
            self.seen.clear()

    def between(self, user: str, start: float, end: float) -> list[Request]:
        """``user``'s requests received in [start, end), long-running watches excluded."""
        self.read()
        return [
            r
            for r in self.requests
            if r.user == user and start <= r.received < end and r.verb != "watch"
        ]

    def in_namespace(self, namespace: str, start: float, end: float) -> list[Request]:
        """Everyone's requests about objects in ``namespace`` received in [start, end)."""
        self.read()
        return [
            r
            for r in self.requests
            if r.namespace == namespace and start <= r.received < end and r.verb != "watch"
        ]

    def forget_before(self, moment: float) -> None:
        """Drop what was received before ``moment`` (keeps memory flat over a long bench)."""
        self.requests = [r for r in self.requests if r.received >= moment]


def by_key(requests: Iterable[Request]) -> Counter[str]:
    return Counter(r.key for r in requests)


def job_write_kind(request: Request) -> str:
    """What an operator's write to its own job object carried, from the request body.

    kopf's bookkeeping lives in annotations (its progress per handler and the last-handled
    configuration); the operators' own writes are status, their bookkeeping annotation, or
    finalizers.
    """
    body = request.body or {}
    kinds = []
    meta = body.get("metadata") or {}
    for key in sorted(meta.get("annotations") or {}):
        if key.endswith("last-handled-configuration"):
            kinds.append("last-handled-configuration")
        elif key.endswith("/state"):
            kinds.append("state annotation")
        else:
            kinds.append("kopf progress")
    if "finalizers" in meta:
        kinds.append("finalizers")
    if "status" in body and (request.resource.endswith("/status") or body["status"]):
        kinds.append("status")
    return ", ".join(dict.fromkeys(kinds)) or "other"
