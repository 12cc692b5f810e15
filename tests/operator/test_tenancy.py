"""Tenancy, pure parts: the per-job NetworkPolicy, no service account token by default, the
command line of leader election and network policies."""

from __future__ import annotations

import pytest
from meshrun_operator import names
from meshrun_operator.children.netpolicy import OperatorPeer, build_network_policy, parse_labels
from meshrun_operator.children.platform import PlatformPolicy
from meshrun_operator.lifecycle.evaluation import Admission
from meshrun_operator.main import parse_args
from meshrun_operator.runtime.leader import LeaseTiming
from test_builders import JOB, pod_for

from meshrun.envcontract import METRICS_PORT

pytestmark = pytest.mark.unit


def test_only_the_jobs_own_pods_and_the_operator_on_9400_get_in() -> None:
    peer = OperatorPeer("meshrun-system", {"app.kubernetes.io/name": "meshrun"})
    policy = build_network_policy(JOB, peer)
    assert policy["metadata"]["name"] == names.network_policy_name(JOB.name)
    (owner,) = policy["metadata"]["ownerReferences"]
    assert owner["uid"] == JOB.uid and owner["controller"] is True
    spec = policy["spec"]
    # The job's uid too: a pod of the namespace that copies the job-name label is no peer.
    own = {"matchLabels": {names.LABEL_JOB: JOB.name, names.LABEL_JOB_UID: JOB.uid}}
    assert spec["podSelector"] == own and spec["policyTypes"] == ["Ingress"]
    job_pods, operator = spec["ingress"]
    # The job's own pods: every port (rendezvous 29500, and NCCL's and gloo's random ones).
    assert job_pods == {"from": [{"podSelector": own}]}
    assert operator["ports"] == [{"protocol": "TCP", "port": METRICS_PORT}]
    (who,) = operator["from"]
    assert who["namespaceSelector"] == {
        "matchLabels": {"kubernetes.io/metadata.name": "meshrun-system"}
    }
    assert who["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "meshrun"}}


def test_an_operator_outside_the_cluster_opens_nothing_more() -> None:
    (rule,) = build_network_policy(JOB, None)["spec"]["ingress"]
    assert rule["from"], "an empty from would admit every pod"


def test_trainer_pods_mount_no_token_unless_the_template_asks() -> None:
    assert pod_for(index=0)["spec"]["automountServiceAccountToken"] is False
    asked = {"spec": {"automountServiceAccountToken": True, "serviceAccountName": "reader"}}
    # A service account the platform allows (the default policy allows only "default").
    reader = Admission(platform=PlatformPolicy(service_accounts=frozenset({"default", "reader"})))
    pod = pod_for(index=0, admission=reader, podTemplate=asked)
    assert pod["spec"]["automountServiceAccountToken"] is True
    assert pod["spec"]["serviceAccountName"] == "reader"


def test_network_policy_and_leader_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    outside = parse_args([])
    assert outside.network_policy is not None and outside.network_policy.operator is None
    assert parse_args(["--no-network-policy"]).network_policy is None
    inside = parse_args(["--operator-namespace", "ops", "--operator-labels", "a=1,b=2"])
    assert inside.network_policy is not None
    assert inside.network_policy.operator == OperatorPeer("ops", {"a": "1", "b": "2"})
    monkeypatch.setenv("POD_NAMESPACE", "from-downward-api")
    options = parse_args(["--leader-election"])
    assert options.leader is not None and options.leader.namespace == "from-downward-api"
    assert options.network_policy is not None and options.network_policy.operator is not None
    assert options.network_policy.operator.namespace == "from-downward-api"
    with pytest.raises(ValueError, match="renew deadline"):
        LeaseTiming(duration=5, renew_deadline=5, retry=1)
    with pytest.raises(ValueError, match="not key=value"):
        parse_labels("a=1,b")
