"""The operator's only door to the API server: create, delete and patch, concurrently.

Every call is a coroutine on the operator's own loop (rest.py), so a job's pods are created with
one ``asyncio.gather`` instead of one after another (Kubeflow #2361: serial pod creation made large
jobs slow to launch). Every request is counted for /metrics and the scale benchmark, and every
request has a timeout (``ApiTimeout``): a stuck API server costs a reconcile one timeout, never a
task forever. While another operator leads (runtime/leader.py), no write is sent.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from meshrun.api.crd import GROUP, PLURAL, VERSION
from meshrun_operator import metrics, names
from meshrun_operator.client.answers import ChildRejected, Holder, Refused
from meshrun_operator.client.errors import (
    NO_ANSWER,
    WRITES,
    ApiError,
    ApiTimeout,
    NamespaceGone,
    NotLeader,
    says_namespace_gone,
)
from meshrun_operator.client.rest import JSON_PATCH, MERGE_PATCH, Rest
from meshrun_operator.clock import format_time
from meshrun_operator.kinds import EVENT, KINDS, POD, Served

logger = logging.getLogger("meshrun.operator")

EVENT_MESSAGE_MAX = 1000
"""Event messages are cut to this length (the API server limits event notes to 1 KiB)."""


def served_path(served: Served, namespace: str | None, name: str = "") -> str:
    """The URL path of ``served``'s objects (in ``namespace``, or of every namespace)."""
    if not served.group:
        return core_path(served.plural, namespace, name)
    return group_path(served.group, served.version, served.plural, namespace, name)


def child_path(kind: str, namespace: str, name: str, api_version: str | None = None) -> str:
    """The URL path of one object of a kind of the table (kinds.py): a Pod, a Service, a
    NetworkPolicy, or a PodGroup or Workload of ``api_version`` (the first one made when
    None)."""
    return served_path(KINDS[kind].at(api_version), namespace, name)


class StaleJob(Exception):
    """A patch lost the race with another write to the job (optimistic concurrency)."""


SLOW_START_BATCH = 1
"""The first batch of a gang's creates (the Job controller's SlowStartInitialBatchSize)."""

IN_NAMESPACE = re.compile(r"^/apis?/.+?/namespaces/([^/]+)/")
"""The namespace of a request's path (for an object or a collection in one)."""


def core_path(plural: str, namespace: str | None, name: str = "") -> str:
    """The URL path of core/v1 ``plural`` (in ``namespace``, or of every namespace)."""
    where = f"/namespaces/{namespace}" if namespace else ""
    return f"/api/v1{where}/{plural}" + (f"/{name}" if name else "")


def group_path(group: str, version: str, plural: str, namespace: str | None, name: str = "") -> str:
    """The URL path of ``plural`` of an API group (in ``namespace``, or cluster-wide)."""
    where = f"/namespaces/{namespace}" if namespace else ""
    return f"/apis/{group}/{version}{where}/{plural}" + (f"/{name}" if name else "")


def job_path(namespace: str, name: str, sub: str = "") -> str:
    """The URL path of one ParallelTrainingJob (``sub``: "/status")."""
    return group_path(GROUP, VERSION, PLURAL, namespace, name) + sub


def kind_path(obj: Mapping[str, Any]) -> tuple[str, str]:
    """(resource, collection path) where ``obj`` is created."""
    served = KINDS[obj["kind"]].at(obj["apiVersion"])
    return served.plural, served_path(served, obj["metadata"]["namespace"])


class Kube:
    """Asynchronous wrappers of the few API calls the reconciler makes."""

    def __init__(self, rest: Rest, timeout: ApiTimeout | None = None) -> None:
        self.rest = rest
        self.timeout = timeout or rest.timeout
        self.may_write: Callable[[], bool] = lambda: True
        """False while another operator holds the lease: every write raises NotLeader."""
        self.write_seconds: Callable[[], float | None] = lambda: None
        """How long a write started now may take: until this operator's lease would end (None:
        no lease, only the request timeouts)."""

    async def call(
        self,
        verb: str,
        resource: str,
        method: str,
        path: str,
        *,
        sent: Callable[[], None] | None = None,
        **options: Any,
    ) -> Any:
        """One request, counted when sent; NotLeader for a write while another operator leads,
        NamespaceGone when the API server says the request's namespace is being deleted or gone.
        ``sent`` is called once the request holds a connection and is about to be written: a
        request that raised before it never reached the API server.

        A write is checked twice: before it waits for anything, and once it holds a connection
        (after the login and the wait for a free connection), right before it is sent; and it
        must end within the lease (``write_seconds``), so an operator frozen or slowed down while
        a write waited never sends it after a standby may have taken over.
        """
        write = verb in WRITES
        deadline = self.write_seconds() if write else None
        if write and (not self.may_write() or (deadline is not None and deadline <= 0)):
            raise NotLeader(f"{verb} {resource} not sent: this operator is not the leader")

        def sending() -> None:
            if write and not self.may_write():
                raise NotLeader(
                    f"{verb} {resource} not sent: the lease ended while it waited to be sent"
                )
            metrics.API_REQUESTS.labels(verb=verb, resource=resource).inc()
            if sent is not None:
                sent()

        try:
            return await self.rest.request(
                method,
                path,
                timeout=self.timeout,
                deadline=deadline,
                before_send=sending,
                what=f"{verb} {resource}",
                **options,
            )
        except ApiError as error:
            # A namespace being deleted refuses every create (a child, an Event) with 403: not a
            # refusal to wait out, nor an error to retry, but the end of its jobs.
            where = IN_NAMESPACE.match(path)
            if where is not None and says_namespace_gone(error, where.group(1)):
                raise NamespaceGone(where.group(1), error.message) from error
            raise

    async def create(self, obj: Mapping[str, Any], sent: Callable[[], None] | None = None) -> bool:
        """Create ``obj``; False when it already exists. ChildRejected when it is invalid.
        ``sent``: as :meth:`call`'s."""
        resource, path = kind_path(obj)
        kind, meta = obj["kind"], obj["metadata"]
        name = meta.get("name") or meta.get("generateName", "")
        try:
            # The answer is not needed: it is drained, not parsed (a pod's is hundreds of objects).
            await self.call("create", resource, "POST", path, body=obj, read=False, sent=sent)
        except ApiError as error:
            if error.status == 409:
                return False
            if error.status in (400, 422):
                raise ChildRejected(kind, name, error.message) from error
            if error.status in (403, 429) or error.status >= 500:
                raise Refused(kind, name, error.status, error.message, error.retry_after) from error
            raise
        return True

    async def create_all(
        self,
        objs: Iterable[Mapping[str, Any]],
        unsent: Callable[[Mapping[str, Any]], None] | None = None,
    ) -> list[bool | Refused]:
        """Create many objects in batches that double (1, 2, 4, ...), each batch's creates
        concurrent: True (created), False (the name exists) or the Refused of each. As the Job
        controller's slow start does, a batch with a refusal (a quota, a webhook, an API server
        shedding load) is the last: the objects never sent answer with that refusal, so a
        refused gang costs one request, not one per pod. Between batches the event loop runs
        other work. Any other error is raised once its batch finished, after ``unsent`` was
        called with each object that certainly never reached the API server: its create failed
        before it held a connection (a refused connection: the API server is down), or it was
        in no batch yet. A create that was written and got no answer may have been applied, and
        is not called with."""
        pending = list(objs)
        results: list[bool | Refused] = []
        size = SLOW_START_BATCH

        async def one(obj: Mapping[str, Any]) -> bool:
            went: list[bool] = []
            try:
                return await self.create(obj, sent=lambda: went.append(True))
            except BaseException:
                if not went and unsent is not None:
                    unsent(obj)
                raise

        while len(results) < len(pending):
            batch = pending[len(results) : len(results) + size]
            answers = await asyncio.gather(*(one(o) for o in batch), return_exceptions=True)
            for answer in answers:
                if isinstance(answer, BaseException) and not isinstance(answer, Refused):
                    for never in pending[len(results) + len(batch) :]:
                        if unsent is not None:
                            unsent(never)
                    raise answer
            results += [a if isinstance(a, Refused) else bool(a) for a in answers]
            refused = next((a for a in answers if isinstance(a, Refused)), None)
            if refused is not None:
                results += [refused] * (len(pending) - len(results))
                break
            size *= 2
            await asyncio.sleep(0)
        return results

    async def holder(
        self, kind: str, namespace: str, name: str, api_version: str | None = None
    ) -> Holder | None:
        """Who holds the name of a child that already exists (None when it is gone): a Pod,
        Service or NetworkPolicy, or a PodGroup or Workload of ``api_version``."""
        path = child_path(kind, namespace, name, api_version)
        try:
            found = await self.call("get", KINDS[kind].plural, "GET", path)
        except ApiError as error:
            if error.status == 404:
                return None
            raise
        meta = found.get("metadata") or {}
        owners = meta.get("ownerReferences") or []
        controller: dict[str, Any] = next((o for o in owners if o.get("controller")), {})
        labels = meta.get("labels") or {}
        try:
            attempt = int(labels.get(names.LABEL_ATTEMPT, "-1"))
        except ValueError:
            attempt = -1
        return Holder(
            controller.get("uid"),
            attempt,
            bool(meta.get("deletionTimestamp")),
            controller_kind=controller.get("kind"),
            controller_api_version=controller.get("apiVersion"),
            labels={str(k): str(v) for k, v in labels.items()},
            uid=str(meta.get("uid") or ""),
            resource_version=str(meta.get("resourceVersion") or ""),
            spec=found.get("spec") if isinstance(found.get("spec"), dict) else {},
        )

    async def label_pod(
        self, namespace: str, name: str, uid: str, labels: Mapping[str, str]
    ) -> bool:
        """Set ``labels`` on the pod of ``uid`` (a merge patch: its other labels kept); False
        when it is gone or is another pod of the name now (404, 409)."""
        path = child_path(POD.kind, namespace, name)
        body = {"metadata": {"uid": uid, "labels": dict(labels)}}
        return await self._patch_if_there(POD.plural, path, body, MERGE_PATCH)

    async def repair_child(
        self,
        kind: str,
        namespace: str,
        name: str,
        ops: list[dict[str, Any]],
        api_version: str | None = None,
    ) -> bool:
        """Apply the JSON patch ``ops`` (children/drift.py) to the child: True when applied,
        False when it changed or went away meanwhile (409, 404: judged again next time)."""
        path = child_path(kind, namespace, name, api_version)
        return await self._patch_if_there(KINDS[kind].plural, path, ops, JSON_PATCH)

    async def _patch_if_there(
        self, resource: str, path: str, body: object, content_type: str
    ) -> bool:
        """Patch the object at ``path``: False when it is gone (404) or the patch's
        precondition no longer holds (409), left to the next pass to judge again."""
        try:
            await self.call(
                "patch", resource, "PATCH", path, body=body, content_type=content_type,
                read=False,
            )  # fmt: skip
        except ApiError as error:
            if error.status in (404, 409):
                return False
            raise
        return True

    async def _delete_if(
        self, resource: str, path: str, preconditions: Mapping[str, str], **options: Any
    ) -> None:
        """Delete the object at ``path`` only while it matches ``preconditions`` (its uid, and
        its resourceVersion where given): gone (404) or no longer that object (409) leaves
        nothing to do. ``options``: further DeleteOptions."""
        body = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "preconditions": dict(preconditions),
            **options,
        }
        try:
            await self.call("delete", resource, "DELETE", path, body=body, read=False)
        except ApiError as error:
            if error.status not in (404, 409):
                raise

    async def delete_child(
        self, kind: str, namespace: str, holder: Holder, name: str, api_version: str | None = None
    ) -> None:
        """Delete a Service, NetworkPolicy or PodGroup (of ``api_version``): an orphan of the
        job's that holds the name of the job's own, only if it is still the object judged: the
        delete carries its uid and resourceVersion as preconditions (409: it changed, judged
        again next time)."""
        preconditions = {"uid": holder.uid, "resourceVersion": holder.resource_version}
        path = child_path(kind, namespace, name, api_version)
        await self._delete_if(KINDS[kind].plural, path, preconditions)

    async def delete_pods(
        self,
        namespace: str,
        pods: Iterable[str],
        force: bool,
        uids: Mapping[str, str] | None = None,
    ) -> None:
        """Delete pods concurrently; grace period 0 when ``force`` (their node is gone). With
        the pod's uid in ``uids`` the delete is preconditioned on it, so a newer pod that took
        the name meanwhile is never deleted in its place (409: nothing to do); a pod whose uid
        is not known is not deleted. Every delete ends before this does; the first error is
        then raised and the others logged, one line each."""

        async def one(name: str) -> None:
            uid = (uids or {}).get(name)
            if not uid:
                # Only a pod seen (and judged the job's, or its orphan) is deleted.
                logger.warning("pod %s/%s not deleted: its uid is unknown", namespace, name)
                return
            options: dict[str, Any] = {"propagationPolicy": "Background"}
            if force:
                options["gracePeriodSeconds"] = 0
            path = child_path(POD.kind, namespace, name)
            await self._delete_if(POD.plural, path, {"uid": uid}, **options)

        names = list(pods)
        answers = await asyncio.gather(*(one(p) for p in names), return_exceptions=True)
        failed = [(n, a) for n, a in zip(names, answers, strict=True) if a is not None]
        for name, error in failed[1:]:
            logger.warning("pod %s/%s not deleted: %s", namespace, name, error)
        if failed:
            raise failed[0][1]

    async def patch_status(
        self, namespace: str, name: str, resource_version: str, status: Mapping[str, Any]
    ) -> dict[str, Any]:
        """Write the status in one merge patch of /status (None values remove fields).

        The patch carries the resourceVersion it was computed from as a precondition: a decision
        made on a stale copy gets 409 Conflict (StaleJob) instead of overwriting newer data.
        Returns the job as the API server holds it after the patch.
        """
        body = {"metadata": {"resourceVersion": resource_version}, "status": status}
        try:
            found = await self.call(
                "patch",
                PLURAL + "/status",
                "PATCH",
                job_path(namespace, name, "/status"),
                body=body,
                content_type=MERGE_PATCH,
            )
        except ApiError as error:
            if error.status == 409:
                raise StaleJob(f"{namespace}/{name} changed meanwhile: {error.message}") from error
            raise
        found["metadata"].pop("managedFields", None)  # kept, and never read (context.kept)
        return dict(found)

    async def post_event(
        self, involved: Mapping[str, str], type: str, reason: str, message: str
    ) -> None:
        """Post a core/v1 Event about ``involved``; a failure is logged, never raised (Events
        help people but must not stop a reconcile), but NamespaceGone: the job goes with it."""
        now, namespace = format_time(datetime.now(UTC)), involved["namespace"]
        body = {
            "apiVersion": EVENT.at().api_version,
            "kind": EVENT.kind,
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
            await self.create(body)
        except (ApiError, ChildRejected, Refused, *NO_ANSWER) as error:
            logger.warning("could not post Event %s on %s: %s", reason, involved["name"], error)

    async def delete_job(self, namespace: str, name: str, uid: str) -> None:
        """Delete the job whose TTL ran out, only if it is still that job (a job re-created under
        the same name meanwhile has another uid: 409, left alone)."""
        await self._delete_if(PLURAL, job_path(namespace, name), {"uid": uid})

    async def get_custom(
        self, group: str, version: str, plural: str, name: str, namespace: str | None = None
    ) -> dict[str, Any] | None:
        """A custom object (a Kueue ResourceFlavor; a LocalQueue with ``namespace``), or None
        when it does not exist."""
        path = group_path(group, version, plural, namespace, name)
        try:
            found = await self.call("get", plural, "GET", path)
        except ApiError as error:
            if error.status == 404:
                return None
            raise
        return dict(found)

    async def patch_custom_status(
        self, group: str, version: str, plural: str, namespace: str, name: str, body: Any
    ) -> dict[str, Any]:
        """Merge-patch a custom object's /status (a Kueue Workload); the body may carry the
        resourceVersion it was computed from, and then a stale one gets 409."""
        path = group_path(group, version, plural, namespace, name) + "/status"
        found = await self.call(
            "patch", f"{plural}/status", "PATCH", path, body=body, content_type=MERGE_PATCH
        )
        return dict(found)
