"""The operator's HTTP door to the API server: JSON over aiohttp sessions on the event loop.

The generated kubernetes client validates every argument, builds a model of every answer and
waits for each on a pool thread; with its models it also costs the operator a fifth of its
memory. Here a request is one coroutine over kept-alive connections (at most ``connections`` at
once), with the process's credentials (login.py, the same kopf uses), every request bounded in
time (``ApiTimeout``, and a caller's ``deadline``).

Each login's credentials get a session of their own. An answer of 401 (a rotated token, an
expired exec credential) logs in again (once for however many requests were refused) and sends
the request again, once, on the new session; the old session is closed only after its last
request ended, so no request in flight or waiting for a connection is cut off.

``before_send`` is called once the request holds a connection, right before its first byte is
written (after the login and the wait for a free connection): a write that waited there while
this operator lost its lease is never sent (kube.py).
"""

from __future__ import annotations

import asyncio
import asyncio.sslproto
import contextvars
import json
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from meshrun_operator.client.credentials import Credentials
from meshrun_operator.client.errors import ApiError, ApiTimeout, json_body, retry_after
from meshrun_operator.client.login import Login

logger = logging.getLogger("meshrun.operator")

TLS_READ_BUFFER = 16 * 1024
"""The read buffer of each TLS connection: one TLS record's most plaintext. asyncio allocates
``SSLProtocol.max_size`` bytes (256 KiB) for every connection and zeroes them, so all of it is
resident; the operator holds one connection per concurrent request (``--workers``), two for the
Lease and one per kopf watch, and reads answers of a few KiB. A large listing (``chunk_size``
500 nodes, about 1 MiB a page) takes more reads of 16 KiB each. Measured at 200 jobs on 1,000
nodes (bench/operator_scale.py): peak RSS 95 MiB at 64 KiB, 93 at 16 KiB, the launches as fast."""


def smaller_tls_buffers(size: int = TLS_READ_BUFFER) -> None:
    """Make new TLS connections of this process read through ``size`` bytes instead of asyncio's
    256 KiB (``asyncio.sslproto.SSLProtocol.max_size``, the class's own tunable); a smaller
    size already set is kept."""
    protocol = asyncio.sslproto.SSLProtocol
    protocol.max_size = min(protocol.max_size, size)


JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"

BEFORE_SEND: contextvars.ContextVar[Callable[[], None] | None] = contextvars.ContextVar(
    "meshrun_before_send", default=None
)
"""The check of the request this task is sending (a context variable: one per task)."""


class CheckedRequest(aiohttp.ClientRequest):
    """An aiohttp request that runs its task's ``BEFORE_SEND`` check once it holds a
    connection; an exception there ends the request unsent."""

    async def send(self, conn: Any) -> aiohttp.ClientResponse:
        check = BEFORE_SEND.get()
        if check is not None:
            check()
        return await super().send(conn)


@dataclass(eq=False)
class Session:
    """One login's aiohttp session and the requests using it."""

    info: Credentials
    session: aiohttp.ClientSession
    loop: asyncio.AbstractEventLoop
    users: int = 0
    """Requests (and streams) in flight or waiting for a connection on it."""
    retired: bool = False
    """A newer login's session serves new requests: closed once ``users`` is 0."""


class Rest:
    """Requests to one API server, with the credentials of ``login``."""

    def __init__(
        self,
        login: Login,
        timeout: ApiTimeout | None = None,
        connections: int = 32,
        agent: str = "meshrun-operator",
    ) -> None:
        self.login = login
        self.timeout = timeout or ApiTimeout()
        self.connections = connections
        self.agent = agent
        self._current: Session | None = None
        self._closing: set[asyncio.Task[None]] = set()

    @property
    def info(self) -> Credentials | None:
        """The credentials of the session new requests use (None before the first)."""
        return self._current.info if self._current is not None else None

    async def _acquire(self) -> Session:
        """The session of the current credentials (a new one after a new login; another
        loop, as in tests, gets its own), counted as used until ``_release``."""
        info = await self.login.current()
        loop = asyncio.get_running_loop()
        current = self._current
        if current is None or current.info is not info or current.loop is not loop:
            if current is not None and current.loop is loop:
                current.retired = True
                self._close_if_idle(current)
            connector = aiohttp.TCPConnector(limit=self.connections, ssl=info.as_ssl_context())
            session = aiohttp.ClientSession(
                connector=connector,
                headers={**info.as_http_headers(), "User-Agent": self.agent},
                proxy=info.proxy_url,
                trust_env=bool(info.trust_env),
                request_class=CheckedRequest,
            )
            current = self._current = Session(info, session, loop)
        current.users += 1
        return current

    def _release(self, used: Session) -> None:
        used.users -= 1
        self._close_if_idle(used)

    def _close_if_idle(self, used: Session) -> None:
        if used.retired and used.users == 0 and not used.session.closed:
            task = asyncio.create_task(used.session.close())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        current, self._current = self._current, None
        if (
            current is not None
            and not current.session.closed
            and current.loop is asyncio.get_running_loop()
        ):
            await current.session.close()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)

    async def _refused(self, used: Session) -> None:
        logger.info("the API server refused the operator's credentials (401): logging in again")
        await self.login.refused(used.info)

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
        deadline: float | None = None,
        before_send: Callable[[], None] | None = None,
        read: bool = True,
        what: str | None = None,
    ) -> Any:
        """Send one request; its answer's JSON (None when empty, or when not ``read``: the
        answer is then only drained). ApiError for an error status; a request without an answer
        raises one of ``errors.NO_ANSWER``. ``deadline``: seconds the whole request may
        take, the waits for a login and a connection included. A body holding NaN or an infinite
        number raises NotJson, naming ``what`` (the method and path unless given) and the field,
        before anything is sent."""
        payload = None if body is None else json_body(body, what or f"{method} {path}")
        headers = {"Accept": accept}
        if payload is not None:
            headers["Content-Type"] = content_type
        limit = timeout or self.timeout
        totals = [t for t in (limit.total, deadline) if t is not None]
        bounds = aiohttp.ClientTimeout(sock_connect=limit.connect, sock_read=limit.read)
        token = BEFORE_SEND.set(before_send)
        try:
            # The whole of it: the login, the wait for a connection, a second try after a 401.
            async with asyncio.timeout(min(totals) if totals else None):
                return await self._send(method, path, query, payload, headers, bounds, read)
        finally:
            BEFORE_SEND.reset(token)

    async def _send(
        self,
        method: str,
        path: str,
        query: Mapping[str, str] | None,
        payload: bytes | None,
        headers: dict[str, str],
        bounds: aiohttp.ClientTimeout,
        read: bool,
    ) -> Any:
        for attempt in (0, 1):
            used = await self._acquire()
            try:
                async with used.session.request(
                    method,
                    used.info.server.rstrip("/") + path,
                    params=query,
                    data=payload,
                    headers=headers,
                    timeout=bounds,
                ) as response:
                    data = await response.read()
                    status, reason = response.status, response.reason or ""
                    wait = retry_after(response.headers.get("Retry-After"))
            finally:
                self._release(used)
            if status == 401 and attempt == 0:
                await self._refused(used)
                continue
            if status >= 400:
                raise ApiError(status, reason, data.decode(errors="replace"), wait)
            return json.loads(data) if data and read else None
        raise AssertionError("unreachable")  # pragma: no cover

    async def lines(
        self, path: str, query: Mapping[str, str], read_seconds: float
    ) -> AsyncIterator[bytes]:
        """The lines of a long answer as they come (a watch: one JSON event per line); the
        stream may stay silent for ``read_seconds`` at most."""
        bounds = aiohttp.ClientTimeout(sock_connect=self.timeout.connect, sock_read=read_seconds)
        used = await self._acquire()
        try:
            async with used.session.get(
                used.info.server.rstrip("/") + path,
                params=query,
                headers={"Accept": JSON},
                timeout=bounds,
            ) as response:
                if response.status >= 400:
                    body = await response.read()
                    if response.status == 401:
                        await self._refused(used)
                    reason, text = response.reason or "", body.decode(errors="replace")
                    wait = retry_after(response.headers.get("Retry-After"))
                    raise ApiError(response.status, reason, text, wait)
                pending = b""
                # Not readline(): one event (a large object) may be longer than its line limit.
                async for chunk in response.content.iter_any():
                    pending += chunk
                    *complete, pending = pending.split(b"\n")
                    for line in complete:
                        if line.strip():
                            yield line
        finally:
            self._release(used)
