"""Prometheus metrics of the operator (served on --metrics-port at /metrics)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from meshrun_operator.jobstatus import Phase

JOBS_BY_PHASE = Gauge(
    "meshrun_operator_jobs", "ParallelTrainingJobs the operator watches, by phase", ["phase"]
)
RECONCILE_SECONDS = Histogram(
    "meshrun_operator_reconcile_seconds",
    "Time of one reconcile of one job (decision, API calls and status patch)",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
RECONCILE_ERRORS = Counter(
    "meshrun_operator_reconcile_errors_total", "Reconciles that raised an error", ["kind"]
)
PODS_CREATED = Counter("meshrun_operator_pods_created_total", "Pods created")
PODS_DELETED = Counter("meshrun_operator_pods_deleted_total", "Pods deleted", ["force"])
RESTARTS = Counter(
    "meshrun_operator_restarts_total", "Whole-gang restarts, by failure reason", ["reason"]
)
API_REQUESTS = Counter(
    "meshrun_operator_api_requests_total",
    "Requests the reconciler sent to the API server, Events included (kopf's watches not)",
    ["verb", "resource"],
)

WATCH_GHOSTS = Counter(
    "meshrun_operator_watch_ghosts_total",
    "Jobs and pods deleted while a watch was down, dropped after the watch listed again",
    ["kind"],
)
LEADER = Gauge(
    "meshrun_operator_leader",
    "1 while this operator holds the leader lease and acts (always 1 without leader election)",
)


class PhaseBook:
    """The phase of every known job and how many jobs are in each, so the gauge follows each
    job's change at a constant cost (a pass over thousands of jobs sets it once per job)."""

    def __init__(self) -> None:
        self.phases: dict[str, str] = {}
        """The phase of each job, by uid."""
        self.counts: dict[str, int] = dict.fromkeys((p.value for p in Phase), 0)
        """How many jobs are in each phase."""
        for phase in self.counts:
            JOBS_BY_PHASE.labels(phase=phase).set(0)

    def set(self, uid: str, phase: str | None) -> None:
        """Record the phase of job ``uid`` (None: the job is gone)."""
        old = self.phases.pop(uid, None) if phase is None else self.phases.get(uid)
        if phase is not None:
            self.phases[uid] = phase = str(phase)
        if old == phase:
            return
        for name, change in ((old, -1), (phase, 1)):
            if name is not None:
                self.counts[name] = self.counts.get(name, 0) + change
                JOBS_BY_PHASE.labels(phase=name).set(self.counts[name])
