"""The three Lease calls leader election makes (leader.py), on a thread of their own."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from meshrun_operator import metrics
from meshrun_operator.apiclient import ApiTimeout


class LeaseApi:
    """Read, create and replace one Lease, on a thread of its own: renewals never queue behind
    the reconciler's requests."""

    def __init__(self, api: client.ApiClient, timeout: ApiTimeout) -> None:
        self.coordination = client.CoordinationV1Api(api)
        self.api, self.timeout = api, timeout
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="meshrun-lease")

    async def _call(self, verb: str, fn: Callable[..., Any], *args: Any) -> Any:
        metrics.API_REQUESTS.labels(verb=verb, resource="leases").inc()
        loop = asyncio.get_running_loop()
        call = functools.partial(fn, *args, _request_timeout=self.timeout.request)
        return await loop.run_in_executor(self.pool, call)

    async def read(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Lease as a dict (API field names), or None when there is none."""
        try:
            lease = await self._call(
                "get", self.coordination.read_namespaced_lease, name, namespace
            )
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        found: dict[str, Any] = self.api.sanitize_for_serialization(lease)  # type: ignore[no-untyped-call]
        return found

    async def create(self, namespace: str, name: str, spec: dict[str, Any]) -> bool:
        """Create it; False when someone else created it first."""
        body = {"metadata": {"name": name, "namespace": namespace}, "spec": spec}
        try:
            await self._call("create", self.coordination.create_namespaced_lease, namespace, body)
        except ApiException as error:
            if error.status == 409:
                return False
            raise
        return True

    async def replace(self, namespace: str, name: str, version: str, spec: dict[str, Any]) -> bool:
        """Replace its spec if it is still at ``version``; False when it changed meanwhile."""
        body = {
            "metadata": {"name": name, "namespace": namespace, "resourceVersion": version},
            "spec": spec,
        }
        try:
            await self._call(
                "update", self.coordination.replace_namespaced_lease, name, namespace, body
            )
        except ApiException as error:
            if error.status == 409:
                return False
            raise
        return True
