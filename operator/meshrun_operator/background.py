"""Background loops that never die silently: the node watch, the lease loop and the resync loop.

Each survives any exception of its own (a bug, a malformed answer, a CancelledError that a
request raised without the task being cancelled), logs it and tries again after an exponential
backoff; only a real cancellation (the operator shutting down) ends it. Each records when it
last made progress, and /healthz fails when one has ended or has made none for its deadline
(``Liveness.check``): the operator restarts instead of silently no longer noticing nodes,
renewing its lease or reconciling.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

logger = logging.getLogger("meshrun.operator")


class Stalled(Exception):
    """A background loop ended or made no progress for its deadline: /healthz fails with this."""


def cancelled() -> bool:
    """Whether the running task was asked to stop (not just handed a CancelledError by a
    request that was cut off under it)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


class Liveness:
    """One background loop's progress, failures and backoff."""

    def __init__(
        self, name: str, deadline: float, backoff_base: float = 1.0, backoff_max: float = 60.0
    ) -> None:
        self.name = name
        self.deadline = deadline
        """Seconds without progress after which /healthz fails."""
        self.backoff_base, self.backoff_max = backoff_base, backoff_max
        self.progressed_at = time.monotonic()
        self.failures = 0
        """Failures since the last progress."""
        self.last_error = ""
        self.task: asyncio.Task[Any] | None = None
        """The task running the loop, once started."""

    def progressed(self) -> None:
        """The loop did useful work (an answer, an event, a pass): its backoff starts over."""
        self.progressed_at = time.monotonic()
        self.failures = 0

    def backoff(self) -> float:
        """Seconds to wait after the current run of failures."""
        return float(min(self.backoff_max, self.backoff_base * 2 ** max(0, self.failures - 1)))

    async def failed(self, error: BaseException) -> None:
        """Log ``error`` and wait out the backoff; re-raise a real cancellation."""
        if isinstance(error, asyncio.CancelledError) and cancelled():
            raise error
        self.failures += 1
        self.last_error = repr(error)
        wait = self.backoff()
        logger.warning(
            "%s failed (%s, %d in a row); again in %.3g s",
            self.name,
            self.last_error,
            self.failures,
            wait,
            exc_info=not isinstance(error, asyncio.CancelledError | OSError | TimeoutError),
        )
        await asyncio.sleep(wait)

    def check(self) -> dict[str, Any]:
        """What /healthz reports of the loop; Stalled when it ended or made no progress for
        its deadline."""
        task = self.task
        if task is not None and task.done():
            why = "cancelled" if task.cancelled() else repr(task.exception())
            raise Stalled(f"the {self.name} ended: {why}")
        quiet = time.monotonic() - self.progressed_at
        if quiet > self.deadline:
            last = f"; last error {self.last_error}" if self.failures else ""
            raise Stalled(
                f"the {self.name} made no progress for {quiet:.0f} s "
                f"(deadline {self.deadline:g} s, {self.failures} failures{last})"
            )
        return {"secondsSinceProgress": round(quiet, 1), "failures": self.failures}
