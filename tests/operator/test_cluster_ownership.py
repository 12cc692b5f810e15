"""On the real control plane: what the operator did not make, it never changes or deletes (a
Service or NetworkPolicy of the job's name made with kubectl), a child deleted while the gang
runs comes back with the gang untouched, and the job pod policy refuses a privileged template."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from meshrun_operator import names
from namespaces import TEST_RUN_LABEL, run_label
from operator_harness import (
    Cluster,
    OperatorProcess,
    admission_refusal,
    job_manifest,
    wait_seconds,
)
from test_cluster_stalls import assert_cleaned_up, one_pod_per_index
from waiting import wait_for

from meshrun.api.crd import GROUP, KIND, PLURAL, VERSION

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]


def get(cluster: Cluster, kind: str, name: str) -> dict[str, Any] | None:
    out = cluster.kubectl("get", kind, name, "-n", cluster.ns, "-o", "json", check=False)
    return json.loads(out.stdout) if out.returncode == 0 else None


def create(cluster: Cluster, obj: dict[str, Any]) -> dict[str, Any]:
    out = cluster.kubectl(
        "create", "-n", cluster.ns, "-o", "json", "-f", "-", input=json.dumps(obj)
    )
    created: dict[str, Any] = json.loads(out.stdout)
    return created


def database_service(name: str) -> dict[str, Any]:
    """A team's Service as kubectl or Helm makes it: no owner, no meshrun labels."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "labels": {"app": "postgres"}},
        "spec": {"selector": {"app": "postgres"}, "ports": [{"port": 5432}]},
    }


def team_policy(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name},
        "spec": {"podSelector": {"matchLabels": {"app": "postgres"}}, "policyTypes": ["Ingress"]},
    }


def name_conflict(cluster: Cluster, job: str) -> dict[str, Any]:
    found: dict[str, Any] = wait_for(
        lambda: (
            (c := cluster.condition(job, "CreationRefused")).get("reason") == "NameConflict" and c
        ),
        60,
        f"job {job} saying NameConflict",
        describe=lambda: cluster.status(job),
    )
    return found


def same_object(before: dict[str, Any], after: dict[str, Any] | None) -> None:
    assert after is not None, "the object was deleted"
    for key in ("uid", "resourceVersion", "labels"):
        assert after["metadata"].get(key) == before["metadata"].get(key), key
    assert "ownerReferences" not in after["metadata"]
    assert after["spec"] == before["spec"]


def test_a_service_or_network_policy_of_the_jobs_name_made_by_kubectl_is_left_alone(
    cluster: Cluster, operator_process: OperatorProcess
) -> None:
    service = create(cluster, database_service("postgres"))
    policy = create(cluster, team_policy("fenced"))
    cluster.apply(job_manifest("postgres"))
    cluster.apply(job_manifest("fenced"))
    for job, kind in (("postgres", "Service"), ("fenced", "NetworkPolicy")):
        conflict = name_conflict(cluster, job)
        assert conflict["status"] == "True"
        assert f"{kind} {job} already exists and is not this job's" in conflict["message"]
        status = cluster.status(job)
        assert status["phase"] == "Pending" and f"{kind} {job} already exists" in status["message"]
        # The Event is posted after the status that carries the condition: awaited.
        warnings = cluster.wait_events(job, "NameConflict")
        assert warnings[0]["type"] == "Warning", warnings
    # A few resyncs later: still no pod, and the team's objects exactly as they were.
    wait_seconds(3)
    assert cluster.pods("postgres") == [] and cluster.pods("fenced") == []
    same_object(service, get(cluster, "service", "postgres"))
    same_object(policy, get(cluster, "networkpolicy", "fenced"))
    # Once the team's Service is gone, the job takes the name and runs.
    cluster.kubectl("delete", "service", "postgres", "-n", cluster.ns)
    cluster.wait_running_pods("postgres", 2, timeout=90)
    cluster.wait_phase("postgres", "Running")
    ours = get(cluster, "service", "postgres")
    assert ours is not None and ours["spec"]["clusterIP"] == "None"
    assert cluster.condition("postgres", "CreationRefused")["status"] == "False"
    assert "Traceback" not in operator_process.log_path.read_text()


def test_a_deleted_headless_service_and_policy_come_back_while_the_pods_keep_running(
    cluster: Cluster, operator_process: OperatorProcess
) -> None:
    cluster.apply(job_manifest("rdv"))
    pods = cluster.wait_running_pods("rdv", 2)
    cluster.wait_phase("rdv", "Running")
    uid = cluster.job("rdv")["metadata"]["uid"]
    running = sorted(p["metadata"]["uid"] for p in pods)
    for kind in ("service", "networkpolicy"):
        first = get(cluster, kind, "rdv")
        assert first is not None
        cluster.kubectl("delete", kind, "rdv", "-n", cluster.ns, "--wait=true")

        def back(kind: str = kind, first: dict[str, Any] = first) -> dict[str, Any] | None:
            found = get(cluster, kind, "rdv")
            return found if found and found["metadata"]["uid"] != first["metadata"]["uid"] else None

        again = wait_for(back, 20, f"the job's {kind} created again")
        (owner,) = again["metadata"]["ownerReferences"]
        assert owner["uid"] == uid and again["spec"] == first["spec"]
    # The gang was never touched: the same pods, no restart.
    assert sorted(p["metadata"]["uid"] for p in cluster.live_pods("rdv")) == running
    status = cluster.status("rdv")
    assert status["phase"] == "Running" and status["restarts"] == 0 and status["attempt"] == 0
    # Each restore's Event is posted at the end of its pass, after the object is created
    # again: the second can still be on its way.
    wait_for(
        lambda: len([e for e in cluster.events("rdv") if e["reason"] == "ChildRestored"]) >= 2,
        30,
        "a ChildRestored Event for the Service and one for the NetworkPolicy",
        describe=lambda: [(e["reason"], e["message"]) for e in cluster.events("rdv")],
    )
    one_pod_per_index(cluster, "rdv", 2)
    assert_cleaned_up(cluster, "rdv")


def test_an_edited_service_and_policy_are_set_back_while_the_pods_keep_running(
    cluster: Cluster, operator_process: OperatorProcess
) -> None:
    """Someone points the job's Service and NetworkPolicy at other pods and strips the job's
    uid label from them and from a pod: the operator patches each back (the same objects) and
    says so, the gang runs on."""
    cluster.apply(job_manifest("drift"))
    pods = cluster.wait_running_pods("drift", 2)
    cluster.wait_phase("drift", "Running")
    running = sorted(p["metadata"]["uid"] for p in pods)
    uid_label = names.LABEL_JOB_UID
    edits = {
        "service": {"spec": {"selector": {"app": "db", uid_label: None}}},
        "networkpolicy": {"spec": {"podSelector": {"matchLabels": {uid_label: None}}}},
    }
    for kind, edit in edits.items():
        first = get(cluster, kind, "drift")
        assert first is not None
        edit["metadata"] = {"labels": {uid_label: None}}
        cluster.kubectl(
            "patch", kind, "drift", "-n", cluster.ns, "--type=merge", "-p", json.dumps(edit)
        )

        def back(kind: str = kind, first: dict[str, Any] = first) -> dict[str, Any] | None:
            found = get(cluster, kind, "drift")
            labels = (found or {}).get("metadata", {}).get("labels") or {}
            return found if found and uid_label in labels else None

        again = wait_for(back, 20, f"the job's {kind} set back")
        assert again["metadata"]["uid"] == first["metadata"]["uid"]  # patched, not replaced
        assert again["metadata"]["labels"] == first["metadata"]["labels"]
        assert again["spec"] == first["spec"]  # the selector whole again: no key kept
    # A pod of the gang without its uid label is out of the Service: labelled again.
    patch = json.dumps({"metadata": {"labels": {uid_label: None}}})
    cluster.kubectl("patch", "pod", "drift-0", "-n", cluster.ns, "--type=merge", "-p", patch)

    def labelled() -> bool:
        pod = get(cluster, "pod", "drift-0") or {}
        return uid_label in (pod.get("metadata", {}).get("labels") or {})

    wait_for(labelled, 20, "pod drift-0 labelled again")
    assert sorted(p["metadata"]["uid"] for p in cluster.live_pods("drift")) == running
    status = cluster.status("drift")
    assert status["phase"] == "Running" and status["restarts"] == 0
    # Each repair's Event is posted at the end of its pass, after the patch the test saw.
    wait_for(
        lambda: len([e for e in cluster.events("drift") if e["reason"] == "ChildRepaired"]) >= 3,
        30,
        "a ChildRepaired Event for the Service, the NetworkPolicy and the pod",
        describe=lambda: [(e["reason"], e["message"]) for e in cluster.events("drift")],
    )
    assert "Traceback" not in operator_process.log_path.read_text()


def test_a_privileged_template_under_baseline_is_invalid_with_the_field_named(
    cluster: Cluster, operator_process: OperatorProcess
) -> None:
    privileged = {"spec": {"containers": [{"name": "trainer",
                                           "securityContext": {"privileged": True}}]}}  # fmt: skip
    cluster.apply(job_manifest("root", podTemplate=privileged))
    # A template that is not a PodTemplateSpec never reaches the operator: the CRD's schema
    # refuses it, naming the field.
    shapeless = job_manifest("shapeless", podTemplate={"spec": "x"})
    refused = cluster.kubectl(
        "apply", "-n", cluster.ns, "-f", "-", input=json.dumps(shapeless), check=False
    )
    assert refused.returncode != 0
    assert "spec.podTemplate.spec" in refused.stderr and "must be of type object" in refused.stderr
    field = "spec.podTemplate.spec.containers[0].securityContext.privileged"
    status = cluster.wait_phase("root", "Failed")
    invalid = cluster.condition("root", "Invalid")
    assert invalid["status"] == "True" and invalid["message"].startswith(f"{field}: ")
    assert status["invalidSpec"]["field"] == field
    assert cluster.pods("root") == []
    assert "privileged containers are not allowed" in invalid["message"]
    assert "job pod policy is baseline" in invalid["message"]
    # Refused once: one InvalidSpec Event (posted after the status that says Failed), and no
    # reconcile error in the log.
    invalid_events = cluster.wait_events("root", "InvalidSpec")
    assert len(invalid_events) == 1, invalid_events
    log = operator_process.log_path.read_text()
    assert "Traceback" not in log and "failed; retrying" not in log


def refuse_status_writes(namespace: str) -> list[dict[str, Any]]:
    """Admission that refuses every write of the jobs' status in one namespace: the status
    patch after a decision fails, as when the operator is killed between its deletes and its
    write."""
    rules = [{"apiGroups": ["meshrun.dev"], "apiVersions": ["*"], "operations": ["UPDATE"],
              "resources": ["paralleltrainingjobs/status"]}]  # fmt: skip
    name = f"no-status-{namespace}"[:63]
    return admission_refusal(namespace, name, rules, "status frozen by the test")


def test_a_restarts_reason_survives_an_operator_that_could_not_write_its_status(
    cluster: Cluster, kubeconfig: str, namespace: str, crds_installed: list[str], tmp_path: Path
) -> None:
    first = OperatorProcess(kubeconfig, namespace, tmp_path, name="first").start()
    objects = refuse_status_writes(namespace)
    try:
        cluster.apply(job_manifest("oom"))
        cluster.wait_running_pods("oom", 2)
        cluster.wait_phase("oom", "Running")
        for obj in objects:
            cluster.kubectl("apply", "-f", "-", input=json.dumps(obj))
        probe = ["patch", PLURAL, "oom", "-n", namespace, "--subresource=status",
                 "--type=merge", "-p", '{"status": {}}', "--dry-run=server"]  # fmt: skip
        wait_for(
            lambda: cluster.kubectl(*probe, check=False).returncode != 0,
            30,
            "the admission policy refusing status writes",
        )
        cluster.finish("oom-0", "Failed", exit_code=137)
        # The restart's status cannot be written, so its deletes are not sent: the failed pod
        # (and the reason it carries) stays for whoever comes next.
        wait_seconds(4)
        phases = {p["metadata"]["name"]: p["status"]["phase"] for p in cluster.live_pods("oom")}
        assert phases == {"oom-0": "Failed", "oom-1": "Running"}, phases
        first.kill()
    finally:
        first.kill()
        for obj in reversed(objects):
            kind = str(obj["kind"]).lower()
            cluster.kubectl("delete", kind, obj["metadata"]["name"], check=False)
    second = OperatorProcess(kubeconfig, namespace, tmp_path, name="second").start()
    try:
        cluster.wait_running_pods("oom", 2, attempt=1, timeout=90)
        status = cluster.wait_phase("oom", "Running")
        assert status["restarts"] == 1 and status["attempt"] == 1
        assert status["lastFailure"]["reason"] == "Killed", status["lastFailure"]
        assert status["lastFailure"]["pod"] == "oom-0"
        one_pod_per_index(cluster, "oom", 2)
    finally:
        cluster.kubectl("delete", PLURAL, "oom", "-n", namespace, "--wait=true")
        second.stop()


def test_a_pod_in_another_namespace_that_names_a_jobs_uid_neither_fails_nor_restarts_it(
    cluster: Cluster, kubeconfig: str, tmp_path: Path
) -> None:
    """One operator serves two teams' namespaces. In the other namespace, pods copied from the
    victim's pod 0, with its labels and an ownerReference naming the victim's uid (one under a
    kind of someone else's group, one as the victim's own kind and name), exit 3 and are then
    deleted: the victim runs on untouched (no restart, no failure, the same pods)."""
    evil = f"{cluster.ns[:50]}-evil"
    cluster.kubectl("create", "namespace", evil)
    cluster.kubectl("label", "namespace", evil, f"{TEST_RUN_LABEL}={run_label()}")
    wait_for(
        lambda: cluster.kubectl("get", "sa", "default", "-n", evil, check=False).returncode == 0,
        30,
        f"serviceaccount default in {evil}",
    )
    operator = OperatorProcess(kubeconfig, cluster.ns, tmp_path, extra=["--namespace", evil])
    operator.start()
    try:
        cluster.apply(job_manifest("victim"))
        pods = cluster.wait_running_pods("victim", 2)
        cluster.wait_phase("victim", "Running")
        uid = cluster.job("victim")["metadata"]["uid"]
        running = sorted(p["metadata"]["uid"] for p in pods)
        original = get(cluster, "pod", "victim-0")
        assert original is not None
        owners = [
            {"apiVersion": "example.invalid/v1", "kind": "Nope", "name": "victim", "uid": uid},
            {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "name": "victim", "uid": uid},
        ]
        for n, owner in enumerate(owners):
            spec = {k: v for k, v in original["spec"].items() if k != "nodeName"}
            planted = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": f"victim-{n}",
                    "namespace": evil,
                    "labels": original["metadata"]["labels"],
                    "annotations": {"sim.meshrun.dev/outcome": "Failed",
                                    "sim.meshrun.dev/exit-code": "3"},
                    "ownerReferences": [{**owner, "controller": True}],
                },
                "spec": spec,
            }  # fmt: skip
            cluster.kubectl("create", "-f", "-", input=json.dumps(planted))

        failed: set[str] = set()

        def ended() -> bool:
            out = cluster.kubectl("get", "pods", "-n", evil, "-o", "json", check=False).stdout
            items = json.loads(out or '{"items": []}')["items"]
            failed.update(
                p["metadata"]["name"] for p in items if p.get("status", {}).get("phase") == "Failed"
            )
            left = {p["metadata"]["name"] for p in items}
            # Each failed, or (the one naming the job's own kind, whose owner the garbage
            # collector finds missing in this namespace) deleted by the garbage collector.
            return "victim-0" in failed and left <= failed

        wait_for(ended, 60, "the planted pods failed with exit 3")
        cluster.kubectl("delete", "pods", "--all", "-n", evil, "--wait=true", "--timeout=60s")
        wait_seconds(5)  # ten resync passes of the victim
        status = cluster.status("victim")
        assert status["phase"] == "Running", status
        assert status["restarts"] == 0 and status.get("disruptions", 0) == 0, status
        assert sorted(p["metadata"]["uid"] for p in cluster.live_pods("victim")) == running
        assert "Traceback" not in operator.log_path.read_text()
    finally:
        cluster.kubectl("delete", PLURAL, "--all", "-n", cluster.ns, "--timeout=20s", check=False)
        operator.stop()
        print(f"--- operator log ---\n{operator.log_tail(60)}")
        cluster.kubectl("delete", "namespace", evil, "--wait=false", check=False)
