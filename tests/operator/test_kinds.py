"""The table of the kinds the operator makes: every path, watch, index and restore is read
from it, so a kind is a row and its builder."""

from __future__ import annotations

from typing import Any

import kopf
import pytest
from meshrun_operator import kinds
from meshrun_operator.children.builders import build_pod, build_podgroup, build_service
from meshrun_operator.children.netpolicy import OperatorPeer, build_network_policy
from meshrun_operator.children.owner import JobRef
from meshrun_operator.client.kube import child_path, kind_path
from meshrun_operator.lifecycle.evaluation import evaluate
from meshrun_operator.main import kopf_settings, parse_args
from meshrun_operator.runtime.actions import RESTORERS
from meshrun_operator.runtime.handlers import register
from operator_factories import make_job

pytestmark = pytest.mark.unit

JOB = JobRef(name="job", namespace="ns", uid="uid-1")


def built() -> list[dict[str, Any]]:
    """One object of each kind the children's builders make."""
    objects: list[dict[str, Any]] = [build_service(JOB)]
    for scheduler in ("volcano", "scheduler-plugins-scheduler"):
        ev = evaluate(make_job(scheduling={"schedulerName": scheduler})["spec"], "job")
        assert ev.spec is not None and ev.plan is not None
        group = build_podgroup(JOB, ev.spec)
        assert group is not None
        objects += [group, build_pod(JOB, ev.spec, ev.plan, 0, 0, {})]
    peer = OperatorPeer(namespace="meshrun-system", labels={"app": "meshrun"})
    return [*objects, build_network_policy(JOB, peer, None)]


def test_every_built_child_is_created_where_the_table_says() -> None:
    paths = {(o["kind"], o["apiVersion"]): kind_path(o) for o in built()}
    assert paths == {
        ("Service", "v1"): ("services", "/api/v1/namespaces/ns/services"),
        ("Pod", "v1"): ("pods", "/api/v1/namespaces/ns/pods"),
        ("PodGroup", "scheduling.volcano.sh/v1beta1"): (
            "podgroups",
            "/apis/scheduling.volcano.sh/v1beta1/namespaces/ns/podgroups",
        ),
        ("PodGroup", "scheduling.x-k8s.io/v1alpha1"): (
            "podgroups",
            "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/ns/podgroups",
        ),
        ("NetworkPolicy", "networking.k8s.io/v1"): (
            "networkpolicies",
            "/apis/networking.k8s.io/v1/namespaces/ns/networkpolicies",
        ),
    }


def test_one_childs_path_at_its_first_version_or_the_one_named() -> None:
    assert child_path("Service", "ns", "j") == "/api/v1/namespaces/ns/services/j"
    assert child_path("PodGroup", "ns", "j") == (
        "/apis/scheduling.volcano.sh/v1beta1/namespaces/ns/podgroups/j"
    )
    assert child_path("PodGroup", "ns", "j", "scheduling.x-k8s.io/v1alpha1") == (
        "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/ns/podgroups/j"
    )
    assert child_path("Workload", "ns", "j") == (
        "/apis/kueue.x-k8s.io/v1beta2/namespaces/ns/workloads/j"
    )
    with pytest.raises(KeyError, match=r"PodGroup is not made at scheduling\.example/v1"):
        child_path("PodGroup", "ns", "j", "scheduling.example/v1")


def test_every_child_whose_drift_is_judged_is_indexed_and_can_be_made_again() -> None:
    restored = {k.kind for k in kinds.KINDS.values() if k.restored}
    assert restored == {k.kind for k in kinds.watched(optional=True)} == set(RESTORERS)
    assert [k.kind for k in kinds.watched(optional=False)] == ["Service"]
    assert [k.kind for k in kinds.watched(optional=True)] == ["Service", "NetworkPolicy"]


@pytest.mark.parametrize("policies", [False, True])
def test_the_indexes_and_watches_of_children_follow_the_table(policies: bool) -> None:
    registry = kopf.OperatorRegistry()
    register(registry, watch_nodes=False, network_policies=policies)
    indexes = {h.id for h in registry._indexing.get_all_handlers()}
    plurals = {"services", *(["networkpolicies"] if policies else [])}
    assert indexes == {
        "meshrun_pods",
        "meshrun_pod_versions",
        *(
            kinds.KINDS[k].index
            for k in (["Service", "NetworkPolicy"] if policies else ["Service"])
        ),
    }
    selectors = [h.selector for h in registry._watching.get_all_handlers() if h.selector]
    watched = {selector.plural or selector.any_name for selector in selectors}
    assert watched == {"pods", "paralleltrainingjobs", *plurals}


def test_only_the_labelled_kinds_are_listed_by_the_job_label() -> None:
    settings = kopf_settings(parse_args([]))
    selected = {(key.group or "", key.any_name) for key in settings.watching.label_selectors}
    assert selected == {
        ("", "pods"),
        ("", "services"),
        ("networking.k8s.io", "networkpolicies"),
        ("kueue.x-k8s.io", "workloads"),
    }
