"""Reading the trainer's ``/progress`` endpoint on rank 0 (docs/env-contract.md).

On KWOK nodes pods have no real endpoint, so progress may also come from the pod annotation
``meshrun.dev/progress`` (read with the pod, views.py); the endpoint wins when both exist.

A trainer is not trusted to answer well: one read is bounded in time (``timeout`` for the whole
exchange, so a pod that sends a byte now and then cannot hold it open) and in size
(``max_bytes``), and its answer is decoded only within the bounded reader's depth
(boundedjson.py). A pod that timed out, or answered too much or nonsense, is not asked again for
``retry_after`` seconds, so an unroutable pod IP costs one timeout, not one per resync. A refused
connection means the trainer has not opened its port yet: asked again at the next resync.
"""

from __future__ import annotations

import time
from typing import Any

import aiohttp

from meshrun.envcontract import METRICS_PORT
from meshrun_operator.jobstatus import PodPhase
from meshrun_operator.seen.boundedjson import MAX_CHARS, read_object
from meshrun_operator.seen.views import PodView, progress_fields

KEEPALIVE_SECONDS = 30.0
"""How long a connection to a pod is kept without a request (reads come every few seconds)."""

PROGRESS_MAX_BYTES = MAX_CHARS
"""The trainer's report is a few hundred bytes; anything this large is not one."""


def host(ip: str) -> str:
    """A pod IP as a URL's host: an IPv6 address in brackets (``[fd00::5]``)."""
    return f"[{ip}]" if ":" in ip and not ip.startswith("[") else ip


class TooLarge(Exception):
    """The answer is longer than ``max_bytes``."""


class ProgressReader:
    """Fetches /progress from pod 0 of a job, bounded in time and bytes, with a failure memory."""

    def __init__(
        self,
        enabled: bool,
        timeout: float = 1.0,
        retry_after: float = 60.0,
        port: int = METRICS_PORT,
        max_bytes: int = PROGRESS_MAX_BYTES,
    ) -> None:
        self.enabled = enabled
        self.port = port
        self.timeout = timeout
        """Seconds for the whole exchange: connect, headers and body."""
        self.retry_after = retry_after
        self.max_bytes = max_bytes
        self._failed_until: dict[str, float] = {}
        self._session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        """Close the HTTP connections (the operator's cleanup)."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # Kept alive: each running job's pod 0 is asked every few seconds, on the same
            # connection (the trainer serves HTTP/1.1) rather than a new one each time; one
            # per pod at most. Environment proxies are not for pod IPs.
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    limit=0, limit_per_host=1, keepalive_timeout=KEEPALIVE_SECONDS
                ),
                timeout=aiohttp.ClientTimeout(total=self.timeout),
                trust_env=False,
            )
        return self._session

    async def _fetch(self, url: str) -> dict[str, Any] | None:
        async with self._client().get(url, allow_redirects=False) as response:
            if response.status != 200:
                return None
            if (response.content_length or 0) > self.max_bytes:
                raise TooLarge(f"{response.content_length} bytes")
            body = bytearray()
            async for chunk in response.content.iter_any():
                body += chunk
                if len(body) > self.max_bytes:
                    raise TooLarge(f"more than {self.max_bytes} bytes")
        return progress_fields(read_object(bytes(body), max_chars=self.max_bytes))

    async def read(self, pod: PodView | None) -> dict[str, Any] | None:
        """Progress of the pod holding rank 0, or None when unknown, unreachable or slow."""
        if not self.enabled or pod is None or pod.phase != PodPhase.RUNNING or not pod.pod_ip:
            return None
        now = time.monotonic()
        if self._failed_until.get(pod.pod_ip, 0.0) > now:
            return None
        url = f"http://{host(pod.pod_ip)}:{self.port}/progress"
        try:
            return await self._fetch(url)
        except aiohttp.ClientConnectorError as error:
            if not isinstance(error.os_error, ConnectionRefusedError):
                self._leave_alone(pod.pod_ip, now)
            return None
        except (TimeoutError, aiohttp.ClientError, TooLarge, OSError, ValueError):
            # Too slow (an unroutable KWOK pod IP, a trainer that dribbles), too long, not
            # HTTP, or not a JSON object within the reader's bounds (Unreadable, too deep or
            # not JSON): leave it alone for a while.
            self._leave_alone(pod.pod_ip, now)
            return None

    def _leave_alone(self, pod_ip: str, now: float) -> None:
        if len(self._failed_until) > 1000:  # pod IPs come and go: keep only the live entries
            self._failed_until = {ip: t for ip, t in self._failed_until.items() if t > now}
        self._failed_until[pod_ip] = now + self.retry_after
