"""How the operator's requests end: an answer, an error answer (ApiError), or none (NO_ANSWER);
how long a request may take; the refusal to write while another operator leads, and to send a
body that is not strict JSON."""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import dataclass
from typing import Any

import aiohttp

NO_ANSWER = (aiohttp.ClientError, asyncio.TimeoutError, OSError)
"""What a request raises when the API server did not answer (a timeout, a refused or dropped
connection), as opposed to an ApiError, which is its answer."""

WRITES = frozenset({"create", "delete", "patch", "update"})
"""Verbs that change the cluster: sent only while this operator leads (runtime/leader.py)."""


RETRY_AFTER_MAX = 3600.0
"""The longest Retry-After taken from an answer (seconds)."""


def retry_after(header: str | None) -> float | None:
    """The seconds of a Retry-After header (the API server sends it with 429 and 503: its
    priority and fairness throttling, a server shutting down), at most RETRY_AFTER_MAX; None
    when absent or not a number of seconds."""
    try:
        seconds = float(header) if header is not None else math.nan
    except ValueError:
        return None
    return min(seconds, RETRY_AFTER_MAX) if seconds >= 0 else None


class ApiError(Exception):
    """The API server answered with an error status (its own answer, not a lost request)."""

    def __init__(
        self, status: int, reason: str, body: str = "", retry_after: float | None = None
    ) -> None:
        super().__init__(f"({status}) {reason}: {body[:500]}")
        self.status = status
        """The HTTP status (404, 409, 422, ...)."""
        self.reason = reason
        """The HTTP reason phrase."""
        self.body = body
        """The answer's body: a Status object in JSON, usually."""
        self.retry_after = retry_after
        """Seconds the API server asked to wait before the next request (its Retry-After
        header), or None."""

    @property
    def status_object(self) -> dict[str, Any]:
        """The answer's Status object ({} when the body is not one)."""
        try:
            status = json.loads(self.body or "{}")
        except ValueError:
            return {}
        return status if isinstance(status, dict) else {}

    @property
    def message(self) -> str:
        """The Status object's message, else the reason phrase."""
        return str(self.status_object.get("message") or self.reason)


@dataclass(frozen=True)
class ApiTimeout:
    """How long one API request may take."""

    connect: float = 10.0
    """Seconds to open a connection (TCP and TLS)."""
    read: float = 30.0
    """Seconds to wait for the answer (between two reads of it)."""
    total: float | None = None
    """Seconds the whole request may take, its waits for a login and a connection included
    (None: bounded by ``connect`` and ``read`` only)."""

    @classmethod
    def of(cls, seconds: float) -> ApiTimeout:
        """``seconds`` to read, and at most 10 s of it to connect."""
        return cls(connect=min(10.0, seconds), read=seconds)


class NamespaceGone(Exception):
    """The API server said a namespace is being deleted (403 NamespaceTerminating: it creates
    nothing there any more) or is gone (404 for the namespace): nothing of it comes back."""

    def __init__(self, namespace: str, message: str) -> None:
        super().__init__(f"namespace {namespace} is being deleted or gone: {message}")
        self.namespace = namespace
        """The namespace."""


def says_namespace_gone(error: ApiError, namespace: str) -> bool:
    """Whether ``error``, answered to a request in ``namespace``, says that namespace is being
    deleted (the NamespaceLifecycle admission's cause NamespaceTerminating) or does not exist."""
    details = error.status_object.get("details")
    if not isinstance(details, dict):
        return False
    if error.status == 403:
        causes = details.get("causes")
        return isinstance(causes, list) and any(
            isinstance(cause, dict) and cause.get("reason") == "NamespaceTerminating"
            for cause in causes
        )
    return (
        error.status == 404
        and details.get("kind") == "namespaces"
        and details.get("name") == namespace
    )


class NotLeader(Exception):
    """A write was not sent: another operator holds the lease (or this one lost it)."""


class NotJson(ValueError):
    """A request body holds a number JSON cannot carry (NaN, infinite): it is not sent."""


def json_body(body: Any, what: str) -> bytes:
    """``body`` as compact, strict JSON; NotJson, naming ``what`` and the field, when it holds
    NaN or an infinite number. Python's json would write them as NaN and Infinity, which the API
    server refuses (HTTP 400 for every such patch): one NaN that slipped past conform() would
    block each write of the job instead of failing one, plainly, here, before anything is sent."""
    try:
        return json.dumps(body, separators=(",", ":"), allow_nan=False).encode()
    except ValueError as error:
        where = non_finite_field(body)
        found = str(error) if where is None else f"{where[0]} is {where[1]}"
        raise NotJson(f"{what} not sent: {found} (JSON has no NaN or infinite numbers)") from None


def non_finite_field(value: Any, path: str = "") -> tuple[str, float] | None:
    """The dotted path (``[i]`` for list items) of the first NaN or infinite float in
    ``value``, and that number; None when there is none."""
    if isinstance(value, float) and not math.isfinite(value):
        return path or "the body", value
    if isinstance(value, dict):
        for key, item in value.items():
            found = non_finite_field(item, f"{path}.{key}" if path else str(key))
            if found is not None:
                return found
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            found = non_finite_field(item, f"{path}[{index}]")
            if found is not None:
                return found
    return None
