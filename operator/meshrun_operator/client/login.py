"""The operator's credentials, one login at a time for the whole process (``Login``): kopf's
watches and the operator's requests (rest.py) use the same, read by the ``kubernetes``
package's config loader (credentials.py: service account, kubeconfig and every auth form the
loader supports).

Logging in again: when the credentials expire (an exec plugin's ``expirationTimestamp``; the
loader's five minutes early), when a token file changes (the kubelet rotates a projected service
account token by replacing the file), when a kubeconfig file changes, and when the API server
answers 401. Many requests refused at once, or a cold start with many requests, make one login.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime

from meshrun_operator.client.credentials import (
    Credentials,
    Issued,
    KubeconfigLogin,
    LoginError,
    own_namespace,
    source,
    stamp,
)

__all__ = ["Login", "LoginError", "from_kubeconfig", "login", "own_namespace"]

LOGIN_SECONDS = 60.0
"""How long a request waits for a login (a credential program that hangs costs this, not the
operator). A login that has not ended by then goes on: the next request waits for that one
instead of starting another, so a credential program that never returns is one thread and one
process, however often the operator tries."""

STAT_SECONDS = 1.0
"""Token and kubeconfig files are looked at (stat) at most this often."""


def login(kubeconfig: str | None = None) -> Credentials:
    """Log in once: its service account in a pod, else ``kubeconfig`` (default KUBECONFIG as it
    is now, else ~/.kube/config). LoginError names the file and what is wrong."""
    return source(kubeconfig)().info


def from_kubeconfig(listed: str) -> Credentials:
    """The current context of the kubeconfig files in ``listed``, as the loader reads it."""
    return KubeconfigLogin(listed).issue().info


class Login:
    """The process's credentials: every HTTP session (rest.py) and kopf's login handler ask
    here, and one login at a time runs (on a thread: a credential program may take seconds),
    however many requests wait for it."""

    def __init__(self, kubeconfig: str | None = None) -> None:
        self._issue = source(kubeconfig)
        self._issued: Issued | None = None
        self._checked_at = 0.0
        self._lock: asyncio.Lock | None = None
        self._lock_loop: asyncio.AbstractEventLoop | None = None
        self._given_to_kopf: Credentials | None = None
        self._running: asyncio.Future[Issued] | None = None
        """The login on a thread that has not ended yet (its credential program still runs)."""
        self.logins = 0
        """Logins done so far."""

    def login_now(self) -> Credentials:
        """Log in at once (synchronously, before the event loop runs: a start-up check whose
        credentials the first requests then use)."""
        self._issued = self._issue()
        self.logins += 1
        self._checked_at = time.monotonic()
        return self._issued.info

    def _stale(self) -> bool:
        issued = self._issued
        if issued is None:
            return True
        if issued.refresh_at is not None and datetime.now(UTC) >= issued.refresh_at:
            return True
        now = time.monotonic()
        if issued.watched and now - self._checked_at >= STAT_SECONDS:
            self._checked_at = now
            return tuple(stamp(w) for w in issued.watched) != issued.stamps
        return False

    def _locked(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        if self._lock is None or self._lock_loop is not loop:  # another loop (tests)
            self._lock, self._lock_loop = asyncio.Lock(), loop
        return self._lock

    async def _login(self) -> Credentials:
        running = self._running
        if (
            running is None
            or running.done()
            or running.get_loop() is not asyncio.get_running_loop()
        ):
            if running is not None and running.done() and not running.cancelled():
                running.exception()  # its end was nobody's to hear: not logged as unheard
            running = self._running = asyncio.ensure_future(asyncio.to_thread(self._issue))
        # Shielded: a request that stops waiting leaves the login running, for the next to join.
        self._issued = await asyncio.wait_for(asyncio.shield(running), LOGIN_SECONDS)
        self.logins += 1
        self._checked_at = time.monotonic()
        return self._issued.info

    async def current(self) -> Credentials:
        """The credentials to send now: the last login's while they are fresh."""
        issued = self._issued
        if issued is not None and not self._stale():
            return issued.info
        async with self._locked():
            if self._issued is issued or self._issued is None:
                return await self._login()
            return self._issued.info

    async def refused(self, info: Credentials) -> Credentials:
        """The API server refused ``info`` (401): log in again, unless another request
        already did since ``info`` was handed out."""
        async with self._locked():
            if self._issued is None or self._issued.info is info:
                return await self._login()
            return self._issued.info

    async def for_kopf(self) -> Credentials:
        """What kopf's login handler returns. kopf asks again only when the last answer was
        refused or expired: that one is not handed out twice."""
        given = self._given_to_kopf
        info = await (self.current() if given is None else self.refused(given))
        self._given_to_kopf = info
        return info
