"""Plans, pods and Workloads as plain data for the Kueue tests (unit and cluster)."""

from __future__ import annotations

import copy
from typing import Any

from meshrun_operator import names

from meshrun.api.crd import API_VERSION, KIND
from meshrun.planner.plan import Plan, plan_job

GPU = "nvidia.com/gpu"
OWNER = {
    "apiVersion": API_VERSION,
    "kind": KIND,
    "name": "train",
    "uid": "0b7c-uid",
    "controller": True,
    "blockOwnerDeletion": True,
}


def pipeline_spec(num_nodes: int = 4, per_node: int = 8, pp: int = 2) -> dict[str, Any]:
    """A pipeline job: ``pp`` stages over ``num_nodes`` pods of ``per_node`` GPUs."""
    return {
        "image": "meshrun/trainer:test",
        "resources": {"numNodes": num_nodes, "numProcPerNode": per_node},
        "strategy": {"type": "pipeline", "pipelineParallel": pp},
        "model": {"preset": "1b"},
        "training": {"steps": 10, "globalBatchSize": 64, "microBatchSize": 1},
    }


def make_plan(**overrides: Any) -> Plan:
    return plan_job(pipeline_spec(**overrides), name="train")


def make_pod(index: int, gpus: int = 8, **spec_extra: Any) -> dict[str, Any]:
    """A pod as the operator builds it, reduced to what the Workload tests look at."""
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [
            {
                "name": names.TRAINER_CONTAINER,
                "image": "meshrun/trainer:test",
                "command": ["python", "-m", "meshrun_trainer"],
                "env": [{"name": "MESHRUN_ATTEMPT", "value": "3"}],
                "resources": {
                    "requests": {GPU: str(gpus), "cpu": "4", "memory": "16Gi"},
                    "limits": {GPU: str(gpus)},
                },
                "volumeMounts": [{"name": "meshrun-checkpoints", "mountPath": "/checkpoints"}],
            }
        ],
        "volumes": [{"name": "meshrun-checkpoints", "emptyDir": {}}],
        **copy.deepcopy(spec_extra),
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"train-{index}",
            "namespace": "ns",
            "labels": {names.LABEL_JOB: "train", names.LABEL_POD_INDEX: str(index)},
        },
        "spec": spec,
    }


def make_pods(count: int, gpus: int = 8, **spec_extra: Any) -> list[dict[str, Any]]:
    return [make_pod(i, gpus, **spec_extra) for i in range(count)]


def condition(kind: str, status: bool, reason: str, message: str = "") -> dict[str, Any]:
    return {
        "type": kind,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message,
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }


def make_workload(
    *conditions: dict[str, Any],
    admission: dict[str, Any] | None = None,
    pod_sets: list[dict[str, Any]] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """A Workload object as Kueue leaves it: ``conditions`` and ``admission`` in its status."""
    status: dict[str, Any] = {"conditions": list(conditions)}
    if admission is not None:
        status["admission"] = admission
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {
            "name": "paralleltrainingjob-train-1a2b3",
            "namespace": "ns",
            "resourceVersion": "42",
            "generation": 1,
        },
        "spec": {"queueName": "team-a", "podSets": pod_sets or [], **spec},
        "status": status,
    }
