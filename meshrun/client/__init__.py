"""``meshrun.client``: ParallelTrainingJobs on a cluster from Python, what the ``meshrun`` CLI's
``submit``, ``list``, ``status``, ``logs``, ``wait`` and ``delete`` are built on.

```python
from meshrun.client import JobClient

client = JobClient()                       # kubectl's current context and namespace
job = client.submit("job.yaml")             # planned first, as meshrun plan does
for line in client.logs(job.name, rank=0, follow=True):
    print(line)
done = client.wait(job.name, timeout=3600)  # the Job once Succeeded; JobEnded if it failed
print(done.progress["loss"])
```

Every error a user can make (no cluster, the CRD not installed, no such job, forbidden) is a
:class:`meshrun.client.errors.ClientError` whose message says what to do; an invalid job is the
planner's ``meshrun.api.errors.SpecError``. Needs the ``client`` extra (the kubernetes package).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from kubernetes.client import CoreV1Api, CustomObjectsApi
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from meshrun.api.crd import API_VERSION, GROUP, KIND, PLURAL, VERSION, read_documents
from meshrun.api.errors import SpecError
from meshrun.client.connection import Connection, connect
from meshrun.client.errors import (
    RESOURCE,
    ClientError,
    JobEnded,
    Refused,
    Request,
    WaitTimeout,
    from_api,
    from_no_answer,
)
from meshrun.client.ranks import pod_of_index, pod_of_rank
from meshrun.files.checks import plan_document
from meshrun.planner.plan import Plan

T = TypeVar("T")

FINISHED = ("Succeeded", "Failed")
"""The phases a job ends in."""

REQUEST_SECONDS = (10.0, 60.0)
"""Seconds to connect, and to wait for an answer, per request (a log followed has no limit)."""

DEFAULT_CONTAINER = "kubectl.kubernetes.io/default-container"
"""The pod annotation kubectl reads to pick a container of several."""


@dataclass(frozen=True)
class Job:
    """A ParallelTrainingJob as the API server returned it, with its status read by name."""

    object: dict[str, Any]
    """The whole object (metadata, spec, status)."""

    @property
    def name(self) -> str:
        return str(self.object["metadata"]["name"])

    @property
    def namespace(self) -> str:
        return str(self.object["metadata"].get("namespace") or "")

    @property
    def status(self) -> dict[str, Any]:
        return dict(self.object.get("status") or {})

    @property
    def phase(self) -> str:
        """Pending, Running, Restarting, Suspended, Succeeded or Failed (Pending until the
        operator has written a status)."""
        return str(self.status.get("phase") or "Pending")

    @property
    def finished(self) -> bool:
        return self.phase in FINISHED

    @property
    def progress(self) -> dict[str, Any]:
        """status.progress: step, totalSteps, loss, tokensPerSecond, etaSeconds, ..."""
        return dict(self.status.get("progress") or {})

    @property
    def conditions(self) -> list[dict[str, Any]]:
        return list(self.status.get("conditions") or [])

    @property
    def restarts(self) -> int:
        return int(self.status.get("restarts") or 0)

    @property
    def last_failure(self) -> dict[str, Any] | None:
        """The failure behind the last restart or the end of the job."""
        found = self.status.get("lastFailure")
        return dict(found) if found else None

    def latest_condition(self) -> dict[str, Any] | None:
        """The true condition that changed last (the newest lastTransitionTime)."""
        true = [c for c in self.conditions if c.get("status") == "True"]
        return max(true, key=lambda c: str(c.get("lastTransitionTime") or ""), default=None)

    def reason(self) -> str:
        """Why the job is where it is, in one line: its Failed condition's reason and message,
        else the last failure's, else status.message."""
        for condition in self.conditions:
            if condition.get("type") == self.phase and condition.get("status") == "True":
                return f"{condition.get('reason')}: {condition.get('message')}"
        failure = self.last_failure
        if failure:
            return f"{failure.get('reason')}: {failure.get('message')}"
        return str(self.status.get("message") or "")


class JobClient:
    """ParallelTrainingJobs in one namespace of one cluster: kubectl's current context and
    namespace unless ``context``, ``namespace`` or ``kubeconfig`` say otherwise (as
    ``--context``, ``-n`` and ``--kubeconfig`` do); or an existing ``connection``."""

    def __init__(
        self,
        *,
        namespace: str | None = None,
        context: str | None = None,
        kubeconfig: str | None = None,
        connection: Connection | None = None,
    ) -> None:
        self.connection = connection or connect(
            kubeconfig=kubeconfig, context=context, namespace=namespace
        )
        self.namespace = namespace or self.connection.namespace
        """The namespace every call acts in."""
        self._namespace_given = namespace is not None
        self._jobs = CustomObjectsApi(self.connection.api)
        self._core = CoreV1Api(self.connection.api)

    # -- jobs --------------------------------------------------------------------------------

    def plan(self, job: Mapping[str, Any], mounts: Sequence[str] = ()) -> Plan:
        """What ``meshrun plan`` says of ``job`` (a ParallelTrainingJob as a dict), with the
        files it names checked where ``mounts`` (``/container/path=/local/path``) make them
        visible. SpecError names the field and the rule."""
        return plan_document(job, "job", mounts)[2]

    def submit(self, job: Mapping[str, Any] | str | Path, mounts: Sequence[str] = ()) -> Job:
        """Plan ``job`` (a ParallelTrainingJob as a dict, or a YAML file of one) as
        ``meshrun plan`` does, refusing what it refuses with SpecError, and create it."""
        document: Mapping[str, Any]
        if isinstance(job, str | Path):
            documents = read_documents(job)
            if len(documents) != 1:
                raise SpecError(str(job), f"holds {len(documents)} documents, not one job")
            document = documents[0]
        else:
            document = job
        self.plan(document, mounts)
        return self.create(document)

    def create(self, job: Mapping[str, Any]) -> Job:
        """Create ``job`` as it is, in its metadata.namespace or this client's namespace.
        AlreadyExists when a job of that name is there."""
        body = dict(job)
        metadata = dict(body.get("metadata") or {})
        namespace = str(metadata.get("namespace") or self.namespace)
        if self._namespace_given and namespace != self.namespace:
            # kubectl's rule: a namespace in the object and another asked for is a mistake.
            raise ClientError(
                f"job {metadata.get('name')} names namespace {namespace}, not {self.namespace}: "
                f"pass -n {namespace}, or remove metadata.namespace"
            )
        metadata["namespace"] = namespace
        body.update(apiVersion=API_VERSION, kind=KIND, metadata=metadata)
        request = Request("create", RESOURCE, str(metadata.get("name")), namespace)
        created = self._call(
            request,
            self._jobs.create_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            body,
        )
        return Job(dict(created))  # type: ignore[call-overload]

    def get(self, name: str) -> Job:
        """The job ``name``. NotFound when there is none."""
        request = Request("get", RESOURCE, name, self.namespace, name)
        found = self._call(
            request,
            self._jobs.get_namespaced_custom_object,
            GROUP,
            VERSION,
            self.namespace,
            PLURAL,
            name,
        )
        return Job(dict(found))  # type: ignore[call-overload]

    def list(self, all_namespaces: bool = False) -> list[Job]:
        """The jobs of this namespace (or of every namespace), by namespace and name."""
        if all_namespaces:
            request = Request("list", RESOURCE, None, None)
            found = self._call(
                request, self._jobs.list_cluster_custom_object, GROUP, VERSION, PLURAL
            )
        else:
            request = Request("list", RESOURCE, None, self.namespace)
            found = self._call(
                request,
                self._jobs.list_namespaced_custom_object,
                GROUP,
                VERSION,
                self.namespace,
                PLURAL,
            )
        items: list[dict[str, Any]] = found.get("items") or []  # type: ignore[attr-defined]
        jobs = [Job(item) for item in items]
        return sorted(jobs, key=lambda job: (job.namespace, job.name))

    def delete(self, name: str) -> None:
        """Delete the job ``name`` (its pods and Service go with it). NotFound when there is
        none."""
        request = Request("delete", RESOURCE, name, self.namespace, name)
        self._call(
            request,
            self._jobs.delete_namespaced_custom_object,
            GROUP,
            VERSION,
            self.namespace,
            PLURAL,
            name,
        )

    def watch(
        self, name: str, timeout: float | None = None, interval: float = 1.0
    ) -> Iterator[Job]:
        """The job now and each time it changes, until it has ended (the last one yielded is
        Succeeded or Failed) or ``timeout`` seconds have passed (WaitTimeout)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        seen = None
        while True:
            job = self.get(name)
            version = job.object["metadata"].get("resourceVersion")
            if version != seen:
                seen = version
                yield job
            if job.finished:
                return
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(
                    f"timed out after {timeout:g} s: job {name} is {_where_it_is(job)}"
                )
            time.sleep(interval if deadline is None else min(interval, deadline - time.monotonic()))

    def wait(
        self,
        name: str,
        phases: Sequence[str] = ("Succeeded",),
        timeout: float | None = None,
        interval: float = 1.0,
    ) -> Job:
        """The job once its phase is one of ``phases``. JobEnded when it ends in another
        (Failed, with the reason), WaitTimeout after ``timeout`` seconds."""
        job = None
        for job in self.watch(name, timeout, interval):
            if job.phase in phases:
                return job
        assert job is not None
        wanted = " or ".join(phases)
        raise JobEnded(f"job {name} {job.phase}, not {wanted}: {job.reason()}")

    # -- pods and logs -----------------------------------------------------------------------

    def pod(self, name: str, *, pod: int | None = None, rank: int | None = None) -> str:
        """The name of the job's pod ``pod`` (an index), or of the pod that runs global rank
        ``rank`` (from the job's placement); pod 0 (rank 0's) by default."""
        job = self.get(name).object
        if rank is not None:
            return pod_of_rank(job, rank)
        return pod_of_index(job, 0 if pod is None else pod)

    def pod_object(self, name: str, *, pod: int = 0) -> Any:
        """The job's pod ``pod`` (an index) as the API server returns it (a ``V1Pod``)."""
        pod_name = pod_of_index(self.get(name).object, pod)
        request = Request("get", "pods", pod_name, self.namespace, name)
        return self._call(request, self._core.read_namespaced_pod, pod_name, self.namespace)

    def run_in_pod(
        self, name: str, command: Sequence[str], *, pod: int = 0, timeout: float = 120
    ) -> str:
        """What ``command`` prints on stdout, run in the job's pod ``pod`` (its default
        container) as ``kubectl exec`` runs it; Refused, with the end of its stderr, when it
        fails or prints nothing."""
        from kubernetes.stream import stream

        found = self.pod_object(name, pod=pod)
        pod_name = found.metadata.name
        request = Request("create", "pods/exec", pod_name, self.namespace, name)
        response = self._call(
            request,
            stream,
            self._core.connect_get_namespaced_pod_exec,
            pod_name,
            self.namespace,
            container=self._default_container(name, pod_name),
            command=list(command),
            stdin=False,
            stdout=True,
            stderr=True,
            tty=False,
            _preload_content=False,
        )
        response.run_forever(timeout=timeout)
        text, said = response.read_stdout(), response.read_stderr()
        if response.returncode or not text:
            raise Refused(
                f"{command[0]} in pod {pod_name} failed (exit {response.returncode}): "
                f"{said.strip()[-300:] or 'no output'}"
            )
        return str(text)

    def logs(
        self,
        name: str,
        *,
        pod: int | None = None,
        rank: int | None = None,
        container: str | None = None,
        follow: bool = False,
        previous: bool = False,
        tail: int | None = None,
    ) -> Iterator[str]:
        """The log lines of one pod of the job (``pod``, or the one of ``rank``; pod 0 by
        default): of its trainer container (kubectl's default container), as it runs
        (``follow``) or of its previous run (``previous``: the container before it restarted)."""
        pod_name = self.pod(name, pod=pod, rank=rank)
        chosen = container or self._default_container(name, pod_name)
        request = Request("get", "pods/log", pod_name, self.namespace, name)
        answer = self._call(
            request,
            self._core.read_namespaced_pod_log,
            pod_name,
            self.namespace,
            container=chosen,
            follow=follow,
            previous=previous,
            tail_lines=tail,
            _preload_content=False,
            # Followed, a quiet rank may print nothing for hours: no limit (kubectl sets none).
            _request_timeout=None if follow else REQUEST_SECONDS,
        )
        return self._lines(answer, request)

    def _default_container(self, job: str, pod_name: str) -> str | None:
        """kubectl's choice: the pod's default-container annotation, else its first."""
        request = Request("get", "pods", pod_name, self.namespace, job)
        found = self._call(request, self._core.read_namespaced_pod, pod_name, self.namespace)
        annotations = (found.metadata and found.metadata.annotations) or {}
        containers = [c.name for c in found.spec.containers] if found.spec else []
        return str(annotations.get(DEFAULT_CONTAINER) or containers[0]) if containers else None

    def _lines(self, answer: Any, request: Request) -> Iterator[str]:
        response = getattr(answer, "response", answer)  # urllib3's, under the client's wrapper
        pending = b""
        try:
            for chunk in response.stream(2**16, decode_content=True):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    yield line.decode("utf-8", "replace")
        except (HTTPError, OSError) as error:
            raise from_no_answer(error, self.connection.server, self.connection.context) from None
        finally:
            response.release_conn()
        if pending:
            yield pending.decode("utf-8", "replace")

    # -- one place for the API's answers ------------------------------------------------------

    def _call(self, request: Request, method: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        kwargs.setdefault("_request_timeout", REQUEST_SECONDS)
        try:
            return method(*args, **kwargs)
        except ApiException as error:
            raise from_api(error, request, self.connection.server) from None
        except (HTTPError, OSError) as error:
            raise from_no_answer(error, self.connection.server, self.connection.context) from None


def _where_it_is(job: Job) -> str:
    shown = job.status.get("display") or {}
    step = f" at step {shown['step']}" if shown.get("step") else ""
    return f"{job.phase}{step}"
