"""How the operator's requests end: an answer, an error answer (ApiError), or none (NO_ANSWER);
how long a request may take; the refusal to write while another operator leads, and to send a
body that is not strict JSON."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import aiohttp

NO_ANSWER = (aiohttp.ClientError, asyncio.TimeoutError, OSError)
"""What a request raises when the API server did not answer (a timeout, a refused or dropped
connection), as opposed to an ApiError, which is its answer."""

WRITES = frozenset({"create", "delete", "patch", "update"})
"""Verbs that change the cluster: sent only while this operator leads (leader.py)."""


class ApiError(Exception):
    """The API server answered with an error status (its own answer, not a lost request)."""

    def __init__(self, status: int, reason: str, body: str = "") -> None:
        super().__init__(f"({status}) {reason}: {body[:500]}")
        self.status = status
        """The HTTP status (404, 409, 422, ...)."""
        self.reason = reason
        """The HTTP reason phrase."""
        self.body = body
        """The answer's body: a Status object in JSON, usually."""

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


class NotLeader(Exception):
    """A write was not sent: another operator holds the lease (or this one lost it)."""


class NotJson(ValueError):
    """A request body holds a number JSON cannot carry (NaN, infinite): it is not sent."""


def strict_json(body: Any, what: str) -> None:
    """NotJson unless ``body`` serializes as standard JSON: Python's json writes NaN and the
    API server answers every such patch 400, so a NaN that slipped past conform() would block
    each write of the job instead of failing one, plainly, here."""
    try:
        json.dumps(body, allow_nan=False)
    except ValueError as error:
        raise NotJson(f"{what} not sent: {error}") from error
