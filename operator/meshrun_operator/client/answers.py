"""What the API server's answers to a child's create mean (kube.py raises and returns these).

A create can be rejected (the child is invalid: the spec is at fault), refused for now (a
ResourceQuota, PodSecurity admission, throttling, a failing webhook: a retry may pass), or find
the name taken, and then it matters who holds it (``Holder``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


class ChildRejected(Exception):
    """The API server refused a child object as invalid (HTTP 400/422): the spec is at fault."""

    def __init__(self, kind: str, name: str, message: str) -> None:
        super().__init__(f"{kind} {name} rejected by the API server: {message}")
        self.kind, self.name, self.message = kind, name, message


class Refused(Exception):
    """The API server refused to create a child for now: 403 (a ResourceQuota, PodSecurity
    admission), 429, or a 5xx (a failing webhook). The spec may be fine; a retry may pass."""

    def __init__(
        self, kind: str, name: str, status: int, message: str, retry_after: float | None = None
    ) -> None:
        super().__init__(f"{kind} {name} refused by the API server ({status}): {message}")
        self.kind, self.name, self.status, self.message = kind, name, status, message
        self.retry_after = retry_after
        """Seconds the API server asked to wait (its Retry-After header), or None."""

    @property
    def reason(self) -> str:
        """CamelCase cause for the job's condition and Event."""
        if self.status == 403:
            if "exceeded quota" in self.message:
                return "QuotaExceeded"
            return "PodSecurity" if "PodSecurity" in self.message else "Forbidden"
        return "TooManyRequests" if self.status == 429 else "ServerError"


@dataclass(frozen=True)
class Holder:
    """The object that holds a child's name: its controller, its labels, its identity."""

    controller: str | None
    """uid of its controlling owner; None for an orphan."""
    attempt: int
    """Its meshrun.dev/attempt label (-1 without one)."""
    deleting: bool
    """It has a deletionTimestamp."""
    controller_kind: str | None = None
    """Kind of its controlling owner."""
    labels: Mapping[str, str] = field(default_factory=dict)
    """Its labels (children.claim reads meshrun's two)."""
    uid: str = ""
    """metadata.uid: a delete of it is preconditioned on it."""
    resource_version: str = ""
    """metadata.resourceVersion: so is a delete of an orphan (it must not have changed since
    it was judged)."""
    controller_api_version: str | None = None
    """apiVersion of its controlling owner (group/version)."""
    spec: Mapping[str, Any] = field(default_factory=dict)
    """Its spec (its selector is judged for drift: children/drift.py)."""
