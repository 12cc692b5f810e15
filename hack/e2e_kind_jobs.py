"""Shrink examples/*.yaml into jobs a CPU-only kind cluster can finish in a minute or two.

The examples describe GPU clusters (up to 8 pods x 8 GPUs, 70b models, 1000 steps). On kind
(no GPUs, a CI runner's few cores) each keeps its strategy and its shape of parallelism but runs
the ``tiny`` preset on CPU processes for a few steps: at most MAX_NODES pods of MAX_PROCS
processes (DATA_PARALLEL_PROCS for a data-parallel-only job), every explicit degree capped at 2
and the data-parallel degree recomputed so the degrees still multiply to the world size (the
CRD's CEL rule). A mixture of experts keeps its ``spec.model.moe`` on the tiny model, at most
MAX_EXPERTS experts of tiny's width, and its expert-parallel degree where it still divides the
experts and a pipeline stage's ranks (else the largest that does).

    python hack/e2e_kind_jobs.py IMAGE examples/*.yaml > jobs.yaml
"""

from __future__ import annotations

import copy
import math
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

MAX_NODES = 2
"""Pods per job: kind runs them all on one or two Docker containers."""
MAX_PROCS = 4
"""Processes per pod (gloo on CPU; a GitHub runner has 4 cores)."""
DATA_PARALLEL_PROCS = 2
"""Processes per pod of a job that is data-parallel only (``ddp``, ``zero``): two per pod keep
what it checks (every collective within a pod and across pods, each ZeRO shard on a process of
its own) with half the processes of four."""
MAX_DEGREE = 2
"""Cap of the explicit tensor, pipeline and context degrees (tiny has 4 layers and 4 heads; its
64-token sequences split into 2 x cp chunks)."""
STEPS = 6
"""Training steps: enough for a checkpoint, the progress report and a clean exit."""
MAX_EXPERTS = 8
"""Routed experts per MoE layer."""
TINY_FFN, TINY_LAYERS = 192, 4
"""The tiny preset's MLP width and layers (an expert's width and the dense layers are capped)."""


def shrink_experts(moe: dict[str, Any]) -> dict[str, Any]:
    """``spec.model.moe`` on the tiny model: at most MAX_EXPERTS experts of at most tiny's width,
    the other fields kept where tiny holds them."""
    small = dict(moe)
    experts = small["experts"] = min(int(moe.get("experts", MAX_EXPERTS)), MAX_EXPERTS)
    if "expertsPerToken" in moe:
        small["expertsPerToken"] = min(int(moe["expertsPerToken"]), experts)
    if "expertFfnHidden" in moe:
        small["expertFfnHidden"] = min(int(moe["expertFfnHidden"]), TINY_FFN)
    if "firstDenseLayers" in moe:
        small["firstDenseLayers"] = min(int(moe["firstDenseLayers"]), TINY_LAYERS - 1)
    return small


def shrink(job: dict[str, Any], image: str) -> dict[str, Any]:
    """A CPU-sized copy of ``job`` with the same strategy type; ``job`` is not modified."""
    small = copy.deepcopy(job)
    spec = small["spec"]
    spec["image"] = image
    resources = spec.setdefault("resources", {})
    nodes = min(int(resources.get("numNodes", 1)), MAX_NODES)
    strategy = spec.setdefault("strategy", {})
    cap = DATA_PARALLEL_PROCS if strategy.get("type") in ("ddp", "zero") else MAX_PROCS
    procs = min(int(resources.get("numProcPerNode", 1)), cap)
    resources.update(numNodes=nodes, numProcPerNode=procs, accelerator="cpu")
    resources.pop("acceleratorMemoryGiB", None)
    resources.pop("acceleratorProduct", None)  # a GPU product; these pods run on CPUs
    tp = min(int(strategy.get("tensorParallel", 1)), MAX_DEGREE, procs)
    pp = min(int(strategy.get("pipelineParallel", 1)), MAX_DEGREE)
    cp = min(int(strategy.get("contextParallel", 1)), MAX_DEGREE)
    if "tensorParallel" in strategy:
        strategy["tensorParallel"] = tp
    if "pipelineParallel" in strategy:
        strategy["pipelineParallel"] = pp
    if "contextParallel" in strategy:
        strategy["contextParallel"] = cp
    if "dataParallel" in strategy:
        strategy["dataParallel"] = nodes * procs // (tp * pp * cp)
    if "virtualStages" in strategy:
        strategy["virtualStages"] = min(int(strategy["virtualStages"]), 2)
    if "microBatches" in strategy:
        strategy["microBatches"] = min(int(strategy["microBatches"]), 4)
    if "hf" in spec.get("model", {}):
        # kind has no volumes with the model folder and the data: tiny on the built-in data.
        spec.pop("podTemplate", None)
        for own in ("data", "export"):
            spec.get("training", {}).pop(own, None)
    moe = spec.get("model", {}).get("moe")
    if moe is None and "expertParallel" in strategy:
        moe = {}  # a MoE preset's experts
    spec["model"] = {"preset": "tiny"}
    if moe is not None:
        spec["model"]["moe"] = shrink_experts(moe)
        if "expertTensorParallel" in strategy:
            strategy["expertTensorParallel"] = min(int(strategy["expertTensorParallel"]), tp)
        if "expertParallel" in strategy:
            stage = nodes * procs // pp // int(strategy.get("expertTensorParallel", 1))
            ep = math.gcd(int(strategy["expertParallel"]), spec["model"]["moe"]["experts"], stage)
            strategy["expertParallel"] = ep
    training = spec.setdefault("training", {})
    training.update(steps=STEPS, microBatchSize=1, globalBatchSize=16, precision="fp32")
    training.pop("checkpoint", None)
    return small


def shrink_files(paths: Iterable[Path], image: str) -> list[dict[str, Any]]:
    jobs = []
    for path in paths:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "ParallelTrainingJob":
                jobs.append(shrink(doc, image))
    return jobs


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: e2e_kind_jobs.py IMAGE EXAMPLE.yaml...", file=sys.stderr)
        return 2
    jobs = shrink_files((Path(p) for p in argv[1:]), argv[0])
    yaml.safe_dump_all(jobs, sys.stdout, sort_keys=False)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
