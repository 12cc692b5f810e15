"""Deadline-based waiting for tests: poll a predicate until it holds or the deadline passes.

A timeout says what was awaited and what was last seen, so a red test explains itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """The awaited condition did not hold before the deadline."""


def wait_for(
    predicate: Callable[[], T | None],
    timeout: float,
    what: str,
    interval: float = 0.2,
    describe: Callable[[], object] | None = None,
) -> T:
    """Call ``predicate`` until it returns a truthy value and return that value.

    ``what`` names the condition for the error message; ``describe`` (optional) is called on
    timeout to report the current state (for example the object's status).
    """
    deadline = time.monotonic() + timeout
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
        time.sleep(interval)
