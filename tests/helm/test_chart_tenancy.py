"""The chart's tenancy and leader election: the values that turn each on or off, and the
ClusterRoles that the API server's aggregation folds into the built-in edit, admin and view.

Marked ``cluster``: rendering needs the helm binary ``make tools`` builds, and the aggregation
needs the real controller manager.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from helm_support import Kubectl, can_i, find, render, template
from meshrun_operator.main import parse_args
from waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

JOBS = "paralleltrainingjobs.meshrun.dev"


def args(values: dict[str, Any] | None = None) -> list[str]:
    (deploy,) = find(render(values), "Deployment")
    (container,) = deploy["spec"]["template"]["spec"]["containers"]
    return list(container["args"])


def rule_resources(objects: list[dict[str, Any]], kind: str, suffix: str) -> set[str]:
    return {
        res for role in find(objects, kind, suffix) for r in role["rules"] for res in r["resources"]
    }


def test_network_policies_and_leader_election_are_on_by_default_and_can_be_turned_off() -> None:
    on = render()
    options = parse_args(args())
    assert options.leader is not None and options.leader.lease == "meshrun"
    assert options.network_policy is not None and options.network_policy.operator is not None
    (deploy,) = find(on, "Deployment")
    selector = deploy["spec"]["selector"]["matchLabels"]
    # The operator pods the job's NetworkPolicy lets in are exactly the Deployment's pods.
    assert dict(options.network_policy.operator.labels) == selector
    assert "networkpolicies" in rule_resources(on, "ClusterRole", "-jobs")
    (leader,) = find(on, "Role", "-leader")
    assert leader["metadata"]["namespace"] == "meshrun-system"
    named = [r for r in leader["rules"] if r.get("resourceNames")]
    assert named == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": ["meshrun"],
            "verbs": ["get", "update"],
        }
    ]
    off = {"networkPolicy": {"enabled": False}, "leaderElection": {"enabled": False}}
    options = parse_args(args(off))
    assert options.leader is None and options.network_policy is None
    objects = render(off)
    assert "networkpolicies" not in rule_resources(objects, "ClusterRole", "-jobs")
    assert find(objects, "Role", "-leader") == []
    assert find(render({"replicas": 3}), "Deployment")[0]["spec"]["replicas"] == 3
    proc = template({"replicas": 2, "leaderElection": {"enabled": False}}, check=False)
    assert proc.returncode != 0 and "replicas: more than 1 needs leaderElection" in proc.stderr


@pytest.fixture
def user_roles(kubectl: Kubectl) -> Iterator[str]:
    """The chart's aggregated ClusterRoles alone, under a name of this test; deleted after."""
    name = f"agg-{uuid.uuid4().hex[:6]}"
    manifest = template({"fullnameOverride": name}).stdout
    docs = [d for d in manifest.split("\n---\n") if "templates/aggregated-roles.yaml" in d]
    assert len(docs) == 2, "an edit and a view ClusterRole"
    kubectl("apply", "-f", "-", input="\n---\n".join(docs))
    yield name
    kubectl("delete", "clusterrole", f"{name}-edit", f"{name}-view", check=False)


def test_edit_may_run_jobs_and_view_may_read_them(
    kubectl: Kubectl,
    user_roles: str,
    new_namespace: Callable[[str], str],
    crds_installed: list[str],
) -> None:
    namespace = new_namespace("team")
    alice, bob = f"alice-{user_roles}", f"bob-{user_roles}"
    for user, role in ((alice, "edit"), (bob, "view")):
        kubectl(
            "create", "rolebinding", f"{role}-{user}", f"--clusterrole={role}",
            f"--user={user}", "-n", namespace,
        )  # fmt: skip
    # The controller manager folds the labelled ClusterRoles into edit, admin and view.
    wait_for(
        lambda: can_i(kubectl, alice, "create", JOBS, namespace),
        60,
        "the built-in edit role to include ParallelTrainingJobs",
    )
    assert can_i(kubectl, alice, "delete", JOBS, namespace)
    assert can_i(kubectl, alice, "create", "pods", namespace)  # edit could create pods already
    assert not can_i(kubectl, alice, "patch", f"{JOBS}/status", namespace)  # the operator's
    wait_for(lambda: can_i(kubectl, bob, "list", JOBS, namespace), 60, "view to read jobs")
    assert can_i(kubectl, bob, "get", f"{JOBS}/status", namespace)
    assert not can_i(kubectl, bob, "create", JOBS, namespace)
    assert not can_i(kubectl, alice, "create", JOBS, "default")  # only where edit is bound
