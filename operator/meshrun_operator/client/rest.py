"""The operator's HTTP door to the API server: JSON over one aiohttp session on the event loop.

The generated kubernetes client validates every argument, builds a model of every answer and
waits for each on a pool thread; with its dependencies it also costs the operator a fifth of its
memory. Here a request is one coroutine over kept-alive connections (at most ``connections`` at
once), with the credentials kopf uses (login.py), every request bounded in time (``ApiTimeout``),
and an answer of 401 (a rotated service account token, an expired exec credential) answered by
logging in again, once.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import aiohttp
import kopf

from meshrun_operator.client.errors import ApiError, ApiTimeout

logger = logging.getLogger("meshrun.operator")

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"


class Rest:
    """Requests to one API server, with the credentials ``login`` returns."""

    def __init__(
        self,
        login: Callable[[], kopf.ConnectionInfo],
        timeout: ApiTimeout | None = None,
        connections: int = 32,
        agent: str = "meshrun-operator",
    ) -> None:
        self.login = login
        self.timeout = timeout or ApiTimeout()
        self.connections = connections
        self.agent = agent
        self.info: kopf.ConnectionInfo | None = None
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def _open(self) -> tuple[aiohttp.ClientSession, str]:
        """The session of the running loop (another loop, as in tests, gets its own) and the
        server's URL. Logging in may run a credential program: on a thread, not the loop."""
        loop = asyncio.get_running_loop()
        if self.info is None:
            self.info = await asyncio.to_thread(self.login)
        if self._session is None or self._session.closed or self._loop is not loop:
            info = self.info
            connector = aiohttp.TCPConnector(limit=self.connections, ssl=info.as_ssl_context())
            self._session = aiohttp.ClientSession(
                connector=connector,
                headers={**info.as_http_headers(), "User-Agent": self.agent},
                trust_env=bool(info.trust_env),
            )
            self._loop = loop
        return self._session, self.info.server.rstrip("/")

    async def close(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None

    async def _relogin(self) -> None:
        logger.info("the API server refused the operator's credentials (401): logging in again")
        await self.close()
        self.info = None

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = JSON,
        accept: str = JSON,
        timeout: ApiTimeout | None = None,
        read: bool = True,
    ) -> Any:
        """Send one request; its answer's JSON (None when empty, or when not ``read``: the
        answer is then only drained). ApiError for an error status; a request without an answer
        raises one of ``apiclient.NO_ANSWER``."""
        payload = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        headers = {"Accept": accept}
        if payload is not None:
            headers["Content-Type"] = content_type
        limit = timeout or self.timeout
        bounds = aiohttp.ClientTimeout(sock_connect=limit.connect, sock_read=limit.read)
        for attempt in (0, 1):
            session, server = await self._open()
            async with session.request(
                method, server + path, params=query, data=payload, headers=headers, timeout=bounds
            ) as response:
                data = await response.read()
                status, reason = response.status, response.reason or ""
            if status == 401 and attempt == 0:
                await self._relogin()
                continue
            if status >= 400:
                raise ApiError(status, reason, data.decode(errors="replace"))
            return json.loads(data) if data and read else None
        raise AssertionError("unreachable")  # pragma: no cover

    async def lines(
        self, path: str, query: Mapping[str, str], read_seconds: float
    ) -> AsyncIterator[bytes]:
        """The lines of a long answer as they come (a watch: one JSON event per line); the
        stream may stay silent for ``read_seconds`` at most."""
        bounds = aiohttp.ClientTimeout(sock_connect=self.timeout.connect, sock_read=read_seconds)
        session, server = await self._open()
        async with session.get(
            server + path, params=query, headers={"Accept": JSON}, timeout=bounds
        ) as response:
            if response.status >= 400:
                body = await response.read()
                if response.status == 401:
                    await self._relogin()
                reason = response.reason or ""
                raise ApiError(response.status, reason, body.decode(errors="replace"))
            pending = b""
            # Not readline(): one event (a large object) may be longer than its line limit.
            async for chunk in response.content.iter_any():
                pending += chunk
                *complete, pending = pending.split(b"\n")
                for line in complete:
                    if line.strip():
                        yield line
