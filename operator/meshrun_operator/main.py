"""``meshrun operator``: run the kopf operator with explicit settings.

Every kopf setting that matters is set here rather than left to kopf's defaults: no kopf
peering (leader election is a Lease of the operator's own, leader.py), watch timeouts, and the
finalizer, progress and diff-base keys under ``meshrun.dev`` (not ``kopf.zalando.org``), so that
``kubectl get ptj -o yaml`` shows one vocabulary.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass

import kopf
from prometheus_client import start_http_server

from meshrun_operator import names
from meshrun_operator.children import netpolicy, podpolicy
from meshrun_operator.children import platform as platform_policy
from meshrun_operator.children.netpolicy import PolicyOptions
from meshrun_operator.children.platform import PlatformEgress
from meshrun_operator.client.errors import ApiTimeout
from meshrun_operator.client.kube import Kube
from meshrun_operator.client.login import Login, LoginError
from meshrun_operator.client.rest import Rest, smaller_tls_buffers
from meshrun_operator.lifecycle.evaluation import Admission, Evaluations
from meshrun_operator.runtime import kueue_watch, leader
from meshrun_operator.runtime.context import OperatorContext
from meshrun_operator.runtime.diffbase import NoDiffBase
from meshrun_operator.runtime.handlers import LABELLED, OperatorMemo, register
from meshrun_operator.runtime.kueue_link import KueueLink
from meshrun_operator.runtime.leader import LeaderOptions
from meshrun_operator.seen.progress import ProgressReader
from meshrun_operator.timing import Timing


@dataclass(frozen=True)
class Options:
    """Command-line options of ``meshrun operator``."""

    namespaces: tuple[str, ...]
    """Namespaces to serve; empty means every namespace (cluster-wide)."""
    metrics_port: int
    """Port of the Prometheus /metrics endpoint (0 disables it)."""
    health_port: int
    """Port of kopf's /healthz liveness endpoint (0 disables it)."""
    leader: LeaderOptions | None
    """Leader election among replicas (a Lease); None: this operator always acts."""
    network_policy: PolicyOptions | None
    """The per-job NetworkPolicy; None: none is created."""
    resync_seconds: float
    """Interval of the periodic resync of every job."""
    status_interval_seconds: float
    """Status changes that only tell how a launch or a run goes are written this often."""
    workers: int
    """Threads (and HTTP connections) for concurrent API calls."""
    api_timeout_seconds: float
    """Longest wait for the answer to one API request (kopf's own requests included)."""
    stall_seconds: float
    """/healthz fails when a background loop made no progress this long, and reports the jobs
    that waited this long for a reconcile to complete."""
    timing: Timing
    """Backoff and grace periods."""
    watch_nodes: bool
    """Watch nodes to notice NotReady or deleted ones."""
    progress_http: bool
    """Also read the trainer's /progress endpoint on pod 0 (besides the pod annotation)."""
    kueue: bool
    """Govern jobs that name a queue through Kueue Workloads (needs RBAC on them)."""
    pod_policy: podpolicy.PodPolicy
    """The Pod Security Standards level every job's pod template must meet."""
    platform: platform_policy.PlatformPolicy
    """What every job's pods may use in scheduling and identity, and its queue."""
    max_pods_per_job: int
    """The most pods one job may have."""
    verbose: bool
    """Debug logging."""


DESCRIPTION = (
    "Run the meshrun operator: it turns each ParallelTrainingJob into a headless Service and "
    "its pods, and follows it to the end (docs/operator.md). It serves every namespace unless "
    "--namespace names some, and reaches the cluster through the pod's service account, else "
    "KUBECONFIG or ~/.kube/config."
)
"""What ``meshrun operator --help`` says first (the module's docstring is for its readers)."""


def parse_args(argv: list[str]) -> Options:
    """The options from the command line; exits 2 naming the flag when one is wrong."""
    parser = argparse.ArgumentParser(prog="meshrun operator", description=DESCRIPTION)
    _serving_arguments(parser)
    _loop_arguments(parser)
    _timing_arguments(parser)
    _watch_arguments(parser)
    podpolicy.add_arguments(parser)
    platform_policy.add_arguments(parser)
    leader.add_arguments(parser)
    netpolicy.add_arguments(parser)
    args = parser.parse_args(argv)
    return Options(
        namespaces=tuple(args.namespace),
        metrics_port=args.metrics_port,
        health_port=args.health_port,
        leader=leader.from_args(args, parser),
        network_policy=netpolicy.from_args(args, parser),
        resync_seconds=args.resync_seconds,
        status_interval_seconds=args.status_interval_seconds,
        workers=args.workers,
        api_timeout_seconds=args.api_timeout_seconds,
        stall_seconds=args.stall_seconds,
        timing=_timing_of(args),
        watch_nodes=not args.no_watch_nodes,
        progress_http=not args.no_progress_http,
        kueue=not args.no_kueue,
        pod_policy=podpolicy.from_args(args),
        platform=platform_policy.from_args(args, parser),
        max_pods_per_job=args.max_pods_per_job,
        verbose=args.verbose,
    )


def _port(text: str) -> int:
    """An argparse type: a TCP port, or 0 (disabled)."""
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} must be a port (0-65535)")
    return value


def _positive(kind: Callable[[str], float]) -> Callable[[str], float]:
    """An argparse type: a number of ``kind`` above 0."""

    def parse(text: str) -> float:
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{text} must be positive")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its own errors
    return parse


SECONDS = _positive(float)
COUNT = _positive(int)


def _serving_arguments(parser: argparse.ArgumentParser) -> None:
    """What the operator serves and how it talks to the API server."""
    group = parser.add_argument_group("serving")
    group.add_argument(
        "--namespace",
        "-n",
        action="append",
        default=[],
        help="serve this namespace (repeatable); default: all namespaces",
    )
    group.add_argument(
        "--metrics-port", type=_port, default=8080, help="/metrics port (default 8080, 0 disables)"
    )
    group.add_argument(
        "--health-port", type=_port, default=8081, help="/healthz port (default 8081, 0 disables)"
    )
    group.add_argument("--workers", type=COUNT, default=16, help="concurrent API requests (16)")
    group.add_argument(
        "--api-timeout-seconds",
        type=SECONDS,
        default=30.0,
        help="longest wait for one API request's answer (default 30)",
    )
    group.add_argument(
        "--stall-seconds",
        type=SECONDS,
        default=300.0,
        help="/healthz fails once the node watch, lease loop or resync loop made no progress "
        "this long, and reports the jobs that waited this long for a reconcile (default 300)",
    )
    group.add_argument(
        "--max-pods-per-job",
        type=COUNT,
        default=1024,
        help="the most pods one job may have (numNodes, and the largest elastic size): every "
        "pod is built, sent and watched by this one operator; a larger job is Invalid, the "
        "field named (default 1024)",
    )
    group.add_argument("--verbose", "-v", action="store_true", help="debug logging")


def _loop_arguments(parser: argparse.ArgumentParser) -> None:
    """How often the resync loop looks at a job, writes its status, and retries a failure."""
    group = parser.add_argument_group("the resync loop")
    group.add_argument(
        "--resync-seconds", type=SECONDS, default=2.0, help="how often each job is re-examined"
    )
    group.add_argument(
        "--status-interval-seconds",
        type=SECONDS,
        default=10.0,
        help="how often a job's placement, progress and messages are written at most; a change "
        "of phase, condition or counter is written at once (default 10)",
    )
    group.add_argument(
        "--error-backoff-base-seconds",
        type=SECONDS,
        default=2.0,
        help="how long a job whose reconcile failed waits for the next one, doubled per "
        "failure in a row, and no less than the API server's Retry-After (default 2)",
    )
    group.add_argument(
        "--error-backoff-max-seconds",
        type=SECONDS,
        default=300.0,
        help="the longest wait after failed reconciles (default 300)",
    )


def _timing_arguments(parser: argparse.ArgumentParser) -> None:
    """A job's restarts and the waits before a pod or a node is given up (Timing)."""
    group = parser.add_argument_group("restarts and timeouts")
    group.add_argument(
        "--backoff-base-seconds",
        type=SECONDS,
        default=10.0,
        help="first restart delay, doubled per restart (default 10)",
    )
    group.add_argument(
        "--backoff-max-seconds",
        type=SECONDS,
        default=300.0,
        help="longest restart delay (default 300)",
    )
    group.add_argument(
        "--node-toleration-seconds",
        type=SECONDS,
        default=300.0,
        help="how long a node may be NotReady before its pods are given up (default 300, "
        "Kubernetes' not-ready toleration)",
    )
    group.add_argument(
        "--start-failure-seconds",
        type=SECONDS,
        default=120.0,
        help="how long a container may wait in ErrImagePull, CreateContainerConfigError and "
        "the like before its pod counts as failed (default 120)",
    )
    group.add_argument(
        "--expectations-timeout-seconds",
        type=SECONDS,
        default=60.0,
        help="how long a create or delete may stay unseen by the watch before it counts as "
        "lost (default 60)",
    )


def _timing_of(args: argparse.Namespace) -> Timing:
    return Timing(
        backoff_base_seconds=args.backoff_base_seconds,
        backoff_max_seconds=args.backoff_max_seconds,
        node_toleration_seconds=args.node_toleration_seconds,
        start_failure_seconds=args.start_failure_seconds,
        expectations_timeout_seconds=args.expectations_timeout_seconds,
        error_backoff_base_seconds=args.error_backoff_base_seconds,
        error_backoff_max_seconds=args.error_backoff_max_seconds,
    )


def _watch_arguments(parser: argparse.ArgumentParser) -> None:
    """What the operator watches and reads beside its jobs and pods (each off for an RBAC
    without it)."""
    group = parser.add_argument_group("what is watched")
    group.add_argument(
        "--no-watch-nodes",
        action="store_true",
        help="do not watch nodes (no NotReady detection; for RBAC without nodes)",
    )
    group.add_argument(
        "--no-progress-http",
        action="store_true",
        help="read progress only from the meshrun.dev/progress pod annotation",
    )
    group.add_argument(
        "--no-kueue",
        action="store_true",
        help="no Kueue Workloads (for RBAC without them); jobs with a queue name then wait",
    )


def admission(options: Options) -> Admission:
    """What this operator admits beyond a spec's own rules: its pod and platform policies."""
    floor = options.network_policy.egress if options.network_policy else PlatformEgress()
    return Admission(
        pod_policy=options.pod_policy,
        network_policies=options.network_policy is not None,
        platform=options.platform,
        egress=floor,
        max_pods=options.max_pods_per_job,
    )


def kopf_settings(options: Options) -> kopf.OperatorSettings:
    """kopf's settings, every relevant one explicit."""
    settings = kopf.OperatorSettings()
    settings.persistence.finalizer = names.FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix=names.PROGRESS_PREFIX
    )
    settings.persistence.diffbase_storage = NoDiffBase(
        prefix=names.PROGRESS_PREFIX, key=names.DIFFBASE_KEY
    )
    # kopf's peering pauses the watches of every operator but the one of highest priority, and
    # lets equal priorities run side by side; the Lease (leader.py) decides who acts instead.
    settings.peering.standalone = True
    # The API server ends a watch after server_timeout; the client gives it a margin more,
    # so a silently dead connection is noticed within ~5 minutes, not never.
    settings.watching.server_timeout = 270
    settings.watching.client_timeout = 300
    settings.watching.connect_timeout = 30
    # Listings come in pages: one answer for every node or pod of a large cluster could take
    # longer than a request may (then kopf lists again, forever, and fills no index), and would
    # be held in memory all at once.
    settings.watching.chunk_size = 500
    # kopf's own short requests (listing, peering, posting) are bounded like the reconciler's.
    settings.networking.request_timeout = options.api_timeout_seconds
    settings.networking.connect_timeout = min(10.0, options.api_timeout_seconds)
    # Only the pods, Services, policies and Workloads the operator made are listed and watched
    # (server-side), not every pod of the cluster, nor the Workloads of every other kind of job.
    for selector in LABELLED:
        settings.watching.label_selectors[selector] = names.LABEL_JOB
    # kopf posts nothing: the reconciler posts its own Events, one per change, through the
    # client that writes only while this operator leads (kube.py). kopf's poster writes with
    # kopf's own session, which knows nothing of the Lease, so a standby or deposed operator
    # would post through it: no log record and no kopf.event/info/warn/exception becomes an
    # Event (kopf.warn checks only the level, hence a level above every level).
    settings.posting.enabled = False
    settings.posting.loggers = False
    settings.posting.level = logging.CRITICAL + 1
    settings.posting.reporting_component = names.MANAGED_BY
    settings.execution.max_workers = options.workers
    # No timers or daemons run (resync.py says why), so nothing waits on this; kept short.
    settings.background.cancellation_polling = 1.0
    return settings


def main(argv: list[str] | None = None) -> int:
    """Run the operator until interrupted; 2 for bad options."""
    try:
        options = parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as stop:
        return int(stop.code or 0)
    logging.basicConfig(
        level=logging.DEBUG if options.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not options.verbose:
        # kopf logs every successful handler call at INFO (one per watch event of every pod
        # and job, three per /healthz request): keep warnings.
        for noisy in ("kopf.objects", "kopf.activities.probe", "aiohttp.access"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
    smaller_tls_buffers()
    credentials = Login()
    try:
        credentials.login_now()  # fail early and plainly: kopf would retry a login forever
    except (LoginError, OSError, ValueError) as error:
        where = "in-cluster service account or KUBECONFIG"
        print(f"meshrun operator: no cluster to talk to ({where}): {error}", file=sys.stderr)
        return 1
    timeout, policies = (
        ApiTimeout.of(options.api_timeout_seconds),
        options.network_policy is not None,
    )
    ctx = OperatorContext(
        kube=Kube(Rest(credentials, timeout, connections=options.workers)),
        network_policy=options.network_policy,
        timing=options.timing,
        resync_seconds=options.resync_seconds,
        status_interval_seconds=options.status_interval_seconds,
        progress=ProgressReader(enabled=options.progress_http),
        kueue=KueueLink() if options.kueue else None,
        evaluations=Evaluations(admission(options)),
    )
    # The Lease's requests have connections of their own: a renewal never waits for one.
    lease = Rest(credentials, timeout, connections=2)
    elector = options.leader.elector(lease, options.stall_seconds) if options.leader else None
    registry = kopf.OperatorRegistry()
    register(registry, options.watch_nodes, options.stall_seconds, options.namespaces, policies)
    kueue_watch.register(registry, with_kueue=options.kueue)
    if options.metrics_port:
        start_http_server(options.metrics_port)
    liveness = f"http://0.0.0.0:{options.health_port}/healthz" if options.health_port else None
    kopf.run(
        registry=registry,
        settings=kopf_settings(options),
        clusterwide=not options.namespaces,
        namespaces=options.namespaces,
        standalone=True,
        liveness_endpoint=liveness,
        memo=OperatorMemo(ctx=ctx, elector=elector),
    )
    return 0
