"""The words of a job's status: phases, condition types, Event types, reasons and their messages.

Every phase, condition type and reason the operator writes comes from here, and each reason sits
next to its message (the layout of JobSet's constants package), so the wording users read is
reviewed in one place. Messages are ``str.format`` templates; :meth:`Reason.message` fills them.
"""

from __future__ import annotations

from enum import StrEnum


class Phase(StrEnum):
    """``status.phase`` of a ParallelTrainingJob."""

    PENDING = "Pending"
    """Pods are being created or scheduled, or the spec was just fixed."""
    RUNNING = "Running"
    """Every pod of the current attempt runs."""
    RESTARTING = "Restarting"
    """A whole-gang restart is in progress (old pods going, backoff, new pods coming)."""
    SUSPENDED = "Suspended"
    """spec.runPolicy.suspend is true: no pods exist."""
    SUCCEEDED = "Succeeded"
    """Every pod exited 0."""
    FAILED = "Failed"
    """The job ended without success (invalid spec, permanent failure, limits)."""

    @property
    def finished(self) -> bool:
        """Succeeded or Failed: nothing but cleanup and the TTL happens any more."""
        return self in (Phase.SUCCEEDED, Phase.FAILED)


class PodPhase(StrEnum):
    """``status.phase`` of a pod (Kubernetes' own values)."""

    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    UNKNOWN = "Unknown"


class ConditionType(StrEnum):
    """Condition types in ``status.conditions``, in the order they are listed."""

    INVALID = "Invalid"
    SUSPENDED = "Suspended"
    SCHEDULED = "Scheduled"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    CREATION_REFUSED = "CreationRefused"
    """The API server refused some of the attempt's children (quota, PodSecurity, 5xx)."""
    SPEC_UPDATE = "SpecUpdate"
    """True while the running attempt uses another spec than the current one."""
    BELOW_PREDICTION = "BelowPrediction"
    """True while the measured tokens/s is far below the planner's prediction (never fails)."""
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


class EventType(StrEnum):
    """The two types of Kubernetes Events."""

    NORMAL = "Normal"
    WARNING = "Warning"


class Reason(StrEnum):
    """CamelCase reasons of conditions and Events, each with its message template."""

    template: str

    def __new__(cls, value: str, template: str = "") -> Reason:
        member = str.__new__(cls, value)
        member._value_ = value
        member.template = template
        return member

    def message(self, **values: object) -> str:
        """The message of this reason with ``values`` filled in."""
        return self.template.format(**values)

    # Spec
    INVALID_SPEC = "InvalidSpec", "{error}"
    VALID = "Valid", "the spec is valid"
    # Scheduling
    WAITING_FOR_GANG = "WaitingForGang", "{bound} of {total} pods bound"
    ALL_PODS_BOUND = "AllPodsBound", "all {total} pods bound to nodes"
    GANG_TIMEOUT = (
        "GangTimeout",
        "only {bound} of {total} pods were bound within gangTimeoutSeconds={timeout}; "
        "released them to retry later",
    )
    NO_NODE_WITH_PRODUCT = (
        "NoNodeWithProduct",
        "no node has {label}={product} (spec.resources.acceleratorProduct); the nodes have: "
        "{present}",
    )
    POD_GROUP_UNAVAILABLE = (
        "PodGroupUnavailable",
        "{api_version} PodGroup is not served by this cluster",
    )
    # Running and its end
    PODS_CREATED = "PodsCreated", "creating {count} pod(s) for attempt {attempt}"
    ALL_PODS_RUNNING = "AllPodsRunning", "all pods are running"
    RECOVERED = "Recovered", "the new attempt is running"
    COMPLETED = "Completed", "all {count} pods completed successfully"
    DEADLINE_EXCEEDED = (
        "DeadlineExceeded",
        "the job ran longer than activeDeadlineSeconds={deadline}",
    )
    BACKOFF_LIMIT_EXCEEDED = (
        "BackoffLimitExceeded",
        "{failure}; the backoffLimit of {limit} restart(s) is used up",
    )
    # Throughput against the plan's prediction
    BELOW_PREDICTION = (
        "BelowPrediction",
        "measured {measured:,.0f} tokens/s at step {step} is {share:.0%} of the predicted "
        "{predicted:,.0f} (below {threshold:.0%}): a slow or throttled GPU, a link slower than "
        "spec.resources.interconnect says, or another product than acceleratorProduct",
    )
    AS_PREDICTED = (
        "AsPredicted",
        "measured {measured:,.0f} tokens/s at step {step} is {share:.0%} of the predicted "
        "{predicted:,.0f}",
    )
    # Suspension
    SUSPENDED = "Suspended", "spec.runPolicy.suspend is true"
    RESUMED = "Resumed", "spec.runPolicy.suspend is false"
    # Kueue (a job with spec.scheduling.queueName); while queued the Suspended condition
    # carries Kueue's own reason and words (Pending, Inadmissible, Preempted, ...)
    QUEUED = "Queued", "Workload {workload} waits for Kueue in LocalQueue {queue}"
    ADMITTED = "Admitted", "Kueue admitted Workload {workload} to ClusterQueue {cluster_queue}"
    KUEUE_NOT_INSTALLED = (
        "KueueNotInstalled",
        "spec.scheduling.queueName is {queue}, but this cluster does not serve Kueue's "
        "{api} Workloads: install Kueue, or remove the queue name to run without it",
    )
    KUEUE_DISABLED = (
        "KueueDisabled",
        "spec.scheduling.queueName is {queue}, but this operator runs without Kueue "
        "(--no-kueue, Helm value operator.kueue=false): enable it, or remove the queue name",
    )
    PRIORITY_CLASS_NOT_FOUND = (
        "WorkloadPriorityClassNotFound",
        "label {label} names WorkloadPriorityClass {name}, which does not exist",
    )
    WORKLOAD_REJECTED = "WorkloadRejected", "Kueue refused Workload {workload}: {error}"
    WORKLOAD_INACTIVE = (
        "WorkloadInactive",
        "Workload {workload} is deactivated (spec.active is false){why}; set spec.active to "
        "true to queue it again",
    )
    # Elastic data parallelism (spec.elastic): a resize restarts the gang as a disruption
    SHRINK = (
        "Shrink",
        "{stuck} pod(s) could not be scheduled for {seconds}s: dataParallel {old} -> {new} "
        "({layout}), resuming from the checkpoint of step {step}",
    )
    GROW = (
        "Grow",
        "room for more replicas for {seconds}s: dataParallel {old} -> {new} ({layout}), "
        "resuming from the checkpoint of step {step}",
    )
    # Failures the operator detects itself (the exit-code table: lifecycle/failure/classes.py)
    NODE_LOST = "NodeLost", "node {node} {state}"
    POD_DELETED = "PodDeleted", "pod {pod} disappeared"
    PROGRESS_DEADLINE_EXCEEDED = (
        "ProgressDeadlineExceeded",
        "no new training step for {deadline}s (last step: {step}); the trainer looks hung",
    )
    DISRUPTED = "Disrupted", "the pod was taken away on purpose ({why})"
    NON_FINITE_VALUE = (
        "NonFiniteValue",
        "the trainer reported {fields} as NaN or infinite; left out of the status",
    )
    # Children the API server refused (condition CreationRefused; the rest of the reasons are
    # refusal kinds: QuotaExceeded, PodSecurity, Forbidden, TooManyRequests, ServerError)
    CREATED = "Created", "every child of attempt {attempt} was created"
    NAME_CONFLICT = (
        "NameConflict",
        "{kind} {name} already exists and is not this job's (controller: {owner}), so meshrun "
        "leaves it alone: rename the job, or remove that {kind}",
    )
    CHILD_RESTORED = (
        "ChildRestored",
        "{kind} {name} was deleted while the job ran; created it again (the pods keep running)",
    )
    CHILD_REPAIRED = (
        "ChildRepaired",
        "{kind} {name}: its {what} were edited while the job ran; set them back (the pods keep "
        "running)",
    )
    # A status the operator did not write
    STATUS_RESTORED = (
        "StatusRestored",
        "someone else wrote this job's status ({changes}); the operator acts only on what it "
        "observed and wrote its own back",
    )
    # Spec edits while an attempt runs (condition SpecUpdate)
    NEXT_ATTEMPT = (
        "NextAttempt",
        "spec generation {generation} takes effect at the next attempt; attempt {attempt} runs "
        "generation {running} (runPolicy applies at once)",
    )
    REFUSED_WHILE_RUNNING = (
        "RefusedWhileRunning",
        "{error}; attempt {attempt} keeps running the plan it started with, and no new "
        "attempt starts until the spec is fixed",
    )
    APPLIED = "Applied", "attempt {attempt} runs spec generation {generation}"


# status.message while the job waits or changes phase (no condition carries these).
WAITING_FOR_OLD_PODS = "waiting for {count} pod(s) of an earlier attempt to go away"
BACKING_OFF = "backing off until {until}"
WAITING_FOR_NEW_PODS = "waiting for {count} new pod(s) to appear"
WAITING_FOR_PREDECESSOR = (
    "waiting for {count} pod(s) of an earlier job named {job} to go away (they hold the names)"
)
CREATION_REFUSED = "the API server refused {what}: {why}; retrying at {until}"
NAME_TAKEN = "{why}; retrying at {until}"
DELETED_BY_SOMEONE = "the pod was deleted while the attempt ran"
CANNOT_START = "{why}; the pod cannot start (waited {seconds}s)"
NODE_NOT_READY = "node {node} is NotReady; its pods are given up at {until} unless it recovers"
NOT_SCHEDULED = "{count} pod(s) not scheduled yet"
PODS_STARTING = "pods are starting"
POD_WAITS = "pod {pod} waits: {reason}: {why}"
JOB_SUSPENDED = "the job is suspended"
RESTARTING_GANG = "{failure}; restarting the whole gang"
PERMANENT_FAILURE = "{failure} (permanent)"
QUEUED_IN = "queued in LocalQueue {queue}: {why}"
EVICTED_BY_KUEUE = "evicted by Kueue ({reason}): {why}; queued again once its pods are gone"
