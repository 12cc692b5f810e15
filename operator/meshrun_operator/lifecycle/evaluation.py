"""A job spec checked once per generation: read into types (CRD defaults applied), planned.

Pure: the operator never opens a path a job names (its model folder, its data). A model folder's
shape comes from the sizes given beside ``spec.model.hf``; the trainer checks the files first
thing in its pod and fails permanently, naming the field, when they disagree.
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from meshrun.api.errors import SpecError
from meshrun.api.read import read_spec
from meshrun.api.spec import JobSpec
from meshrun.envcontract import pod_env
from meshrun.planner.plan import Plan, plan_job
from meshrun_operator.children.builders import build_pod
from meshrun_operator.children.owner import JobRef
from meshrun_operator.children.platform import (
    PlatformEgress,
    PlatformPolicy,
    refuse_outside,
    with_queue,
)
from meshrun_operator.children.platform import check as check_platform
from meshrun_operator.children.podpolicy import PodPolicy
from meshrun_operator.children.podpolicy import check as check_template
from meshrun_operator.lifecycle.state import InvalidSpec
from meshrun_operator.names import KUEUE_QUEUE_LABEL


@dataclass(frozen=True)
class Evaluation:
    """A spec checked once: read, its rules checked and planned, or the error."""

    raw_spec: Mapping[str, Any]
    """The spec as the job holds it."""
    spec: JobSpec | None = None
    """The typed, defaulted spec (meshrun.api.spec); None when it cannot be read (it is kept when
    only a later rule refuses the spec: a running attempt goes on under its policy)."""
    plan: Plan | None = None
    """The planner's layout; None when the spec is invalid."""
    error: SpecError | None = None
    """Why the spec cannot run (names the field), or None."""


@dataclass(frozen=True)
class Admission:
    """What this operator admits beyond the spec's own rules (set by its flags)."""

    pod_policy: PodPolicy = PodPolicy.BASELINE
    """The Pod Security Standards level every pod template must meet (--job-pod-policy)."""
    network_policies: bool = True
    """The operator makes a NetworkPolicy per job, so a job may restrict its egress."""
    platform: PlatformPolicy = field(default_factory=PlatformPolicy)
    """Scheduling, identity, volumes, grace and queue rules (children/platform.py)."""
    egress: PlatformEgress = field(default_factory=PlatformEgress)
    """The platform's egress floor, which a job cannot open (children/platform.py)."""
    max_pods: int | None = None
    """The most pods this operator makes for one job (--max-pods-per-job); None: no cap."""


def evaluate(
    raw_spec: Mapping[str, Any],
    name: str,
    admission: Admission | None = None,
    labels: Mapping[str, Any] | None = None,
) -> Evaluation:
    """Read and plan a spec; any problem becomes an Evaluation with ``error`` set. ``labels``:
    the job's, where its Kueue queue may be named."""
    spec = None
    rules = admission or Admission()
    try:
        spec = read_spec(raw_spec)
        spec = with_queue(spec, labels, rules.platform)
        cap_pods("spec.resources.numNodes", spec.resources.num_nodes, rules.max_pods)
        plan = plan_job(spec, name)
        admit(spec, plan, name, rules)
    except SpecError as error:
        return Evaluation(raw_spec=raw_spec, spec=spec, error=error)
    except (ValueError, TypeError, KeyError) as error:
        # A planner bug must not crash the reconcile loop; it surfaces in the Invalid condition.
        failed = SpecError("spec", f"could not be planned: {error!r}")
        return Evaluation(raw_spec=raw_spec, spec=spec, error=failed)
    return Evaluation(raw_spec=raw_spec, spec=spec, plan=plan)


def admit(spec: JobSpec, plan: Plan, name: str, rules: Admission) -> None:
    """SpecError unless the operator may run the job: its pod template meets the pod policy and
    has a shape pods can be built from, its job document fits a pod's environment, it keeps to
    the platform policy, and a restricted egress has a NetworkPolicy to go in and stays inside
    the platform's."""
    check_template(spec.pod_template, rules.pod_policy)
    check_platform(spec, rules.platform)
    if spec.elastic is not None and spec.elastic.max_data_parallel is not None:
        lay = plan.layout
        processes = spec.elastic.max_data_parallel * lay.pp * lay.tp
        largest = -(-processes // spec.resources.num_proc_per_node)
        cap_pods("spec.elastic.maxDataParallel", largest, rules.max_pods)
    egress = spec.networking.egress
    refuse_outside(egress, rules.egress)
    if egress.policy == "Restricted" and not rules.network_policies:
        raise SpecError(
            "spec.networking.egress.policy",
            "Restricted needs the per-job NetworkPolicy, and this operator makes none "
            "(--no-network-policy, Helm value networkPolicy.enabled=false)",
        )
    job = JobRef(name, "default", "")
    # Pod 0's environment holds the job document, whose writing refuses one too big for it.
    env = pod_env(plan, spec, job_name=name, namespace="default", pod_index=0,
                  master_addr="", master_port=0, attempt=0, checkpoint_dir="")  # fmt: skip
    try:
        build_pod(job, spec, plan, 0, 0, env)
    except (AttributeError, TypeError, ValueError, KeyError) as error:
        # A shape template_shape does not know: refused once, not failing every reconcile.
        raise SpecError(POD_TEMPLATE, f"cannot be merged into a pod: {error}") from error


def cap_pods(field: str, pods: int, most: int | None) -> None:
    """SpecError when a job of ``pods`` pods is more than this operator makes for one: each
    pod is built, sent and watched by the one operator every job shares."""
    if most is not None and pods > most:
        raise SpecError(
            field,
            f"{pods} pods are more than the {most} this operator makes for one job (its "
            "--max-pods-per-job, Helm value operator.maxPodsPerJob)",
        )


class Evaluations:
    """Each job's spec evaluated once per generation.

    Reading, checking and planning a spec takes milliseconds, and a launch reconciles its job
    many times; the spec only changes with ``metadata.generation`` (the status has a
    subresource of its own). Without a generation, an equal spec is the same spec.
    """

    def __init__(self, admission: Admission | None = None) -> None:
        self.by_uid: dict[str, tuple[tuple[str, object, object], Evaluation]] = {}
        self.admission = admission or Admission()
        self.thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="meshrun-planner")
        """Where new generations are evaluated, off the event loop, one at a time: planning
        holds the GIL, so more threads would not plan sooner, and each thread that allocates
        gets a malloc arena of its own, which keeps its peak. asyncio's default executor
        starts up to min(32, cores + 4)."""

    def of(
        self,
        uid: str,
        raw_spec: Mapping[str, Any],
        name: str,
        generation: object,
        labels: Mapping[str, Any] | None = None,
    ) -> Evaluation:
        """The job's evaluated spec (evaluated now if its generation or queue label is new)."""
        known = self.known(uid, raw_spec, name, generation, labels)
        if known is not None:
            return known
        ev = evaluate(raw_spec, name, self.admission, labels)
        key = (name, generation, (labels or {}).get(KUEUE_QUEUE_LABEL))
        self.by_uid[uid] = (key, ev)
        return ev

    def known(
        self,
        uid: str,
        raw_spec: Mapping[str, Any],
        name: str,
        generation: object,
        labels: Mapping[str, Any] | None = None,
    ) -> Evaluation | None:
        """The job's evaluated spec when this generation (and queue label) was evaluated
        already, else None (:meth:`of` evaluates it)."""
        key = (name, generation, (labels or {}).get(KUEUE_QUEUE_LABEL))
        cached = self.by_uid.get(uid)
        if (
            cached is not None
            and cached[0] == key
            and (generation is not None or cached[1].raw_spec == raw_spec)
        ):
            return cached[1]
        return None

    def reject(self, uid: str, error: SpecError) -> None:
        """The API server rejected a child built from the job's spec: the spec is invalid (its
        ``error``) until its generation changes."""
        cached = self.by_uid.get(uid)
        if cached is not None:
            self.by_uid[uid] = (cached[0], refused(cached[1], error))

    def forget(self, uid: str) -> None:
        self.by_uid.pop(uid, None)


def refused(ev: Evaluation, error: SpecError) -> Evaluation:
    """The same spec, judged invalid by someone after the planner (the API server)."""
    return Evaluation(raw_spec=ev.raw_spec, spec=ev.spec, error=error)


def still_refused(ev: Evaluation, known: InvalidSpec | None, generation: object) -> Evaluation:
    """A pod template the API server refused stays refused until the spec changes.

    Only the API server can judge a pod template; without this, every resync would try to
    create the refused pod again.
    """
    if (
        ev.error is None
        and known is not None
        and known.field == POD_TEMPLATE
        and known.generation == generation
    ):
        return refused(ev, SpecError(POD_TEMPLATE, known.rule))
    return ev


POD_TEMPLATE = "spec.podTemplate"
"""The field the API server judges: a pod it refuses is this field's fault."""
