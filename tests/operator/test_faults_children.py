"""On the real control plane: a job's children are the ones its uid controls.

A job deleted and created again under the same name waits while the pods and the Service of the
old one still terminate (a finalizer holds them here), then runs with children of its own. Pods
and a Service orphaned by ``kubectl delete --cascade=orphan`` are not counted as the new job's:
they are replaced.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from faults_support import deleted_leaves_nothing, merge_patch, one_pod_per_index
from operator_harness import Cluster, OperatorProcess, job_manifest, wait_seconds
from waiting import wait_for

from meshrun.api.crd import PLURAL

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

HOLD = "meshrun.dev/test-hold"


def set_finalizers(cluster: Cluster, kind: str, name: str, finalizers: list[str]) -> None:
    merge_patch(cluster, kind, name, {"metadata": {"finalizers": finalizers or None}})


def controller_of(obj: dict[str, Any]) -> str | None:
    owners = obj["metadata"].get("ownerReferences") or []
    return next((o["uid"] for o in owners if o.get("controller")), None)


def service(cluster: Cluster, name: str) -> dict[str, Any] | None:
    found = cluster.kubectl("get", "service", name, "-n", cluster.ns, "-o", "json", check=False)
    return json.loads(found.stdout) if found.returncode == 0 else None


def test_the_same_name_again_waits_for_the_old_children_then_runs(
    cluster: Cluster, operator_process: OperatorProcess
) -> None:
    cluster.apply(job_manifest("again"))
    old = cluster.wait_running_pods("again", 2)
    cluster.wait_phase("again", "Running")
    old_uid = cluster.job("again")["metadata"]["uid"]
    for pod in old:
        set_finalizers(cluster, "pod", pod["metadata"]["name"], [HOLD])
    set_finalizers(cluster, "service", "again", [HOLD])
    cluster.kubectl("delete", PLURAL, "again", "-n", cluster.ns, "--wait=true")
    wait_for(
        lambda: all(p["metadata"].get("deletionTimestamp") for p in cluster.pods("again")),
        60,
        "the garbage collector deleting the old pods (held by a finalizer)",
    )

    cluster.apply(job_manifest("again"))
    new_uid = cluster.job("again")["metadata"]["uid"]
    status = wait_for(
        lambda: "earlier job" in (s := cluster.status("again")).get("message", "") and s,
        30,
        "the new job waiting for the old pods",
    )
    assert status["phase"] == "Pending" and status["restarts"] == 0
    assert {controller_of(p) for p in cluster.pods("again")} == {old_uid}
    # The old pods go; the old Service still holds its name, so nothing starts yet.
    for pod in old:
        set_finalizers(cluster, "pod", pod["metadata"]["name"], [])
    wait_for(lambda: not cluster.pods("again"), 30, "the old pods gone")
    wait_seconds(2)
    assert cluster.pods("again") == []
    held = service(cluster, "again")
    assert held is not None and controller_of(held) == old_uid
    set_finalizers(cluster, "service", "again", [])

    cluster.wait_running_pods("again", 2)
    status = cluster.wait_phase("again", "Running")
    assert status["restarts"] == 0 and status["attempt"] == 0
    one_pod_per_index(cluster, "again", 2, attempt=0)
    owned = service(cluster, "again")
    assert owned is not None and controller_of(owned) == new_uid
    deleted_leaves_nothing(cluster, "again")


def test_orphaned_children_are_replaced_not_counted(
    cluster: Cluster, operator_process: OperatorProcess
) -> None:
    cluster.apply(job_manifest("orphan"))
    cluster.wait_running_pods("orphan", 2)
    cluster.wait_phase("orphan", "Running")
    cluster.kubectl("delete", PLURAL, "orphan", "-n", cluster.ns, "--cascade=orphan", "--wait=true")
    orphans = wait_for(
        lambda: (
            (pods := cluster.pods("orphan"))
            and all(controller_of(p) is None for p in pods)
            and pods
        ),
        60,
        "the pods orphaned by the garbage collector",
    )
    orphan_uids = {p["metadata"]["uid"] for p in orphans}

    cluster.apply(job_manifest("orphan"))
    new_uid = cluster.job("orphan")["metadata"]["uid"]
    cluster.wait_running_pods("orphan", 2)
    status = cluster.wait_phase("orphan", "Running")
    assert status["restarts"] == 0 and status["attempt"] == 0
    pods = one_pod_per_index(cluster, "orphan", 2, attempt=0)
    assert orphan_uids.isdisjoint({p["metadata"]["uid"] for p in pods}), "an orphan was kept"
    owned = service(cluster, "orphan")
    assert owned is not None and controller_of(owned) == new_uid
    deleted_leaves_nothing(cluster, "orphan")
