"""One launch: create the jobs in a fresh namespace, time their pods until Running, count.

The clock starts just before the first create and stops when a watch sees the last pod bound to a
node and Running; the jobs' own Running status is timed the same way. Requests are the
operator's, counted from the audit log from the first create until ``settle`` seconds after
everything runs; then ``idle`` more seconds count what running jobs cost when nothing happens.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from _scale_audit import AuditLog, Request
from _scale_cluster import create_namespace, delete_namespace
from _scale_operators import Operator
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import ProtocolError


@dataclass
class Launch:
    """What one launch measured."""

    operator: str
    scenario: str
    jobs: int
    pods: int
    start: float
    """Epoch seconds just before the first create (the audit log's clock)."""
    create_s: float
    """Seconds the bench took to create every job."""
    pods_running_s: float | None
    """Seconds until every pod was bound and Running (None: timed out)."""
    jobs_running_s: float | None
    """Seconds until every job's status said Running (None: timed out)."""
    cpu_s: float
    """CPU seconds the operator process used from the first create to the end of settle."""
    requests: list[Request] = field(default_factory=list)
    """The operator's requests from the first create to the end of settle."""
    idle: list[Request] = field(default_factory=list)
    """The operator's requests in the idle seconds after settle."""
    namespace: str = ""
    window: list[Request] = field(default_factory=list)
    """Everyone's requests in the launch's namespace (scheduler, fake kubelets, the bench)."""
    pod_specs: list[dict[str, Any]] = field(default_factory=list)
    """The pods as the operator built them (kept for the scheduler replay of --profile)."""

    @property
    def per_job(self) -> float:
        return len(self.requests) / self.jobs


class Tally:
    """Objects seen by a watch that satisfy ``done``; ``reached`` is set at ``expected`` of them."""

    def __init__(self, expected: int, done: Callable[[dict[str, Any]], bool]) -> None:
        self.expected, self.done = expected, done
        self.names: set[str] = set()
        self.reached = threading.Event()
        self.at: float | None = None

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        if kind != "DELETED" and self.done(obj):
            self.names.add(name)
        else:
            self.names.discard(name)
        if len(self.names) >= self.expected and not self.reached.is_set():
            self.at = time.monotonic()
            self.reached.set()


def pod_running(pod: dict[str, Any]) -> bool:
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    return bool(spec.get("nodeName")) and status.get("phase") == "Running"


class Follow:
    """Feed a Tally from a watch in a daemon thread, watching again whenever a watch ends."""

    def __init__(self, list_call: Callable[..., Any], args: tuple[Any, ...], tally: Tally) -> None:
        self.list_call, self.args, self.tally = list_call, args, tally
        self.stopped = threading.Event()
        self.stream: watch.Watch | None = None
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while not self.stopped.is_set():
            self.stream = watch.Watch()  # type: ignore[no-untyped-call]
            # Each new watch starts with the objects as they are (ADDED), so nothing is missed.
            events = self.stream.stream(  # type: ignore[no-untyped-call]
                self.list_call, *self.args, deserialize=False, timeout_seconds=300
            )
            try:
                for event in events:
                    if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                        self.tally.event(event["type"], event["object"])
            except (ProtocolError, ApiException, OSError):
                time.sleep(0.5)  # the API server ended the watch; watch again

    def stop(self) -> None:
        self.stopped.set()
        if self.stream is not None:
            self.stream.stop()  # type: ignore[no-untyped-call]


def follow(list_call: Callable[..., Any], args: tuple[Any, ...], tally: Tally) -> Follow:
    return Follow(list_call, args, tally)


def launch(
    api: client.ApiClient,
    audit: AuditLog,
    operator: Operator,
    scenario: str,
    jobs: int,
    pods_per_job: int,
    timeout: float,
    settle: float,
    idle: float,
    keep_pods: bool = False,
) -> Launch:
    """Run one launch of ``jobs`` jobs of ``pods_per_job`` pods and clean up after it."""
    short = re.sub(r"[^a-z0-9]+", "-", operator.name.split("-")[0])  # meshrun@REV: meshrun-REV
    ns = f"bench-{short}-{uuid.uuid4().hex[:6]}"
    create_namespace(api, ns)
    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    pods = Tally(jobs * pods_per_job, pod_running)
    running = Tally(jobs, operator.running)
    group, version, plural = operator.group, operator.version, operator.plural
    watches = [
        follow(core.list_namespaced_pod, (ns,), pods),
        follow(custom.list_namespaced_custom_object, (group, version, ns, plural), running),
    ]
    manifests = [operator.job(f"job-{i}" if jobs > 1 else "big", pods_per_job) for i in range(jobs)]
    time.sleep(0.5)  # both watches are open before the first create
    operator.profile(on=True)
    cpu_before = operator.cpu_seconds()
    start, began = time.time(), time.monotonic()
    with ThreadPoolExecutor(max_workers=16) as pool:
        list(
            pool.map(
                lambda body: custom.create_namespaced_custom_object(
                    group, version, ns, plural, body, _preload_content=False
                ),
                manifests,
            )
        )
    created = time.monotonic() - began
    pods.reached.wait(max(0.0, timeout - created))
    running.reached.wait(max(0.0, timeout - (time.monotonic() - began)))
    time.sleep(settle)
    settled = time.time()
    cpu = operator.cpu_seconds() - cpu_before
    operator.profile(on=False)
    time.sleep(idle)
    result = Launch(
        operator=operator.name,
        scenario=scenario,
        jobs=jobs,
        pods=jobs * pods_per_job,
        start=start,
        create_s=created,
        pods_running_s=None if pods.at is None else pods.at - began,
        jobs_running_s=None if running.at is None else running.at - began,
        cpu_s=cpu,
        requests=audit.between(operator.user, start, settled),
        idle=audit.between(operator.user, settled, time.time()),
        namespace=ns,
        window=audit.in_namespace(ns, start, settled),
    )
    if keep_pods:
        listed: Any = core.list_namespaced_pod(ns, _preload_content=False)
        result.pod_specs = [strip_pod(p) for p in json.loads(listed.data)["items"]]
    for stream in watches:
        stream.stop()
    try:
        delete_namespace(api, ns, timeout=120)
    except TimeoutError as stuck:  # its leftovers keep some nodes busy; the next launch fits
        left: Any = core.list_namespaced_pod(ns, _preload_content=False)
        print(f"  warning: {stuck} ({len(json.loads(left.data)['items'])} pods left)", flush=True)
    operator.wait_quiet()
    return result


def strip_pod(pod: dict[str, Any]) -> dict[str, Any]:
    """A pod as its creator sent it: no owner, node, status or server-set fields."""
    meta = pod["metadata"]
    spec = dict(pod["spec"])
    spec.pop("nodeName", None)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": meta["name"], "labels": meta.get("labels") or {}},
        "spec": spec,
    }
