"""Reading the trainer's ``/progress`` endpoint on rank 0 (docs/env-contract.md).

On KWOK nodes pods have no real endpoint, so progress may also come from the pod annotation
``meshrun.dev/progress`` (observe.py); the endpoint wins when both exist. An unreachable pod is
not asked again for ``retry_after`` seconds, so fake pod IPs cost one timeout, not one per resync.
"""

from __future__ import annotations

import asyncio
import time
import urllib.error
import urllib.request
from typing import Any

from meshrun_operator import names
from meshrun_operator.observe import PodView, parse_progress
from meshrun_operator.vocabulary import PodPhase


class ProgressReader:
    """Fetches /progress from pod 0 of a job, with a short timeout and a failure memory."""

    def __init__(
        self,
        enabled: bool,
        timeout: float = 0.5,
        retry_after: float = 60.0,
        port: int = names.METRICS_PORT,
    ) -> None:
        self.enabled = enabled
        self.port = port
        self.timeout = timeout
        self.retry_after = retry_after
        self._failed_until: dict[str, float] = {}

    def _fetch(self, url: str) -> dict[str, Any] | None:
        with urllib.request.urlopen(url, timeout=self.timeout) as response:
            return parse_progress(response.read().decode("utf-8", "replace"))

    async def read(self, pod: PodView | None) -> dict[str, Any] | None:
        """Progress of the pod holding rank 0, or None when unknown or unreachable."""
        if not self.enabled or pod is None or pod.phase != PodPhase.RUNNING or not pod.pod_ip:
            return None
        now = time.monotonic()
        if self._failed_until.get(pod.pod_ip, 0.0) > now:
            return None
        url = f"http://{pod.pod_ip}:{self.port}/progress"
        try:
            return await asyncio.to_thread(self._fetch, url)
        except urllib.error.URLError as error:
            if not isinstance(error.reason, ConnectionRefusedError):
                self._failed_until[pod.pod_ip] = now + self.retry_after
            # Refused: the trainer has not opened its port yet, and asking again is cheap.
            return None
        except (OSError, ValueError):
            # A timeout (an unroutable KWOK pod IP) costs a thread for `timeout` seconds.
            self._failed_until[pod.pod_ip] = now + self.retry_after
            return None
