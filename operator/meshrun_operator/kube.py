"""The operator's only door to the API server: create, delete and patch, concurrently.

The kubernetes client is synchronous, so calls run in a dedicated thread pool; a job's pods are
created with one ``asyncio.gather`` instead of one after another (Kubeflow #2361: serial pod
creation made large jobs slow to launch). Every request is counted for /metrics and the scale
benchmark, and every request has a timeout (``ApiTimeout``): a stuck API server costs a reconcile
one timeout, never a thread forever. While another operator leads (leader.py), no write is sent.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any, TypeVar

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from meshrun_operator import metrics, names
from meshrun_operator.answers import ChildRejected, Holder, Refused
from meshrun_operator.apiclient import NO_ANSWER, WRITES, ApiTimeout, NotLeader
from meshrun_operator.conditions import format_time

T = TypeVar("T")
logger = logging.getLogger("meshrun.operator")

EVENT_MESSAGE_MAX = 1000
"""Event messages are cut to this length (the API server limits event notes to 1 KiB)."""

CUSTOM_KINDS = {
    "NetworkPolicy": {"networking.k8s.io/v1": ("networking.k8s.io", "v1", "networkpolicies")},
    "PodGroup": {
        "scheduling.volcano.sh/v1beta1": ("scheduling.volcano.sh", "v1beta1", "podgroups"),
        "scheduling.x-k8s.io/v1alpha1": ("scheduling.x-k8s.io", "v1alpha1", "podgroups"),
    },
    "Workload": {"kueue.x-k8s.io/v1beta2": ("kueue.x-k8s.io", "v1beta2", "workloads")},
}


class StaleJob(Exception):
    """A patch lost the race with another write to the job (optimistic concurrency)."""


def _reason(error: ApiException) -> str:
    try:
        body = json.loads(error.body or "{}")
    except ValueError:
        return str(error.reason)
    return str(body.get("message") or error.reason)


class Kube:
    """Asynchronous wrappers of the few API calls the reconciler makes."""

    def __init__(
        self, api: client.ApiClient, workers: int = 32, timeout: ApiTimeout | None = None
    ) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="meshrun-api")
        self.timeout = timeout or ApiTimeout()
        self.may_write: Callable[[], bool] = lambda: True
        """False while another operator holds the lease: every write raises NotLeader."""

    async def _call(
        self, verb: str, resource: str, fn: Callable[..., T], *args: Any, **kwargs: Any
    ) -> T:
        if verb in WRITES and not self.may_write():
            raise NotLeader(f"{verb} {resource} not sent: this operator is not the leader")
        metrics.API_REQUESTS.labels(verb=verb, resource=resource).inc()
        kwargs.setdefault("_request_timeout", self.timeout.request)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.pool, lambda: fn(*args, **kwargs))

    async def _send(
        self, verb: str, resource: str, fn: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> None:
        """A call whose answer is not needed: the client builds no model of it (a pod's answer
        alone is hundreds of objects), the answer is read only to keep the connection. An error
        answer still raises ApiException, with its body."""

        def unread(*inner: Any, **options: Any) -> None:
            response = fn(*inner, _preload_content=False, **options)
            response.read()
            response.release_conn()

        await self._call(verb, resource, unread, *args, **kwargs)

    async def create(self, obj: Mapping[str, Any]) -> bool:
        """Create ``obj``; False when it already exists. ChildRejected when it is invalid."""
        kind, meta = obj["kind"], obj["metadata"]
        ns, name = meta["namespace"], meta["name"]
        try:
            if kind == "Pod":
                await self._send("create", "pods", self.core.create_namespaced_pod, ns, obj)
            elif kind == "Service":
                await self._send("create", "services", self.core.create_namespaced_service, ns, obj)
            else:
                group, version, plural = CUSTOM_KINDS[kind][obj["apiVersion"]]
                await self._send(
                    "create",
                    plural,
                    self.custom.create_namespaced_custom_object,
                    group,
                    version,
                    ns,
                    plural,
                    obj,
                )
        except ApiException as error:
            if error.status == 409:
                return False
            if error.status in (400, 422):
                raise ChildRejected(kind, name, _reason(error)) from error
            if error.status in (403, 429) or (error.status or 0) >= 500:
                raise Refused(kind, name, int(error.status), _reason(error)) from error
            raise
        return True

    async def create_all(self, objs: Iterable[Mapping[str, Any]]) -> list[bool | Refused]:
        """Create many objects concurrently: True (created), False (the name exists) or the
        Refused of each; any other error is raised once all finished."""
        results = await asyncio.gather(*(self.create(o) for o in objs), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, Refused):
                raise result
        return [r if isinstance(r, Refused) else bool(r) for r in results]

    async def holder(self, kind: str, namespace: str, name: str) -> Holder | None:
        """Who holds the name of a Pod or Service that already exists (None when it is gone)."""
        read = self.core.read_namespaced_pod if kind == "Pod" else self.core.read_namespaced_service
        try:
            found: Any = await self._call("get", f"{kind.lower()}s", read, name, namespace)
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        meta = found.metadata
        owners = (meta.owner_references if meta else None) or []
        controller = next((o.uid for o in owners if o.controller), None)
        labels = (meta.labels if meta else None) or {}
        attempt = int(labels.get(names.LABEL_ATTEMPT, "-1"))
        return Holder(controller, attempt, bool(meta and meta.deletion_timestamp))

    async def delete_service(self, namespace: str, name: str) -> None:
        """Delete a Service (an orphan that holds the name of the job's own)."""
        try:
            await self._send(
                "delete", "services", self.core.delete_namespaced_service, name, namespace
            )
        except ApiException as error:
            if error.status != 404:
                raise

    async def delete_pods(
        self,
        namespace: str,
        pods: Iterable[str],
        force: bool,
        uids: Mapping[str, str] | None = None,
    ) -> None:
        """Delete pods concurrently; grace period 0 when ``force`` (their node is gone). With
        the pod's uid in ``uids`` the delete is preconditioned on it, so a newer pod that took
        the name meanwhile is never deleted in its place (409: nothing to do)."""

        async def one(name: str) -> None:
            uid = (uids or {}).get(name)
            body = client.V1DeleteOptions(
                grace_period_seconds=0 if force else None,
                propagation_policy="Background",
                preconditions=client.V1Preconditions(uid=uid) if uid else None,
            )
            try:
                await self._send(
                    "delete", "pods", self.core.delete_namespaced_pod, name, namespace, body=body
                )
            except ApiException as error:
                if error.status not in (404, 409):
                    raise

        await asyncio.gather(*(one(p) for p in pods))

    async def patch_status(
        self, namespace: str, name: str, resource_version: str, status: Mapping[str, Any]
    ) -> dict[str, Any]:
        """Write the status in one merge patch of /status (None values remove fields).

        The patch carries the resourceVersion it was computed from as a precondition: a decision
        made on a stale copy gets 409 Conflict (StaleJob) instead of overwriting newer data.
        Returns the job as the API server holds it after the patch.
        """
        body = {"metadata": {"resourceVersion": resource_version}, "status": status}
        return await self._patch(
            "/status", self.custom.patch_namespaced_custom_object_status, namespace, name, body
        )

    async def post_event(
        self, involved: Mapping[str, str], type: str, reason: str, message: str
    ) -> None:
        """Post a core/v1 Event about ``involved``; a failure is logged, never raised (Events
        help people but must not stop a reconcile)."""
        now, namespace = format_time(datetime.now(UTC)), involved["namespace"]
        body = {
            "metadata": {"generateName": f"{involved['name']}.", "namespace": namespace},
            "involvedObject": dict(involved),
            "type": type,
            "reason": reason,
            "message": message[:EVENT_MESSAGE_MAX],
            "source": {"component": names.MANAGED_BY},
            "reportingComponent": names.MANAGED_BY,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self._send("create", "events", self.core.create_namespaced_event, namespace, body)
        except (ApiException, *NO_ANSWER) as error:
            logger.warning("could not post Event %s on %s: %s", reason, involved["name"], error)

    async def _patch(
        self, sub: str, fn: Callable[..., Any], namespace: str, name: str, body: Any
    ) -> dict[str, Any]:
        try:
            result = await self._call(
                "patch",
                names.PLURAL + sub,
                fn,
                names.GROUP,
                names.VERSION,
                namespace,
                names.PLURAL,
                name,
                body,
            )
        except ApiException as error:
            if error.status == 409:
                raise StaleJob(f"{namespace}/{name} changed meanwhile: {_reason(error)}") from error
            raise
        return dict(result)

    async def delete_job(self, namespace: str, name: str) -> None:
        try:
            await self._call(
                "delete",
                names.PLURAL,
                self.custom.delete_namespaced_custom_object,
                names.GROUP,
                names.VERSION,
                namespace,
                names.PLURAL,
                name,
            )
        except ApiException as error:
            if error.status != 404:
                raise

    async def get_custom(
        self, group: str, version: str, plural: str, name: str, namespace: str | None = None
    ) -> dict[str, Any] | None:
        """A custom object (a Kueue ResourceFlavor; a LocalQueue with ``namespace``), or None
        when it does not exist."""
        custom = self.custom
        fn, where = (
            (custom.get_cluster_custom_object, ())
            if namespace is None
            else (custom.get_namespaced_custom_object, (namespace,))
        )
        try:
            found: Any = await self._call("get", plural, fn, group, version, *where, plural, name)
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        return dict(found)

    async def patch_custom_status(
        self, group: str, version: str, plural: str, namespace: str, name: str, body: Any
    ) -> dict[str, Any]:
        """Merge-patch a custom object's /status (a Kueue Workload); the body may carry the
        resourceVersion it was computed from, and then a stale one gets 409."""
        result: Any = await self._call(
            "patch",
            f"{plural}/status",
            self.custom.patch_namespaced_custom_object_status,
            group,
            version,
            namespace,
            plural,
            name,
            body,
        )
        return dict(result)
