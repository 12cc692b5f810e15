"""Deadline-based waiting for tests: poll a predicate until it holds or the deadline passes.

A timeout says what was awaited and what was last seen, so a red test explains itself.

Without an explicit interval the polls back off, from 0.1 s to one each half second: what
happens at once is seen at once, and a long wait does not spend the machine's CPUs on polling.
Most predicates run kubectl (0.03-0.05 CPU-seconds a call, plus the API server's share), so a
fixed 0.2 s poll kept about a quarter of a core busy per waiting test, taken from the training
tiers that run beside it on the suite's two CPUs.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


FIRST_PAUSE = 0.1
"""Seconds before the second call of an awaited predicate."""
BACKOFF = 1.5
"""Each pause this many times the one before ..."""
LONGEST_PAUSE = 0.5
"""... up to this many seconds."""


class WaitTimeout(AssertionError):
    """The awaited condition did not hold before the deadline."""


def wait_for(
    predicate: Callable[[], T | None],
    timeout: float,
    what: str,
    interval: float | None = None,
    describe: Callable[[], object] | None = None,
) -> T:
    """Call ``predicate`` until it returns a truthy value and return that value.

    ``interval`` fixes the pause between calls; unset, the pauses grow from FIRST_PAUSE by
    BACKOFF up to LONGEST_PAUSE.

    ``what`` names the condition for the error message; ``describe`` (optional) is called on
    timeout to report the current state (for example the object's status).
    """
    deadline = time.monotonic() + timeout
    pause = FIRST_PAUSE if interval is None else interval
    last_error: BaseException | None = None
    while True:
        try:
            value = predicate()
            if value:
                return value
        except Exception as exc:  # transient API errors while objects come and go
            last_error = exc
        if time.monotonic() >= deadline:
            seen = ""
            if describe is not None:
                try:
                    seen = f"; last seen: {describe()!r}"
                except Exception as exc:
                    seen = f"; could not describe state: {exc}"
            if last_error is not None:
                seen += f"; last error: {last_error!r}"
            raise WaitTimeout(f"timed out after {timeout:.0f}s waiting for {what}{seen}")
        time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
        if interval is None:
            pause = min(pause * BACKOFF, LONGEST_PAUSE)


def wait_established(
    kubectl: Callable[..., subprocess.CompletedProcess[str]], crd: str, timeout: float = 60
) -> None:
    """Wait until the API server serves the CustomResourceDefinition named ``crd``.

    ``kubectl wait --for=condition=Established`` fails at once, whatever its timeout, when it
    reads a CRD whose status has no conditions yet (".status.conditions accessor error: <nil>"),
    as it can just after the apply; so poll the condition here. ``kubectl`` is a test's runner:
    called with kubectl's arguments and ``check=False``, it returns the completed process.
    """
    name = crd.removeprefix("crd/")
    path = '{.status.conditions[?(@.type=="Established")].status}'

    def established() -> bool:
        proc = kubectl("get", f"crd/{name}", "-o", f"jsonpath={path}", check=False)
        return proc.returncode == 0 and proc.stdout == "True"

    wait_for(established, timeout, f"the CRD {name} to be established")


async def until(
    check: Callable[[], object], what: str, seconds: float = 10, interval: float = 0.02
) -> None:
    """:func:`wait_for` for a test's own event loop: poll ``check`` every ``interval`` seconds
    without blocking the loop under test, and fail naming ``what`` after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise WaitTimeout(f"waited {seconds:g} s for {what}")
        await asyncio.sleep(interval)
