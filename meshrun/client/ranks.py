"""Which pod of a job a rank or a pod index is: from the job's ``status.placement`` (a row per
pod with its first and last global rank; beyond 512 pods a row stands for a run of pods), else
from the spec (consecutive ranks share a pod, ``numProcPerNode`` of them). Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from meshrun.client.errors import NotFound
from meshrun.rules.names import pod_name


def pod_of_rank(job: Mapping[str, Any], rank: int) -> str:
    """The name of the pod that runs global ``rank`` of ``job`` (the object as the API server
    returns it). NotFound when the job has no such rank."""
    name = job["metadata"]["name"]
    world = world_size(job)
    if world is not None and not 0 <= rank < world:
        raise NotFound(f"job {name} has ranks 0 to {world - 1}, not {rank}")
    status = job.get("status") or {}
    for row in status.get("placement") or []:
        first, last = row.get("firstRank"), row.get("lastRank")
        if not isinstance(first, int) or not isinstance(last, int) or not first <= rank <= last:
            continue
        if "pod" in row:
            return str(row["pod"])
        start = int(str(row["pods"]).split("-")[0])
        in_run = (last - first + 1) // int(row["count"])
        return pod_name(name, start + (rank - first) // in_run)
    per_pod = ((job.get("spec") or {}).get("resources") or {}).get("numProcPerNode")
    if not isinstance(per_pod, int) or per_pod < 1 or world is None:
        raise NotFound(f"job {name} is not planned yet: its ranks have no pods")
    return pod_name(name, rank // per_pod)


def pod_of_index(job: Mapping[str, Any], index: int) -> str:
    """The name of pod ``index`` of ``job``. NotFound when the job has no such pod."""
    name = job["metadata"]["name"]
    count = pod_count(job)
    if index < 0 or (count is not None and index >= count):
        last = "" if count is None else f" (it has pods 0 to {count - 1})"
        raise NotFound(f"job {name} has no pod {index}{last}")
    return pod_name(name, index)


def world_size(job: Mapping[str, Any]) -> int | None:
    """Processes running now (an elastic job's may differ from its plan's), else the plan's."""
    status = job.get("status") or {}
    for found in (status.get("worldSize"), (status.get("plan") or {}).get("worldSize")):
        if isinstance(found, int) and found > 0:
            return found
    return None


def pod_count(job: Mapping[str, Any]) -> int | None:
    """Pods running now: the world size over processes per pod, else spec.resources.numNodes."""
    resources = (job.get("spec") or {}).get("resources") or {}
    per_pod, world = resources.get("numProcPerNode"), world_size(job)
    if isinstance(per_pod, int) and per_pod > 0 and world is not None:
        return world // per_pod
    nodes = resources.get("numNodes")
    return nodes if isinstance(nodes, int) else None
