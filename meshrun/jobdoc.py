"""The job document: what the operator (or ``meshrun run --local``) hands one trainer pod.

One typed JSON value in ``MESHRUN_JOB``: the defaulted spec, the plan and the pod's identity.
The trainer rebuilds the same :class:`meshrun.api.spec.JobSpec` and
:class:`meshrun.planner.plan.Plan` with the reader the planner uses
(:func:`meshrun.api.read.read_section`), so a spec field added to the CRD and its dataclass
reaches the trainer with no other edit. Pure: no I/O.

``spec.podTemplate``, ``spec.command`` and ``spec.args`` are not in the document (the pod
carries them; the trainer never reads them), so the document is a few KiB (1.9-2.7 KiB for the
examples), far below the 128 KiB Linux allows one environment string (MAX_ARG_STRLEN);
:data:`MAX_DOCUMENT_BYTES` is checked when it is written, which the operator's evaluation does
for pod 0 when it admits a job, so a job whose document would not fit is Invalid before any pod.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace

from meshrun.api.errors import SpecError
from meshrun.api.read import defaulted, read_section, write_section
from meshrun.api.spec import JobSpec
from meshrun.planner.plan import Plan

JOB_VARIABLE = "MESHRUN_JOB"
"""The environment variable holding the job document."""
MAX_DOCUMENT_BYTES = 96 * 1024
"""Below MAX_ARG_STRLEN (128 KiB), which bounds one environment string on Linux."""


@dataclass(frozen=True, kw_only=True)
class Pod:
    """One pod of a job: who it is and where its outputs go."""

    job_name: str
    """ParallelTrainingJob name (labels metrics)."""
    namespace: str
    """Kubernetes namespace of the job."""
    index: int
    """This pod's index, torchrun's node rank (0 hosts the rendezvous store)."""
    attempt: int
    """Whole-job restart attempt, 0 for the first run."""
    checkpoint_dir: str | None
    """Directory of distributed checkpoints; None disables checkpointing."""
    checkpoint_keep: int
    """Complete checkpoints to keep, newest first (0 keeps all)."""
    metrics_port: int
    """Port of rank 0's /metrics and /progress server (0 disables it)."""
    termination_log: str
    """File that receives the final JSON summary (the pod's termination message)."""


@dataclass(frozen=True, kw_only=True)
class JobDocument:
    """The defaulted spec, its plan and one pod's identity."""

    spec: JobSpec
    """The typed, defaulted spec (``podTemplate``, ``command`` and ``args`` left out)."""
    plan: Plan
    """The planner's layout, model shape and memory estimate."""
    pod: Pod
    """The pod this document is for."""


def write_document(document: JobDocument) -> str:
    """The document as compact JSON (refusing NaN: the CRD admits only finite numbers)."""
    spec = replace(document.spec, pod_template=None, command=None, args=None)
    text = json.dumps(
        {
            "spec": write_section(spec),
            "plan": write_section(document.plan),
            "pod": write_section(document.pod),
        },
        separators=(",", ":"),
        allow_nan=False,
    )
    if len(text.encode()) > MAX_DOCUMENT_BYTES:
        raise SpecError("spec", f"the job document is {len(text)} bytes, over {MAX_DOCUMENT_BYTES}")
    return text


def read_document(text: str, field: str = JOB_VARIABLE) -> JobDocument:
    """The document written by :func:`write_document`; the spec is checked against the CRD again
    (a hand-written document gets the planner's errors, naming the spec field)."""
    try:
        raw = json.loads(text)
    except ValueError as error:
        raise SpecError(field, f"is not JSON: {error}") from None
    if not isinstance(raw, Mapping) or not all(
        isinstance(raw.get(part), Mapping) for part in ("spec", "plan", "pod")
    ):
        raise SpecError(field, "must be a JSON object with spec, plan and pod objects")
    try:
        plan = read_section(Plan, raw["plan"])
        pod = read_section(Pod, raw["pod"])
    except (TypeError, ValueError) as error:
        raise SpecError(field, f"holds a malformed plan or pod: {error}") from None
    spec = read_section(JobSpec, defaulted(raw["spec"]), shape=plan.model)
    return JobDocument(spec=spec, plan=plan, pod=pod)


def termination_log_of(text: str) -> str | None:
    """The pod's termination-log path from a document that may not read (to report why)."""
    try:
        log = json.loads(text)["pod"]["terminationLog"]
    except (ValueError, KeyError, TypeError):
        return None
    return log if isinstance(log, str) else None
