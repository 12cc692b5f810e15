"""Pure builders of the Service, pods and PodGroup, and the names they use."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from meshrun_operator import names
from meshrun_operator.children.builders import build_pod, build_podgroup, build_service
from meshrun_operator.children.owner import JobRef
from meshrun_operator.children.podpolicy import PodPolicy
from meshrun_operator.lifecycle.evaluation import Admission, evaluate
from operator_factories import make_job

from meshrun.planner.ranks import compress_ranks

pytestmark = pytest.mark.unit

JOB = JobRef(name="job", namespace="ns", uid="uid-1")
ENV = {"WORLD_SIZE": "8", "MASTER_ADDR": "job-0.job.ns.svc", "PET_NODE_RANK": "1"}


def pod_for(
    index: int = 1, attempt: int = 2, admission: Admission | None = None, **spec: Any
) -> dict[str, Any]:
    job = make_job(**spec)
    ev = evaluate(job["spec"], "job", admission)
    assert ev.error is None and ev.spec is not None and ev.plan is not None, ev.error
    return build_pod(JOB, ev.spec, ev.plan, index, attempt, ENV)


def container(pod: dict[str, Any], name: str = names.TRAINER_CONTAINER) -> dict[str, Any]:
    found: dict[str, Any] = next(c for c in pod["spec"]["containers"] if c["name"] == name)
    return found


def env_of(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container(pod)["env"]}


def test_service_is_headless_and_publishes_not_ready_pods() -> None:
    service = build_service(JOB)
    assert service["metadata"]["name"] == "job"
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    # The job's uid as well as its name: a pod that copies the name label is not selected.
    assert service["spec"]["selector"] == {names.LABEL_JOB: "job", names.LABEL_JOB_UID: "uid-1"}
    owner = service["metadata"]["ownerReferences"][0]
    assert owner["uid"] == "uid-1" and owner["controller"] is True
    assert owner["kind"] == "ParallelTrainingJob"


def test_pod_identity_labels_and_rendezvous_names() -> None:
    pod = pod_for(
        index=1, attempt=2, strategy={"type": "pipeline", "pipelineParallel": 2, "microBatches": 2}
    )
    meta = pod["metadata"]
    assert meta["name"] == "job-1"
    assert pod["spec"]["hostname"] == "job-1" and pod["spec"]["subdomain"] == "job"
    assert meta["labels"][names.LABEL_JOB] == "job"
    assert meta["labels"][names.LABEL_POD_INDEX] == "1"
    assert meta["labels"][names.LABEL_ATTEMPT] == "2"
    assert meta["labels"][names.LABEL_STAGE] == "1"  # pp outermost: pod 1 holds stage 1
    assert meta["annotations"][names.ANNOTATION_RANKS] == "4-7"
    assert pod["spec"]["restartPolicy"] == "Never"
    assert meta["ownerReferences"][0]["uid"] == "uid-1"


def test_pod_requests_one_gpu_per_process_and_none_for_cpu() -> None:
    gpu = container(pod_for())
    assert gpu["resources"]["limits"] == {"nvidia.com/gpu": "4"}
    assert gpu["resources"]["requests"] == {"nvidia.com/gpu": "4"}
    cpu = container(pod_for(resources={"accelerator": "cpu"}))
    assert "nvidia.com/gpu" not in str(cpu.get("resources", {}))


def test_env_is_injected_but_the_users_value_wins() -> None:
    template = {
        "spec": {
            "containers": [{"name": "trainer", "env": [{"name": "WORLD_SIZE", "value": "99"}]}]
        }
    }
    env = env_of(pod_for(podTemplate=template))
    assert env["WORLD_SIZE"] == "99"
    assert env["MASTER_ADDR"] == "job-0.job.ns.svc"


def test_pod_template_is_merged_and_not_mutated() -> None:
    template = {
        "metadata": {"labels": {"team": "ml"}, "annotations": {"note": "x"}},
        "spec": {
            "nodeSelector": {"pool": "gpu"},
            "tolerations": [{"key": "gpu", "operator": "Exists"}],
            "volumes": [{"name": "data", "emptyDir": {}}],
            "containers": [
                {"name": "trainer", "volumeMounts": [{"name": "data", "mountPath": "/data"}]},
                {"name": "sidecar", "image": "busybox"},
            ],
        },
    }
    original = copy.deepcopy(template)
    pod = pod_for(podTemplate=template)
    assert template == original
    assert pod["metadata"]["labels"]["team"] == "ml"
    assert pod["metadata"]["annotations"]["note"] == "x"
    assert pod["spec"]["nodeSelector"] == {"pool": "gpu"}
    assert pod["spec"]["tolerations"][0]["key"] == "gpu"
    trainer = container(pod)
    assert trainer["volumeMounts"][0]["mountPath"] == "/data"
    assert trainer["image"] == "meshrun/trainer:test"
    assert container(pod, "sidecar")["image"] == "busybox"


def test_restricted_security_context_by_default_and_user_choice_kept() -> None:
    pod = pod_for()
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert pod["spec"]["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container(pod)["securityContext"]["allowPrivilegeEscalation"] is False
    assert container(pod)["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    template = {
        "spec": {
            "securityContext": {"runAsNonRoot": False},
            "containers": [{"name": "trainer", "securityContext": {"privileged": True}}],
        }
    }
    custom = pod_for(admission=Admission(PodPolicy.PRIVILEGED), podTemplate=template)
    assert custom["spec"]["securityContext"]["runAsNonRoot"] is False
    assert container(custom)["securityContext"]["privileged"] is True
    # The API server refuses privileged with allowPrivilegeEscalation false: not defaulted.
    assert "allowPrivilegeEscalation" not in container(custom)["securityContext"]


def test_every_container_and_init_container_gets_the_restricted_defaults() -> None:
    template = {
        "spec": {
            "initContainers": [{"name": "fetch", "image": "busybox"}],
            "containers": [
                {"name": "sidecar", "image": "busybox"},
                {
                    "name": "adds",
                    "securityContext": {"capabilities": {"add": ["NET_BIND_SERVICE"]}},
                },
            ],
        }
    }
    pod = pod_for(podTemplate=template)
    spec = pod["spec"]
    everyone = [*spec["initContainers"], *spec["containers"]]
    assert [c["name"] for c in everyone] == ["fetch", "trainer", "sidecar", "adds"]
    for one in everyone:
        assert one["securityContext"]["allowPrivilegeEscalation"] is False
        assert one["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert spec["containers"][2]["securityContext"]["capabilities"]["add"] == ["NET_BIND_SERVICE"]


def restricted_gaps(pod: dict[str, Any]) -> list[str]:
    """What a built pod leaves open of the restricted level, read strictly: only the required
    value itself closes a field (a null, like a missing key, leaves it open)."""
    spec = pod["spec"]
    gaps = [] if spec.get("automountServiceAccountToken") is False else ["automount"]
    pod_security = spec.get("securityContext") or {}
    everyone = [*(spec.get("initContainers") or []), *spec["containers"]]
    securities = [c.get("securityContext") or {} for c in everyone]
    if pod_security.get("runAsNonRoot") is not True and not all(
        s.get("runAsNonRoot") is True for s in securities
    ):
        gaps.append("runAsNonRoot")
    confined = ("RuntimeDefault", "Localhost")
    if (pod_security.get("seccompProfile") or {}).get("type") not in confined and not all(
        (s.get("seccompProfile") or {}).get("type") in confined for s in securities
    ):
        gaps.append("seccompProfile")
    for one, security in zip(everyone, securities, strict=True):
        if security.get("allowPrivilegeEscalation") is not False:
            gaps.append(f"{one['name']}.allowPrivilegeEscalation")
        if "ALL" not in ((security.get("capabilities") or {}).get("drop") or []):
            gaps.append(f"{one['name']}.capabilities.drop")
    return gaps


def trainer_security(**security: Any) -> dict[str, Any]:
    return {"spec": {"containers": [{"name": "trainer", "securityContext": security}]}}


NULLS = {
    "pod runAsNonRoot": {"spec": {"securityContext": {"runAsNonRoot": None}}},
    "pod seccompProfile": {"spec": {"securityContext": {"seccompProfile": None}}},
    "automountServiceAccountToken": {"spec": {"automountServiceAccountToken": None}},
    "allowPrivilegeEscalation": trainer_security(allowPrivilegeEscalation=None),
    "capabilities.drop": trainer_security(capabilities={"drop": None}),
    "container runAsNonRoot": trainer_security(runAsNonRoot=None),
    "container seccompProfile": trainer_security(seccompProfile=None),
    "init container": {
        "spec": {
            "initContainers": [
                {
                    "name": "fetch",
                    "securityContext": {
                        "allowPrivilegeEscalation": None,
                        "capabilities": {"drop": None},
                        "runAsNonRoot": None,
                    },
                }
            ]
        }
    },
    "all at once": {
        "spec": {
            "automountServiceAccountToken": None,
            "securityContext": {"runAsNonRoot": None, "seccompProfile": None},
            "containers": [
                {
                    "name": "trainer",
                    "securityContext": {
                        "allowPrivilegeEscalation": None,
                        "capabilities": {"drop": None},
                        "privileged": None,
                    },
                }
            ],
        }
    },
}


@pytest.mark.parametrize("template", NULLS.values(), ids=NULLS.keys())
def test_a_null_is_unset_so_the_restricted_defaults_fill_it(template: dict[str, Any]) -> None:
    for policy in PodPolicy:
        pod = pod_for(admission=Admission(policy), podTemplate=template)
        assert restricted_gaps(pod) == [], policy


def test_template_labels_and_annotations_cannot_set_the_operators_keys() -> None:
    template = {
        "metadata": {
            "labels": {
                names.LABEL_JOB: "someone-else",
                names.LABEL_MANAGED_BY: "helm",
                names.LABEL_ATTEMPT: "9",
                "team": "vision",
            },
            "annotations": {
                names.ANNOTATION_PROGRESS: '{"step": 999}',
                names.ANNOTATION_RANKS: "0-999",
                "note": "kept",
            },
        }
    }
    pod = pod_for(podTemplate=template)
    labels, annotations = pod["metadata"]["labels"], pod["metadata"]["annotations"]
    assert labels[names.LABEL_JOB] == "job"
    assert labels[names.LABEL_MANAGED_BY] == names.MANAGED_BY
    assert labels[names.LABEL_ATTEMPT] == "2" and labels["team"] == "vision"
    assert names.ANNOTATION_PROGRESS not in annotations
    assert annotations[names.ANNOTATION_RANKS] == "4-7" and annotations["note"] == "kept"


def test_command_and_args_override_the_entrypoint() -> None:
    assert container(pod_for())["command"][:3] == ["python", "-m", "torch.distributed.run"]
    custom = container(pod_for(command=["bash", "-c"], args=["echo hi"]))
    assert custom["command"] == ["bash", "-c"] and custom["args"] == ["echo hi"]


def test_scheduling_fields_and_topology_affinity() -> None:
    pod = pod_for(
        scheduling={
            "schedulerName": "custom",
            "priorityClassName": "high",
            "topologyKey": "meshrun.dev/rack",
        }
    )
    assert pod["spec"]["schedulerName"] == "custom"
    assert pod["spec"]["priorityClassName"] == "high"
    term = pod["spec"]["affinity"]["podAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ][0]["podAffinityTerm"]
    assert term["topologyKey"] == "meshrun.dev/rack"
    assert term["labelSelector"]["matchLabels"][names.LABEL_STAGE] == "0"


PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"


def rack_in(*racks: str, weight: int = 100) -> dict[str, Any]:
    """A preferred node affinity term for these racks."""
    expression = {"key": "topology.meshrun.dev/rack", "operator": "In", "values": list(racks)}
    return {"weight": weight, "preference": {"matchExpressions": [expression]}}


def test_chosen_domains_become_a_preferred_node_affinity() -> None:
    spec = make_job(
        resources={"numNodes": 4, "numProcPerNode": 8},
        strategy={"type": "pipeline", "pipelineParallel": 2},
        model={"preset": "1b"},
        training={"steps": 10, "globalBatchSize": 64, "microBatchSize": 1},
        scheduling={"topologyKey": "topology.meshrun.dev/rack"},
    )["spec"]

    def pods(template: dict[str, Any] | None = None, chosen: bool = True) -> list[dict[str, Any]]:
        ev = evaluate({**spec, "podTemplate": template} if template else spec, "job")
        assert ev.spec is not None and ev.plan is not None, ev.error
        domains = {0: ("rack-3",), 1: ("rack-4", "rack-5")} if chosen else None
        return [build_pod(JOB, ev.spec, ev.plan, i, 0, ENV, domains) for i in range(4)]

    # Pods 0-1 are stage 0, pods 2-3 stage 1; no inter-pod term (the scheduler's costly part)
    # and nothing required.
    for pod, racks in zip(pods(), [("rack-3",)] * 2 + [("rack-4", "rack-5")] * 2, strict=True):
        assert pod["metadata"]["labels"][names.LABEL_STAGE] == ("0" if len(racks) == 1 else "1")
        assert pod["spec"]["affinity"] == {"nodeAffinity": {PREFERRED: [rack_in(*racks)]}}
    # The template's own terms are kept beside the operator's.
    own = {"weight": 5, "preference": {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}}
    anti = {PREFERRED: [{"weight": 1, "podAffinityTerm": {"topologyKey": "kubernetes.io/os"}}]}
    template = {"spec": {"affinity": {"nodeAffinity": {PREFERRED: [own]}, "podAntiAffinity": anti}}}
    affinity = pods(template)[0]["spec"]["affinity"]
    assert affinity == {
        "nodeAffinity": {PREFERRED: [own, rack_in("rack-3")]},
        "podAntiAffinity": anti,
    }
    # A template that prefers racks itself keeps its own preference alone.
    template["spec"]["affinity"]["nodeAffinity"] = {PREFERRED: [rack_in("rack-9", weight=7)]}
    affinity = pods(template)[0]["spec"]["affinity"]
    assert affinity["nodeAffinity"] == {PREFERRED: [rack_in("rack-9", weight=7)]}
    # Without chosen domains (no node watch, no room, a CPU job) the inter-pod term is there.
    fallback = pods(chosen=False)[3]["spec"]["affinity"]
    assert set(fallback) == {"podAffinity"}
    term = fallback["podAffinity"][PREFERRED][0]["podAffinityTerm"]
    assert term["labelSelector"]["matchLabels"][names.LABEL_STAGE] == "1"


def test_podgroup_only_for_gang_schedulers() -> None:
    ev = evaluate(make_job()["spec"], "job")
    assert ev.spec is not None
    assert build_podgroup(JOB, ev.spec) is None
    volcano_spec = make_job(scheduling={"schedulerName": "volcano", "queueName": "q"})["spec"]
    volcano = evaluate(volcano_spec, "job")
    assert volcano.spec is not None and volcano.plan is not None
    group = build_podgroup(JOB, volcano.spec)
    assert group is not None
    assert group["apiVersion"] == "scheduling.volcano.sh/v1beta1"
    assert group["spec"] == {"minMember": 2, "minResources": {"nvidia.com/gpu": "8"}, "queue": "q"}
    pod = build_pod(JOB, volcano.spec, volcano.plan, 0, 0, ENV)
    assert pod["metadata"]["annotations"][names.VOLCANO_GROUP_ANNOTATION] == "job"
    plugins_spec = make_job(scheduling={"schedulerName": "scheduler-plugins-scheduler"})["spec"]
    plugins = evaluate(plugins_spec, "job")
    assert plugins.spec is not None and plugins.plan is not None
    group = build_podgroup(JOB, plugins.spec)
    assert group is not None and group["spec"]["minMember"] == 2
    pod = build_pod(JOB, plugins.spec, plugins.plan, 0, 0, ENV)
    assert pod["metadata"]["labels"][names.COSCHEDULING_GROUP_LABEL] == "job"


@pytest.mark.parametrize(
    ("ranks", "text"),
    [([], ""), ([3], "3"), ([0, 1, 2, 3], "0-3"), ([8, 0, 1, 5, 6], "0-1,5-6,8")],
)
def test_compress_ranks(ranks: list[int], text: str) -> None:
    assert compress_ranks(ranks) == text


def test_master_addr_is_pod_zero_through_the_headless_service() -> None:
    assert names.master_addr("job", "ns") == "job-0.job.ns.svc"


def test_a_queue_name_puts_no_kueue_keys_on_the_pods() -> None:
    # Kueue admits the job's Workload, not its pods: a queue-name label on a pod would make
    # Kueue's pod integration (where enabled) gate it as a plain pod of its own.
    pod = pod_for(index=0, attempt=3, scheduling={"queueName": "team-a"})
    keys = [*pod["metadata"]["labels"], *pod["metadata"]["annotations"]]
    assert not [key for key in keys if key.startswith("kueue.x-k8s.io/")], keys


def test_template_keys_cannot_join_the_pods_to_another_gang_or_queue() -> None:
    joins = {
        names.LABEL_JOB_UID: "someone-elses-uid",
        names.KUEUE_QUEUE_LABEL: "free-queue",
        "kueue.x-k8s.io/podset": "main",
        names.COSCHEDULING_GROUP_LABEL: "another-gang",
        "pod-group.scheduling.sigs.k8s.io": "another-gang",
        "scheduling.volcano.sh/queue-name": "free-queue",
    }
    template = {
        "metadata": {
            "labels": {**joins, "team": "vision", "example.com/kueue.x-k8s.io": "kept"},
            "annotations": {names.VOLCANO_GROUP_ANNOTATION: "another-gang", "note": "kept"},
        }
    }
    pod = pod_for(podTemplate=template)
    labels, annotations = pod["metadata"]["labels"], pod["metadata"]["annotations"]
    assert labels[names.LABEL_JOB_UID] == JOB.uid
    assert not set(joins) - {names.LABEL_JOB_UID} & set(labels)
    assert labels["team"] == "vision" and labels["example.com/kueue.x-k8s.io"] == "kept"
    assert names.VOLCANO_GROUP_ANNOTATION not in annotations and annotations["note"] == "kept"
    # A gang the job itself asks for is the operator's own key, set to the job's group.
    plugins = pod_for(podTemplate=template, scheduling={"schedulerName": "scheduler-plugins-x"})
    assert plugins["metadata"]["labels"][names.COSCHEDULING_GROUP_LABEL] == "job"
