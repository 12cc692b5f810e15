"""The three Lease calls leader election makes (runtime/leader.py), over connections of their
own."""

from __future__ import annotations

from typing import Any

from meshrun_operator.client.errors import ApiError, ApiTimeout
from meshrun_operator.client.kube import Kube, group_path
from meshrun_operator.client.rest import Rest

GROUP, VERSION, PLURAL = "coordination.k8s.io", "v1", "leases"


class LeaseApi:
    """Read, create and replace one Lease through a session of its own (``rest``): renewals
    never queue behind the reconciler's requests for a connection."""

    def __init__(self, rest: Rest, timeout: ApiTimeout | None = None) -> None:
        self.rest = rest
        # Counted like every request; never refused: the Lease is how leadership is won.
        self.kube = Kube(rest, timeout)

    async def _call(self, verb: str, method: str, path: str, body: Any = None) -> Any:
        return await self.kube.call(verb, PLURAL, method, path, body=body)

    async def read(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Lease as a dict (API field names), or None when there is none."""
        try:
            found: dict[str, Any] = await self._call(
                "get", "GET", group_path(GROUP, VERSION, PLURAL, namespace, name)
            )
        except ApiError as error:
            if error.status == 404:
                return None
            raise
        return found

    async def create(self, namespace: str, name: str, spec: dict[str, Any]) -> bool:
        """Create it; False when someone else created it first."""
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "Lease",
            "metadata": {"name": name, "namespace": namespace},
            "spec": spec,
        }
        try:
            await self._call("create", "POST", group_path(GROUP, VERSION, PLURAL, namespace), body)
        except ApiError as error:
            if error.status == 409:
                return False
            raise
        return True

    async def replace(self, namespace: str, name: str, version: str, spec: dict[str, Any]) -> bool:
        """Replace its spec if it is still at ``version``; False when it changed meanwhile."""
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "Lease",
            "metadata": {"name": name, "namespace": namespace, "resourceVersion": version},
            "spec": spec,
        }
        path = group_path(GROUP, VERSION, PLURAL, namespace, name)
        try:
            await self._call("update", "PUT", path, body)
        except ApiError as error:
            if error.status == 409:
                return False
            raise
        return True
