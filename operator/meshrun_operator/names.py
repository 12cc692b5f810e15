"""The one place for child object names, label and annotation keys, and their length limits.

Every name the operator derives comes from here so that two code paths can never build the same
key two different ways (dask-kubernetes once built a lock key twice and leaked locks).
"""

from __future__ import annotations

import re

from meshrun.api import API_VERSION, GROUP, KIND, PLURAL, VERSION
from meshrun.envcontract import METRICS_PORT, RENDEZVOUS_PORT
from meshrun.errors import SpecError

__all__ = ["API_VERSION", "GROUP", "KIND", "METRICS_PORT", "PLURAL", "RENDEZVOUS_PORT", "VERSION"]

# Labels on every child: which job, which pod, which pipeline stage, which attempt.
LABEL_JOB = f"{GROUP}/job-name"
LABEL_POD_INDEX = f"{GROUP}/pod-index"
LABEL_STAGE = f"{GROUP}/pipeline-stage"
LABEL_ATTEMPT = f"{GROUP}/attempt"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "meshrun-operator"

# Annotations the operator writes on pods, and the one the trainer (or a test) writes back.
ANNOTATION_RANKS = f"{GROUP}/ranks"
ANNOTATION_PROGRESS = f"{GROUP}/progress"
# Where operators before status held the bookkeeping kept it; read once to carry a running job
# over (state.py), never written.
ANNOTATION_STATE = f"{GROUP}/state"

# kopf's own bookkeeping, kept under our domain instead of kopf.zalando.org.
FINALIZER = f"{GROUP}/finalizer"
PROGRESS_PREFIX = GROUP
DIFFBASE_KEY = "last-handled-configuration"

# Gang-scheduler integrations (volcano and kubernetes-sigs/scheduler-plugins coscheduling).
VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
COSCHEDULING_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
# A job's LocalQueue when spec.scheduling.queueName is unset (Kueue's label for every job kind).
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"

TRAINER_CONTAINER = "trainer"

# RFC 1123 DNS label: pod hostnames and Service names must match it and fit in 63 characters
# (https://kubernetes.io/docs/concepts/overview/working-with-objects/names/).
DNS_LABEL_MAX = 63
_DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def service_name(job: str) -> str:
    """The headless Service of a job: its name is the pods' DNS subdomain."""
    return job


def pod_name(job: str, index: int) -> str:
    """Pod ``index`` of a job; the same name in every attempt so DNS stays stable."""
    return f"{job}-{index}"


def network_policy_name(job: str) -> str:
    """The NetworkPolicy that admits only the job's own pods (and the operator on 9400)."""
    return job


def podgroup_name(job: str) -> str:
    """The PodGroup that asks volcano or the coscheduling plugin to gang-schedule the job."""
    return job


def master_addr(job: str, namespace: str) -> str:
    """DNS name of pod 0 through the headless Service: ``<pod>.<service>.<namespace>.svc``."""
    return f"{pod_name(job, 0)}.{service_name(job)}.{namespace}.svc"


def check_job_name(job: str, num_pods: int) -> None:
    """Raise SpecError when a child name derived from ``job`` would not be a valid DNS label.

    The pod name doubles as its hostname, so the longest one, ``<job>-<num_pods - 1>``, must
    fit in 63 characters; the Service name must also start with a letter (RFC 1035).
    """
    if not _DNS_1035.match(job):
        raise SpecError(
            "metadata.name",
            f"{job!r} must be a DNS-1035 label (lower-case letters, digits and '-', "
            "starting with a letter) because it names the job's headless Service",
        )
    longest = pod_name(job, max(num_pods - 1, 0))
    if len(longest) > DNS_LABEL_MAX:
        limit = DNS_LABEL_MAX - len(str(max(num_pods - 1, 0))) - 1
        raise SpecError(
            "metadata.name",
            f"{job!r} is {len(job)} characters; with {num_pods} pods it must be at most "
            f"{limit} so the pod hostname {longest[:20]}... fits in {DNS_LABEL_MAX}",
        )


def selector(job: str) -> str:
    """Label selector for every pod of a job, as the API server's query string wants it."""
    return f"{LABEL_JOB}={job}"
