"""What the operator sees of a job's Workload (kueue_link.KueueLink.view): the watched one or its
own newer write, never another job's of the same name, and a hold only while it lasts."""

from __future__ import annotations

from typing import Any

import pytest
from kueue_factories import make_workload
from meshrun_operator import kueue, names
from meshrun_operator.children.owner import JobRef, owner_reference
from meshrun_operator.kueue import Hold
from meshrun_operator.runtime import kueue_link
from meshrun_operator.runtime.kueue_link import KueueLink

pytestmark = pytest.mark.unit

JOB = {"metadata": {"name": "train", "namespace": "ns", "uid": "uid-1"}}


def workload(uid: str, version: str, owner: dict[str, Any] | None = None) -> dict[str, Any]:
    """The job's Workload as the operator makes it: its labels and its controller reference."""
    found = make_workload()
    labels = {kueue.JOB_UID_LABEL: uid, names.LABEL_JOB: "train"}
    reference = owner or owner_reference(JobRef("train", "ns", uid))
    found["metadata"].update(labels=labels, resourceVersion=version, ownerReferences=[reference])
    return found


@pytest.mark.parametrize(
    "owner",
    [
        None,  # no controller: planted by hand
        {"apiVersion": "evil.io/v1", "kind": "ParallelTrainingJob", "name": "train",
         "uid": "uid-1", "controller": True},
        {"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "uid-1",
         "controller": True},
    ],
)  # fmt: skip
def test_a_workload_not_controlled_by_the_job_is_not_its_own(owner: dict[str, Any] | None) -> None:
    planted = workload("uid-1", "10")
    planted["metadata"]["ownerReferences"] = [owner] if owner else []
    link = KueueLink(index={("ns", "train"): [planted]})
    assert link.view(JOB).workload is None  # the uid label alone is anyone's to write
    link.index = {("ns", "train"): [workload("uid-1", "10")]}
    assert link.view(JOB).workload is not None


def test_the_view_prefers_the_newer_copy_and_the_jobs_own_uid(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [1000.0]
    monkeypatch.setattr(kueue_link.time, "monotonic", lambda: clock[0])
    watched = workload("uid-1", "10")
    link = KueueLink(index={("ns", "train"): [workload("uid-0", "99"), watched]})
    assert link.view(JOB).workload is watched  # a job of the same name before it is not it

    mine = workload("uid-1", "12")
    link.latest["uid-1"] = (mine, clock[0])
    assert link.view(JOB).workload is mine  # the watch has not brought the patch yet
    link.index[("ns", "train")][1] = newer = workload("uid-1", "13")
    assert link.view(JOB).workload is newer and "uid-1" not in link.latest

    # A write the watch never confirms (the Workload deleted meanwhile) stands in for a while.
    link.index = {}
    link.latest["uid-1"] = (mine, clock[0])
    assert link.view(JOB).workload is mine
    clock[0] += kueue_link.LATEST_SECONDS + 1
    assert link.view(JOB).workload is None


def test_a_hold_lasts_until_its_time_and_never_hides_a_workload(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [1000.0]
    monkeypatch.setattr(kueue_link.time, "monotonic", lambda: clock[0])
    link = KueueLink(index={})
    hold = Hold("KueueNotInstalled", "no Kueue here")
    link.hold("uid-1", hold)
    assert link.view(JOB).hold == hold and link.view(JOB).workload is None
    clock[0] += kueue_link.HOLD_SECONDS + 1
    assert link.view(JOB).hold is None  # time to try again
    link.hold("uid-1", hold)
    link.index = {("ns", "train"): [workload("uid-1", "1")]}
    assert link.view(JOB).hold is None and link.view(JOB).workload is not None
    link.forget("uid-1")
    assert not link.holds and not link.latest
