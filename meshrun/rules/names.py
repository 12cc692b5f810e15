"""The rules for the names a job's own names become: its Service, its pods (and their hostnames),
the labels that carry them, and the Kueue queue label.

The job's name names its headless Service (a DNS-1035 label) and, with ``-<index>`` appended,
every pod, whose name is also its hostname and whose ``meshrun.dev/job-name`` label carries the
job's name: all of them DNS labels of at most 63 characters. A Kueue Workload's name is cut to
fit and made unique with a hash, whatever the job's name, and a job's pods keep their names in
every attempt, so no rule depends on the attempt number. The queue name is the value of the
``kueue.x-k8s.io/queue-name`` label and the name of a LocalQueue. The API server checks these
rules too (CEL at the CRD's root and on ``spec.scheduling.queueName``), with the same messages.
"""

from __future__ import annotations

import re

from meshrun.api.errors import Rule
from meshrun.api.spec import JobSpec

DNS_LABEL_MAX = 63
"""RFC 1123 label length: names of pods, Services, hostnames, and label values."""
_DNS_1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_1123_SUBDOMAIN = re.compile(rf"^{_LABEL}(\.{_LABEL})*$")

JOB_NAME = Rule(
    "metadata.name",
    "metadata.name must be a DNS-1035 label (lower-case letters, digits and '-', starting with "
    "a letter, ending with a letter or digit): it names the job's headless Service and, with "
    "the pod index, its spec.resources.numNodes pods",
)
JOB_NAME_LENGTH = Rule(
    "metadata.name",
    "metadata.name plus '-' and the largest pod index (spec.resources.numNodes - 1) must fit in "
    "63 characters: that is a pod's name, its hostname and its meshrun.dev/job-name label",
)
QUEUE_NAME = Rule(
    "spec.scheduling.queueName",
    "spec.scheduling.queueName must be a DNS-1123 subdomain of at most 63 characters: it names "
    "a LocalQueue and is the value of the kueue.x-k8s.io/queue-name label",
)
NAME_RULES = (JOB_NAME, JOB_NAME_LENGTH, QUEUE_NAME)
"""The name rules the CRD states as CEL."""


def pod_name(job: str, index: int) -> str:
    """Pod ``index`` of a job; the same name in every attempt so DNS stays stable."""
    return f"{job}-{index}"


def check_job_name(name: str, num_nodes: int) -> None:
    """Raise SpecError when ``name`` cannot name the job's Service and every pod's hostname."""
    if not _DNS_1035_LABEL.match(name):
        raise JOB_NAME.error(repr(name))
    longest = pod_name(name, max(num_nodes - 1, 0))
    if len(longest) > DNS_LABEL_MAX:
        room = DNS_LABEL_MAX - len(longest) + len(name)
        raise JOB_NAME_LENGTH.error(
            f"{longest!r} is {len(longest)}; with {num_nodes} pods the name may have {room}"
        )


def check_queue_name(spec: JobSpec) -> None:
    """Raise SpecError when spec.scheduling.queueName cannot be a label value and a LocalQueue."""
    queue = spec.scheduling.queue_name
    if queue is not None and (len(queue) > DNS_LABEL_MAX or not _DNS_1123_SUBDOMAIN.match(queue)):
        raise QUEUE_NAME.error(f"{queue!r} has {len(queue)} characters")
