"""The Workload a job owns (meshrun_operator.kueue): name, pod sets along pipeline stages, and
the object itself, field by field as Kueue v1beta2 spells it."""

from __future__ import annotations

import re
from typing import Any

import pytest
from kueue_factories import GPU, OWNER, make_plan, make_pod, make_pods, pipeline_spec
from meshrun_operator import kueue, names

from meshrun.api.errors import SpecError
from meshrun.planner.plan import plan_job

pytestmark = pytest.mark.unit

DDP_TRAINING = {"steps": 10, "globalBatchSize": 48, "microBatchSize": 2}
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def request(**overrides: Any) -> kueue.WorkloadRequest:
    values: dict[str, Any] = {
        "job_name": "train",
        "namespace": "ns",
        "uid": "0b7c-uid",
        "queue_name": "team-a",
    }
    return kueue.WorkloadRequest(**{**values, **overrides})


def test_workload_name_reads_like_kueues_own_and_is_unique_per_job() -> None:
    name = kueue.workload_name("train", "uid-1")
    assert re.fullmatch(r"paralleltrainingjob-train-[0-9a-f]{5}", name)
    assert kueue.workload_name("train", "uid-1") == name
    assert kueue.workload_name("train", "uid-2") != name
    assert kueue.workload_name("other", "uid-1") != name


@pytest.mark.parametrize("length", [1, 30, 41, 42, 60, 63])
def test_workload_name_fits_a_label_value_for_any_job_name(length: int) -> None:
    name = kueue.workload_name("j" + "-" * (length - 2) + "b" if length > 1 else "j", "uid")
    assert len(name) <= 63
    assert DNS_LABEL.match(name), name


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        # pp2 over 4 pods: two stages of two pods each.
        (pipeline_spec(4, 8, 2), [("stage-0", (0, 1), (0,)), ("stage-1", (2, 3), (1,))]),
        # Four stages in one pod: one pod set that holds them all.
        (pipeline_spec(1, 4, 4), [("stages-0-3", (0,), (0, 1, 2, 3))]),
        # Pure data parallelism: every pod is stage 0.
        (
            {**pipeline_spec(3, 8, 1), "strategy": {"type": "ddp"}, "training": DDP_TRAINING},
            [("stage-0", (0, 1, 2), (0,))],
        ),
    ],
)
def test_pod_sets_follow_pipeline_stages(
    spec: dict[str, Any], expected: list[tuple[str, tuple[int, ...], tuple[int, ...]]]
) -> None:
    sets = kueue.pod_sets(plan_job(spec, name="train"))
    assert [(s.name, s.pod_indices, s.stages) for s in sets] == expected
    assert all(s.pods_per_stage is None for s in sets)


def test_more_than_eight_stages_merge_into_eight_pod_sets_of_whole_stages() -> None:
    spec = pipeline_spec(16, 8, 16)
    spec["strategy"] = {"type": "hybrid", "dataParallel": 1, "pipelineParallel": 16}
    spec["strategy"]["tensorParallel"] = 8
    spec["model"] = {"preset": "70b"}
    sets = kueue.pod_sets(plan_job(spec, name="train"))
    assert len(sets) == kueue.MAX_POD_SETS
    assert [s.name for s in sets][:2] == ["stages-0-1", "stages-2-3"]
    assert [s.pod_indices for s in sets][-1] == (14, 15)
    assert {s.pods_per_stage for s in sets} == {1}
    assert kueue.pod_set_of(sets, 5).name == "stages-4-5"
    with pytest.raises(KeyError):
        kueue.pod_set_of(sets, 16)


def test_the_workload_has_one_pod_set_per_stage_with_count_and_per_pod_requests() -> None:
    workload = kueue.build_workload(request(), make_plan(), make_pods(4), OWNER)
    assert workload["apiVersion"] == "kueue.x-k8s.io/v1beta2"
    assert workload["kind"] == "Workload"
    assert workload["metadata"]["name"] == kueue.workload_name("train", "0b7c-uid")
    assert workload["metadata"]["namespace"] == "ns"
    assert workload["metadata"]["ownerReferences"] == [OWNER]
    assert "finalizers" not in workload["metadata"]
    labels = workload["metadata"]["labels"]
    assert labels[names.LABEL_JOB] == "train"
    assert labels["kueue.x-k8s.io/job-uid"] == "0b7c-uid"
    assert labels["kueue.x-k8s.io/queue-name"] == "team-a"
    spec = workload["spec"]
    assert spec["queueName"] == "team-a"
    assert [(p["name"], p["count"]) for p in spec["podSets"]] == [("stage-0", 2), ("stage-1", 2)]
    container = spec["podSets"][0]["template"]["spec"]["containers"][0]
    assert container == {
        "name": names.TRAINER_CONTAINER,
        "image": "meshrun/trainer:test",
        "resources": {
            "requests": {GPU: "8", "cpu": "4", "memory": "16Gi"},
            "limits": {GPU: "8"},
        },
    }
    # Nothing that differs between attempts (env) or does not matter to admission.
    template = spec["podSets"][0]["template"]["spec"]
    assert set(template) == {"containers"}
    assert "priorityClassRef" not in spec and "priority" not in spec
    assert "topologyRequest" not in spec["podSets"][0]


def test_scheduling_constraints_of_the_pods_go_into_the_template() -> None:
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}}}
    pods = make_pods(
        4,
        nodeSelector={"nvidia.com/gpu.product": "NVIDIA-H200"},
        tolerations=[{"key": GPU, "operator": "Exists"}],
        affinity=affinity,
        priorityClassName="training",
        initContainers=[
            {"name": "fetch", "image": "busybox", "env": [], "restartPolicy": "Always"}
        ],
    )
    template = kueue.build_workload(request(), make_plan(), pods, OWNER)["spec"]["podSets"][1]
    spec = template["template"]["spec"]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H200"}
    assert spec["tolerations"] == [{"key": GPU, "operator": "Exists"}]
    assert spec["affinity"] == affinity
    assert spec["priorityClassName"] == "training"
    assert spec["initContainers"] == [
        {"name": "fetch", "image": "busybox", "restartPolicy": "Always"}
    ]
    # The template is a copy: changing the pods afterwards does not change the Workload.
    pods[2]["spec"]["nodeSelector"]["x"] = "y"
    assert "x" not in spec["nodeSelector"]


def test_priority_class_and_value_and_a_topology_request_per_pod_set() -> None:
    topology = kueue.TopologyRequest("topology.meshrun.dev/rack", required=True)
    req = request(priority_class="high", priority=1000, topology=topology)
    spec = kueue.build_workload(req, make_plan(), make_pods(4), OWNER)["spec"]
    assert spec["priorityClassRef"] == {
        "group": "kueue.x-k8s.io",
        "kind": "WorkloadPriorityClass",
        "name": "high",
    }
    assert spec["priority"] == 1000
    assert [p["topologyRequest"] for p in spec["podSets"]] == [
        {"required": "topology.meshrun.dev/rack"},
        {"required": "topology.meshrun.dev/rack"},
    ]
    preferred = request(topology=kueue.TopologyRequest("topology.meshrun.dev/rack"))
    spec = kueue.build_workload(preferred, make_plan(), make_pods(4), OWNER)["spec"]
    assert spec["podSets"][0]["topologyRequest"] == {"preferred": "topology.meshrun.dev/rack"}


def test_merged_stages_ask_for_one_domain_per_stage_slice() -> None:
    spec = pipeline_spec(16, 8, 16)
    spec["strategy"] = {"type": "hybrid", "dataParallel": 1, "pipelineParallel": 16}
    spec["strategy"]["tensorParallel"] = 8
    spec["model"] = {"preset": "70b"}
    topology = kueue.TopologyRequest("topology.meshrun.dev/rack", required=True)
    workload = kueue.build_workload(
        request(topology=topology), plan_job(spec, name="train"), make_pods(16), OWNER
    )
    assert len(workload["spec"]["podSets"]) == 8
    assert workload["spec"]["podSets"][0]["topologyRequest"] == {
        "podSetSliceRequiredTopology": "topology.meshrun.dev/rack",
        "podSetSliceSize": 1,
    }


def test_a_missing_pod_or_queue_is_refused_with_the_reason() -> None:
    # The first pod of each pod set (stages of pods 0-1 and 2-3) is what the Workload needs.
    without_2 = [p for p in make_pods(4) if p["metadata"]["labels"][names.LABEL_POD_INDEX] != "2"]
    with pytest.raises(ValueError, match=r"no pod built for indices \[2\]"):
        kueue.build_workload(request(), make_plan(), without_2, OWNER)
    firsts = [make_pod(0), make_pod(2)]
    built = kueue.build_workload(request(), make_plan(), firsts, OWNER)
    whole = kueue.build_workload(request(), make_plan(), make_pods(4), OWNER)
    assert built == whole  # the same Workload from two pods as from the whole gang
    with pytest.raises(SpecError) as error:
        kueue.build_workload(request(queue_name=""), make_plan(), make_pods(4), OWNER)
    assert error.value.field == "spec.scheduling.queueName"


def test_an_elastic_job_of_one_pod_set_may_be_admitted_partially() -> None:
    from meshrun_operator.lifecycle.elastic import admission_floor

    from meshrun.api.read import read_spec

    spec = {
        **pipeline_spec(4, 8, 1),
        "strategy": {"type": "ddp"},
        "training": {"steps": 10, "globalBatchSize": 64, "microBatchSize": 1},
        "elastic": {"minDataParallel": 16},
    }
    plan = plan_job(spec, "train")
    floor = admission_floor(read_spec(spec), plan)
    assert floor == 2  # dp16: 2 pods of 8 GPUs
    workload = kueue.build_workload(request(min_count=floor), plan, make_pods(4), OWNER)
    (pod_set,) = workload["spec"]["podSets"]
    assert (pod_set["count"], pod_set["minCount"]) == (4, 2)
    # Without spec.elastic the Workload is all or nothing: Kueue admits 4 pods or none.
    rigid = {k: v for k, v in spec.items() if k != "elastic"}
    assert admission_floor(read_spec(rigid), plan_job(rigid, "train")) is None
    plain = kueue.build_workload(request(), plan, make_pods(4), OWNER)
    assert "minCount" not in plain["spec"]["podSets"][0]
    # Pipeline stages are pod sets of their own, which Kueue would reduce each on its own.
    staged = {**pipeline_spec(4, 8, 2), "elastic": {"minDataParallel": 8}}
    assert admission_floor(read_spec(staged), plan_job(staged, "train")) is None
