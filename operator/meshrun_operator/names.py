"""The one place for child object names, label and annotation keys, and their length limits.

Every name the operator derives comes from here so that two code paths can never build the same
key two different ways (dask-kubernetes once built a lock key twice and leaked locks).
"""

from __future__ import annotations

from meshrun.api.crd import GROUP
from meshrun.rules.names import pod_name

# Labels on every child: which job, which pod, which pipeline stage, which attempt.
LABEL_JOB = f"{GROUP}/job-name"
LABEL_POD_INDEX = f"{GROUP}/pod-index"
LABEL_STAGE = f"{GROUP}/pipeline-stage"
LABEL_ATTEMPT = f"{GROUP}/attempt"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "meshrun-operator"
# The job's uid on every child, beside its name: the Service's and the NetworkPolicy's
# selectors match it, so a pod of the namespace that copies the job-name label (anyone who may
# create pods there can) joins neither the job's DNS records nor its allowed peers.
LABEL_JOB_UID = f"{GROUP}/job-uid"

# Annotations the operator writes on pods, and the one the trainer (or a test) writes back.
ANNOTATION_RANKS = f"{GROUP}/ranks"
ANNOTATION_PROGRESS = f"{GROUP}/progress"

# kopf's own bookkeeping, kept under our domain instead of kopf.zalando.org.
FINALIZER = f"{GROUP}/finalizer"
PROGRESS_PREFIX = GROUP
DIFFBASE_KEY = "last-handled-configuration"

# Gang-scheduler integrations (volcano and kubernetes-sigs/scheduler-plugins coscheduling).
VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
COSCHEDULING_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
# A job's LocalQueue when spec.scheduling.queueName is unset (Kueue's label for every job kind).
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
# The domains of the label and annotation keys by which Kueue and the gang schedulers join a pod
# to a queue, a Workload or a gang: the operator's to set, never a pod template's (a pod with
# another gang's key would be scheduled with it, or counted in another queue).
SCHEDULING_KEY_DOMAINS = frozenset(
    {
        "kueue.x-k8s.io",
        "scheduling.x-k8s.io",
        "pod-group.scheduling.sigs.k8s.io",
        "scheduling.k8s.io",
        "scheduling.volcano.sh",
        "volcano.sh",
    }
)

TRAINER_CONTAINER = "trainer"

# Pod names, their hostnames and label values are DNS labels of at most 63 characters; the rules
# that keep every name derived from a job's name within that are meshrun.rules.names'.


def service_name(job: str) -> str:
    """The headless Service of a job: its name is the pods' DNS subdomain."""
    return job


def network_policy_name(job: str) -> str:
    """The NetworkPolicy that admits only the job's own pods (and the operator on 9400)."""
    return job


def podgroup_name(job: str) -> str:
    """The PodGroup that asks volcano or the coscheduling plugin to gang-schedule the job."""
    return job


def master_addr(job: str, namespace: str) -> str:
    """DNS name of pod 0 through the headless Service: ``<pod>.<service>.<namespace>.svc``."""
    return f"{pod_name(job, 0)}.{service_name(job)}.{namespace}.svc"


def selector(job: str) -> str:
    """Label selector for every pod of a job, as the API server's query string wants it."""
    return f"{LABEL_JOB}={job}"


def job_labels(job: str, uid: str) -> dict[str, str]:
    """The labels that select a job's own pods: its name and its uid (LABEL_JOB_UID)."""
    return {LABEL_JOB: job, LABEL_JOB_UID: uid}


# The job label naming its Kueue WorkloadPriorityClass (Kueue's own jobs use the same label).
PRIORITY_CLASS_LABEL = "kueue.x-k8s.io/priority-class"
