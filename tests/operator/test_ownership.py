"""Ownership before every write or delete, decision by decision: whose an object of a child's name
is, what the job says when it is not meshrun's, children created again while the gang runs, and
the status written before a restart's deletes (no cluster)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest
from meshrun_operator import names
from meshrun_operator.children.drift import drifted, mark, spec_selector
from meshrun_operator.children.netpolicy import PolicyOptions
from meshrun_operator.children.owner import Claim, JobRef, claim
from meshrun_operator.client.answers import Holder
from meshrun_operator.client.kube import Kube
from meshrun_operator.kueue import QueueRef
from meshrun_operator.lifecycle.decide import decide
from meshrun_operator.lifecycle.evaluation import evaluate
from meshrun_operator.runtime.actions import (
    CreationRefused,
    StillTerminating,
    _create_children,
    execute,
    restore,
)
from meshrun_operator.runtime.context import OperatorContext
from meshrun_operator.runtime.kueue_link import KueueHold, KueueLink, create_workload
from meshrun_operator.runtime.reconcile import reconcile
from meshrun_operator.seen.children import observe as observe_children
from meshrun_operator.seen.expectations import Expectations, Tombstones
from meshrun_operator.seen.views import Refusal, pod_view
from operator_factories import at, make_job, make_pod, observe
from operator_lifecycle_helpers import TIMING, advance, condition, failed, run, running_job

from meshrun.api.crd import API_VERSION, KIND

pytestmark = pytest.mark.unit

JOB = JobRef("train", "ns", "uid-1")
MESHRUN = {names.LABEL_JOB: "train", names.LABEL_MANAGED_BY: names.MANAGED_BY}


@pytest.mark.parametrize(
    ("controller", "kind", "labels", "expected"),
    [
        ("uid-1", KIND, MESHRUN, Claim.OURS),
        ("uid-1", "evil.io/v1 " + KIND, MESHRUN, Claim.FOREIGN),  # another group's kind
        ("uid-0", "evil.io/v1 " + KIND, MESHRUN, Claim.FOREIGN),  # not a predecessor
        ("uid-1", KIND, {}, Claim.OURS),  # the job's controller reference suffices
        (None, None, MESHRUN, Claim.ORPHAN),
        ("uid-0", KIND, MESHRUN, Claim.PREDECESSOR),
        (None, None, {}, Claim.FOREIGN),  # kubectl create service
        (None, None, {names.LABEL_JOB: "train"}, Claim.FOREIGN),  # one label is not enough
        (None, None, {**MESHRUN, names.LABEL_JOB: "other"}, Claim.FOREIGN),
        (None, None, {names.LABEL_MANAGED_BY: names.MANAGED_BY}, Claim.FOREIGN),
        ("uid-9", "Deployment", MESHRUN, Claim.FOREIGN),  # labels copied by someone else
        ("uid-9", "HelmRelease", {}, Claim.FOREIGN),
        (None, None, "not a mapping", Claim.FOREIGN),
    ],
)
def test_whose_an_object_of_a_childs_name_is(
    controller: str | None, kind: str | None, labels: Any, expected: Claim
) -> None:
    # ``kind`` is "apiVersion kind" where the controller is not of meshrun's API group.
    version, _, kind = (kind or "").rpartition(" ") if controller else ("", "", None)
    api_version = version or API_VERSION
    holder = Holder(controller, -1, False, kind, labels, controller_api_version=api_version)
    assert claim(JOB, holder) is expected


def test_a_name_conflict_leaves_the_job_pending_with_no_pods_and_says_so() -> None:
    job, first = run(make_job(), observe(), 0)
    assert first.create_pods == (0, 1)
    message = "Service job already exists and is not this job's (controller: none; ...)"
    conflict = Refusal((), "NameConflict", message, "Service job")
    decision = decide(job, replace(observe(), refused=conflict), at(0), TIMING)
    cond = condition(decision, "CreationRefused")
    assert (cond["status"], cond["reason"], cond["message"]) == ("True", "NameConflict", message)
    assert ("Warning", "NameConflict") in {(e.type, e.reason) for e in decision.events}
    assert decision.status["phase"] == "Pending" and message in decision.status["message"]
    assert decision.delete_pods == () and decision.force_delete_pods == ()
    job = advance(job, decision)
    # While the conflict lasts, no pod is created and nothing is deleted; the Event is not
    # repeated for the same conflict.
    again = decide(job, replace(observe(), refused=conflict), at(12), TIMING)
    assert again.create_pods == () and again.delete_pods == ()
    assert "NameConflict" not in {e.reason for e in again.events}


@pytest.mark.parametrize("kind", ["Service", "NetworkPolicy"])
def test_a_child_deleted_while_the_gang_runs_is_created_again_and_the_gang_untouched(
    kind: str,
) -> None:
    job = running_job()
    pods = (make_pod(0), make_pod(1))
    observed = replace(observe(*pods), missing_children=(kind,))
    decision = decide(job, observed, at(5), TIMING)
    assert decision.restore == (kind,)
    assert decision.create_pods == () and decision.delete_pods == ()
    assert decision.status["phase"] == "Running" and decision.status["restarts"] == 0
    # Nothing missing: nothing to restore.
    assert decide(job, observe(*pods), at(5), TIMING).restore == ()


def test_a_restore_refused_by_a_name_conflict_is_said_and_the_gang_runs_on() -> None:
    job = running_job()
    pods = (make_pod(0), make_pod(1))
    message = "Service job already exists and is not this job's"
    conflict = Refusal((), "NameConflict", message, "Service job")
    decision = decide(job, replace(observe(*pods), refused=conflict), at(5), TIMING)
    cond = condition(decision, "CreationRefused")
    assert (cond["status"], cond["reason"]) == ("True", "NameConflict")
    assert decision.status["phase"] == "Running" and decision.delete_pods == ()
    job = advance(job, decision)
    # Once the job's own Service is back, the condition turns False.
    done = decide(job, observe(*pods), at(8), TIMING)
    assert condition(done, "CreationRefused")["status"] == "False"


def test_pods_of_the_jobs_name_that_meshrun_did_not_make_are_neither_waited_for_nor_deleted() -> (
    None
):
    body = {"metadata": {"name": "job", "namespace": "ns", "uid": "uid-1"}}
    own = make_pod(0, owner_uid="uid-1", uid="a")
    orphan = make_pod(1, uid="b")  # managed-by label, no controller: an orphan of the job's
    strangers = make_pod(5, uid="c", managed=False)  # someone's pod with the job-name label
    other_controller = make_pod(6, owner_uid="rs-1", uid="d", managed=False)
    index = {("ns", "job"): [own, orphan, strangers, other_controller]}
    seen = observe_children(body, index, None, Expectations(60), Tombstones())
    assert seen.pods == (own,)
    assert seen.foreign == (orphan,)


class RecordingKube:
    """The API door as a list of calls: what the reconciler sends, in order."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.may_write = lambda: True

    async def delete_pods(self, namespace: str, pods: Any, force: bool, uids: Any) -> None:
        self.calls.append(f"delete {','.join(sorted(pods))}")

    async def patch_status(
        self, namespace: str, name: str, version: str, status: dict[str, Any]
    ) -> dict[str, Any]:
        self.calls.append(f"status restarts={status['restarts']} attempt={status['attempt']}")
        return {"metadata": {"name": name, "resourceVersion": "2"}, "status": status}

    async def post_event(self, involved: Any, type: str, reason: str, message: str) -> None:
        self.calls.append(f"event {reason}")


def test_a_restart_writes_its_reason_before_deleting_and_a_restarted_operator_keeps_it() -> None:
    job = running_job()
    job["metadata"]["resourceVersion"] = "1"
    pods = [failed(0, 137, container_reason="OOMKilled", owner_uid="uid-1", uid="p0")]
    pods.append(make_pod(1, owner_uid="uid-1", uid="p1"))
    kube = RecordingKube()
    ctx = OperatorContext(kube=kube, timing=TIMING)  # type: ignore[arg-type]
    index = {("ns", "job"): pods}
    decision = asyncio.run(reconcile(ctx, job, index, None))
    assert decision.state.last_failure is not None
    assert decision.state.last_failure.reason == "OOMKilled"
    writes = [c for c in kube.calls if not c.startswith("event")]
    assert writes == ["status restarts=1 attempt=1", "delete job-0,job-1"]
    # Killed right after the deletes: a new operator finds the attempt ended, its pods going.
    after = advance(job, decision)
    going = (replace(pods[0], deleting=True), replace(pods[1], deleting=True))
    later = decide(after, observe(*going), at(30), TIMING)
    assert later.status["restarts"] == 1 and later.status["attempt"] == 1
    assert later.status["lastFailure"]["reason"] == "OOMKilled"
    assert later.status["phase"] == "Restarting"


class CapturingRest:
    """The HTTP layer as a list of (method, path, body): what the API door sends."""

    timeout = None

    def __init__(self) -> None:
        self.sent: list[tuple[str, str, Any]] = []

    async def request(self, method: str, path: str, **options: Any) -> Any:
        self.sent.append((method, path, options.get("body")))


def test_every_delete_is_preconditioned_on_what_was_judged() -> None:
    rest = CapturingRest()
    kube = Kube(rest)  # type: ignore[arg-type]
    orphan = Holder(None, -1, False, uid="s-1", resource_version="77")

    async def deletes() -> None:
        await kube.delete_child("Service", "ns", orphan, "train")
        await kube.delete_child("NetworkPolicy", "ns", orphan, "train")
        plugins = "scheduling.x-k8s.io/v1alpha1"
        await kube.delete_child("PodGroup", "ns", orphan, "train", plugins)
        await kube.delete_job("ns", "train", "uid-1")
        await kube.delete_pods("ns", ["train-0", "train-1"], False, {"train-0": "p-0"})

    asyncio.run(deletes())
    paths = [(method, path) for method, path, _ in rest.sent]
    assert paths == [
        ("DELETE", "/api/v1/namespaces/ns/services/train"),
        ("DELETE", "/apis/networking.k8s.io/v1/namespaces/ns/networkpolicies/train"),
        ("DELETE", "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/ns/podgroups/train"),
        ("DELETE", "/apis/meshrun.dev/v1alpha1/namespaces/ns/paralleltrainingjobs/train"),
        ("DELETE", "/api/v1/namespaces/ns/pods/train-0"),  # train-1's uid is unknown: not sent
    ]
    conditions = [body["preconditions"] for _, _, body in rest.sent]
    assert conditions == [
        {"uid": "s-1", "resourceVersion": "77"},
        {"uid": "s-1", "resourceVersion": "77"},
        {"uid": "s-1", "resourceVersion": "77"},
        {"uid": "uid-1"},
        {"uid": "p-0"},
    ]


class ChildKube:
    """Creates answer ``exists`` (409: False) or create; a name held is held by ``holder``."""

    def __init__(self, exists: bool, holder: Holder | dict[str, Holder] | None = None) -> None:
        self.exists, self.holder_found = exists, holder
        self.created: list[str] = []
        self.deleted: list[str] = []
        self.repaired: list[tuple[str, Any]] = []

    async def create(self, obj: dict[str, Any]) -> bool:
        self.created.append(obj["kind"])
        return not self.exists

    async def holder(
        self, kind: str, namespace: str, name: str, api_version: str | None = None
    ) -> Holder | None:
        if isinstance(self.holder_found, dict):  # one of each kind
            return self.holder_found[kind]
        return self.holder_found

    async def delete_child(
        self, kind: str, namespace: str, holder: Holder, name: str, api_version: str | None = None
    ) -> None:
        self.deleted.append(kind)

    async def repair_child(
        self, kind: str, namespace: str, name: str, ops: Any, api_version: str | None = None
    ) -> bool:
        self.repaired.append((kind, ops))
        return True


def restored(kube: ChildKube) -> list[str]:
    ctx = OperatorContext(kube=kube, network_policy=PolicyOptions())  # type: ignore[arg-type]
    ev = evaluate(make_job()["spec"], "job")
    job = JobRef("job", "ns", "uid-1")
    notes = asyncio.run(restore(ctx, job, ev, ("Service", "NetworkPolicy")))
    return [n.reason for n in notes]


def test_restoring_creates_what_is_gone_and_says_so_only_when_it_created_it() -> None:
    gone = ChildKube(exists=False)
    assert restored(gone) == ["ChildRestored", "ChildRestored"]
    assert gone.created == ["Service", "NetworkPolicy"]
    # The watch lagged: the job's own are there (409, and the holder is the job), as made.
    ours = ChildKube(exists=True, holder={k: own_child(k) for k in ("Service", "NetworkPolicy")})
    assert restored(ours) == [] and ours.deleted == [] and ours.repaired == []
    # Someone else's took the name: nothing deleted, a NameConflict for the job to say.
    theirs = ChildKube(exists=True, holder=Holder(None, -1, False, labels={"app": "db"}))
    with pytest.raises(CreationRefused) as refused:
        restored(theirs)
    assert refused.value.refusal.reason == "NameConflict" and theirs.deleted == []
    assert refused.value.refusal.what == "Service job"
    # The job's orphan is replaced: deleted (under preconditions), created at the next pass.
    orphan = ChildKube(exists=True, holder=Holder(None, -1, False, labels={
        names.LABEL_JOB: "job", names.LABEL_MANAGED_BY: names.MANAGED_BY}))  # fmt: skip
    with pytest.raises(StillTerminating):
        restored(orphan)
    assert orphan.deleted == ["Service"]


def own_child(kind: str, labels: dict[str, str] | None = None, selector: Any = None) -> Holder:
    """The job's own Service or NetworkPolicy as the operator made it, or with ``labels`` or
    ``selector`` instead of its own."""
    made = {**names.job_labels("job", "uid-1"), names.LABEL_MANAGED_BY: names.MANAGED_BY}
    wanted = names.job_labels("job", "uid-1")
    field = "selector" if kind == "Service" else "podSelector"
    if selector is None:
        selector = wanted if kind == "Service" else {"matchLabels": wanted}
    return Holder("uid-1", -1, False, KIND, labels if labels is not None else made,
                  uid="s-1", resource_version="41", controller_api_version=API_VERSION,
                  spec={field: selector})  # fmt: skip


@pytest.mark.parametrize(
    ("edit", "what"),
    [
        ({"labels": {names.LABEL_JOB: "job", "app": "x"}}, ("labels",)),  # the uid label gone
        ({"selector": {names.LABEL_JOB: "job", "app": "db"}}, ("selector",)),
        ({"labels": {}, "selector": {}}, ("labels", "selector")),
    ],
)
def test_the_jobs_own_child_with_edited_labels_or_selector_is_set_back_and_said(
    edit: dict[str, Any], what: tuple[str, ...]
) -> None:
    """A Service or NetworkPolicy whose labels or selector were edited is no longer found by
    the job or no longer covers its pods: the restore that finds the name held by the job's own
    patches them back, under the resourceVersion judged, and the job says so."""
    for kind in ("Service", "NetworkPolicy"):
        selector = edit.get("selector")
        if selector is not None and kind == "NetworkPolicy":
            selector = {"matchLabels": selector}
        holder = own_child(kind, edit.get("labels"), selector)
        kube = ChildKube(exists=True, holder=holder)
        notes = restored_one(kube, kind)
        assert notes == ["ChildRepaired"], kind
        assert kube.deleted == [] and [k for k, _ in kube.repaired] == [kind]
        ops = kube.repaired[0][1]
        assert ops[0] == {"op": "replace", "path": "/metadata/resourceVersion", "value": "41"}
        labels = next(op["value"] for op in ops if op["path"] == "/metadata/labels")
        assert labels[names.LABEL_JOB_UID] == "uid-1" and labels[names.LABEL_JOB] == "job"
        field = "/spec/selector" if kind == "Service" else "/spec/podSelector"
        put = next(op["value"] for op in ops if op["path"] == field)
        wanted = names.job_labels("job", "uid-1")
        assert put == (wanted if kind == "Service" else {"matchLabels": wanted})
        assert drifted(kind, "job", "uid-1", labels, put) == ()
        assert (
            drifted(kind, "job", "uid-1", holder.labels, spec_selector(kind, holder.spec)) == what
        )


def restored_one(kube: ChildKube, kind: str) -> list[str]:
    ctx = OperatorContext(kube=kube, network_policy=PolicyOptions())  # type: ignore[arg-type]
    ev = evaluate(make_job()["spec"], "job")
    notes = asyncio.run(restore(ctx, JobRef("job", "ns", "uid-1"), ev, (kind,)))
    return [n.reason for n in notes]


def test_a_child_whose_labels_or_selector_were_edited_counts_as_missing() -> None:
    """The children's index marks an edited child, so the job restores it at the next pass."""
    meta = {
        "labels": {**names.job_labels("job", "uid-1"), names.LABEL_MANAGED_BY: names.MANAGED_BY}
    }
    intact = mark("Service", "job", meta, "uid-1", {"selector": names.job_labels("job", "uid-1")})
    edited = mark("Service", "job", meta, "uid-1", {"selector": {names.LABEL_JOB: "job"}})
    assert intact.intact and not edited.intact
    for marks, missing in (([intact], ()), ([edited], ("Service",)), ([], ("Service",))):
        ctx = OperatorContext(kube=None, children={"Service": {("ns", "job"): marks}})  # type: ignore[arg-type]
        assert ctx.missing_children("ns", "job", "uid-1") == missing


def controller(api_version: str = API_VERSION, kind: str = KIND, name: str = "job",
               uid: str = "uid-1") -> dict[str, Any]:  # fmt: skip
    """A controller ownerReference."""
    return {"apiVersion": api_version, "kind": kind, "name": name, "uid": uid, "controller": True}


def pod_object(
    namespace: str = "ns", job: str = "job", owner: dict[str, Any] | None = None, code: int = 3
) -> dict[str, Any]:
    """A pod as the watch shows it: pod 0 of attempt 0 with meshrun's labels, its trainer
    exited with ``code``."""
    terminated = {"exitCode": code, "reason": "Error"}
    return {
        "metadata": {
            "name": f"{job}-0",
            "namespace": namespace,
            "uid": f"{namespace}/{job}/{owner}",  # one for each pod of these tests
            "labels": {
                names.LABEL_JOB: job,
                names.LABEL_MANAGED_BY: names.MANAGED_BY,
                names.LABEL_POD_INDEX: "0",
                names.LABEL_ATTEMPT: "0",
            },
            "ownerReferences": [owner or controller()],
        },
        "spec": {"nodeName": "node-0"},
        "status": {
            "phase": "Failed",
            "containerStatuses": [{"name": "trainer", "state": {"terminated": terminated}}],
        },
    }


# Pods that claim the job (namespace ns, name job, uid uid-1) by its uid alone.
IMPOSTORS = {
    "another namespace, any kind": pod_object("evil", owner=controller("example.invalid/v1",
                                                                        "Nope")),
    "another namespace, the job's kind": pod_object("evil"),
    "another API group": pod_object(owner=controller("evil.io/v1")),
    "another kind": pod_object(owner=controller(kind="Deployment")),
    "another job's name": pod_object(owner=controller(name="other")),
    "a label of another job": pod_object(job="other"),
    "not the controller": pod_object(owner={**controller(), "controller": False}),
}  # fmt: skip


@pytest.mark.parametrize("impostor", IMPOSTORS.values(), ids=IMPOSTORS.keys())
def test_a_deleted_pod_counts_for_a_job_only_when_the_job_controls_it(
    impostor: dict[str, Any],
) -> None:
    tombstones = Tombstones()
    tombstones.record(impostor)
    tombstones.record(pod_object())  # the job's own
    body = {"metadata": {"name": "job", "namespace": "ns", "uid": "uid-1"}}
    seen = observe_children(body, {}, None, Expectations(60), tombstones)
    assert [p.uid for p in seen.gone] == [pod_object()["metadata"]["uid"]]


# The pods index is keyed by the pod's own namespace: these are the ones in the job's.
NEIGHBOURS = {k: v for k, v in IMPOSTORS.items() if v["metadata"]["namespace"] == "ns"}


@pytest.mark.parametrize("impostor", NEIGHBOURS.values(), ids=NEIGHBOURS.keys())
def test_a_pod_is_the_jobs_own_only_when_the_job_controls_it(impostor: dict[str, Any]) -> None:
    body = {"metadata": {"name": "job", "namespace": "ns", "uid": "uid-1"}}
    index = {("ns", "job"): [pod_view(impostor)]}
    assert observe_children(body, index, None, Expectations(60), Tombstones()).pods == ()
    own = pod_view(pod_object())
    index = {("ns", "job"): [own]}
    assert observe_children(body, index, None, Expectations(60), Tombstones()).pods == (own,)


def test_a_pod_in_another_namespace_cannot_fail_a_job_given_its_uid() -> None:
    job = running_job()
    job["metadata"]["resourceVersion"] = "1"
    kube = RecordingKube()
    ctx = OperatorContext(kube=kube, timing=TIMING)  # type: ignore[arg-type]
    # Exit code 3 (NoAccelerator) fails a job at once, with no restart.
    ctx.tombstones.record(pod_object("evil", owner=controller("example.invalid/v1", "Nope")))
    ctx.tombstones.record(pod_object("evil"))
    running = [make_pod(i, owner_uid="uid-1", uid=f"p{i}") for i in (0, 1)]
    decision = asyncio.run(reconcile(ctx, job, {("ns", "job"): running}, None))
    assert decision.status["phase"] == "Running" and decision.state.last_failure is None
    assert not [c for c in kube.calls if c.startswith("delete")]
    # The job's own pod, deleted after it failed the same way, fails it.
    ctx.tombstones.record(pod_object())
    decision = asyncio.run(reconcile(ctx, job, {("ns", "job"): running[1:]}, None))
    assert decision.status["phase"] == "Failed"


def test_a_pod_with_a_controller_of_another_kind_is_waited_for_never_deleted_as_an_orphan() -> None:
    someones = pod_view(pod_object(owner=controller(kind="Deployment")))
    orphan_body = pod_object()
    orphan_body["metadata"]["ownerReferences"] = []
    orphan = replace(pod_view(orphan_body), name="job-1", index=1)
    assert someones.other_controller and not orphan.other_controller
    decision = decide(make_job(), replace(observe(), foreign=(someones, orphan)), at(0), TIMING)
    assert (*decision.delete_pods, *decision.force_delete_pods) == ("job-1",)
    assert decision.create_pods == () and decision.status["phase"] == "Pending"


class GangKube(ChildKube):
    """Every create succeeds but the PodGroup's or the Workload's, whose name ``holder`` holds;
    the pods sent are recorded."""

    def __init__(self, holder: Holder) -> None:
        super().__init__(exists=False, holder=holder)
        self.pods: list[str] = []

    async def create(self, obj: dict[str, Any]) -> bool:
        self.created.append(obj["kind"])
        return obj["kind"] not in ("PodGroup", "Workload")

    async def create_all(self, objs: list[dict[str, Any]], unsent: Any = None) -> list[bool]:
        self.pods += [o["metadata"]["name"] for o in objs]
        return [True for _ in objs]

    async def get_custom(self, *_: Any) -> None:
        return None  # no LocalQueue: the Workload carries no flavor's tolerations


PLANTED = Holder("uid-9", -1, False, "Deployment", {}, controller_api_version="apps/v1")
OWN = Holder("uid-1", -1, False, KIND, MESHRUN, controller_api_version=API_VERSION)


def test_a_podgroup_of_the_name_that_is_not_the_jobs_makes_no_pod() -> None:
    job = make_job(name="train", scheduling={"schedulerName": "volcano"})
    ev = evaluate(job["spec"], "train")
    _, decision = run(job, observe(), 0)
    assert decision.create_pods == (0, 1)
    planted = GangKube(PLANTED)
    ctx = OperatorContext(kube=planted)  # type: ignore[arg-type]
    with pytest.raises(CreationRefused) as refused:
        asyncio.run(_create_children(ctx, JOB, ev, decision))
    assert refused.value.refusal.reason == "NameConflict"
    assert refused.value.refusal.what == "PodGroup train"
    assert "Deployment uid-9" in refused.value.refusal.message
    assert planted.pods == [] and planted.deleted == []  # no gang under someone else's group
    # The job's orphan (no controller, its labels): replaced, the pods wait for the next pass.
    labels = {names.LABEL_JOB: "train", names.LABEL_MANAGED_BY: names.MANAGED_BY}
    orphan = GangKube(Holder(None, -1, False, labels=labels))
    with pytest.raises(StillTerminating):
        asyncio.run(_create_children(OperatorContext(kube=orphan), JOB, ev, decision))  # type: ignore[arg-type]
    assert orphan.deleted == ["PodGroup"] and orphan.pods == []
    own = GangKube(OWN)  # the job's own, created before (the watch lags): the pods follow
    asyncio.run(_create_children(OperatorContext(kube=own), JOB, ev, decision))  # type: ignore[arg-type]
    assert own.pods == ["train-0", "train-1"]


def test_a_workload_of_the_name_that_is_not_the_jobs_holds_the_job() -> None:
    ev = evaluate(make_job(name="train")["spec"], "train")
    planted = GangKube(PLANTED)
    with pytest.raises(KueueHold) as held:
        asyncio.run(create_workload(planted, KueueLink(), JOB, ev, QueueRef("team-a")))  # type: ignore[arg-type]
    assert held.value.hold.reason == "NameConflict"
    assert "Workload" in held.value.hold.message and "Deployment uid-9" in held.value.hold.message
    # The job's own (its controller reference): waited for, no hold.
    asyncio.run(create_workload(GangKube(OWN), KueueLink(), JOB, ev, QueueRef("team-a")))  # type: ignore[arg-type]


class LabellingKube:
    """Records the pods labelled again."""

    def __init__(self) -> None:
        self.labelled: list[tuple[str, str, dict[str, str]]] = []

    async def label_pod(self, namespace: str, name: str, uid: str, labels: Any) -> bool:
        self.labelled.append((name, uid, dict(labels)))
        return True


def test_a_pod_whose_job_uid_label_was_removed_is_labelled_again() -> None:
    """Without its job-uid label a pod of the gang is out of the job's Service (no DNS name
    for the rendezvous): it gets its labels back, the gang untouched."""
    body = pod_object(owner=controller())
    assert pod_view(body).labelled is False  # the factory's pod has no job-uid label
    body["metadata"]["labels"][names.LABEL_JOB_UID] = "uid-1"
    assert pod_view(body).labelled is True
    stripped = replace(make_pod(0, owner_uid="uid-1", uid="p0"), labelled=False)
    pods = (stripped, make_pod(1, owner_uid="uid-1", uid="p1"))
    job = running_job()
    decision = decide(job, observe(*pods), at(5), TIMING)
    assert decision.create_pods == () and decision.delete_pods == ()
    kube = LabellingKube()
    ctx = OperatorContext(kube=kube)  # type: ignore[arg-type]
    ev = evaluate(job["spec"], "job")
    notes = asyncio.run(execute(ctx, JobRef("job", "ns", "uid-1"), ev, decision, observe(*pods)))
    own = {**names.job_labels("job", "uid-1"), names.LABEL_MANAGED_BY: names.MANAGED_BY}
    assert kube.labelled == [("job-0", "p0", own)]
    assert [n.reason for n in notes] == ["ChildRepaired"]
