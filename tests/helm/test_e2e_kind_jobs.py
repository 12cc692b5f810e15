"""The jobs `make e2e-kind` submits: every example, shrunk to CPU, still plans and keeps its
strategy (the kind run: docs/local-cluster.md; the same jobs on the real node:
tests/realnode/test_examples.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from helm_support import ROOT
from kind_jobs import shrinker

from meshrun.api.crd import with_defaults
from meshrun.planner.plan import plan_job

pytestmark = pytest.mark.unit

EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
IMAGE = "meshrun/trainer:e2e"


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_every_example_shrinks_to_a_small_cpu_job_with_the_same_strategy(example: Path) -> None:
    source = yaml.safe_load(example.read_text())
    (job,) = shrinker().shrink_files([example], IMAGE)
    spec = job["spec"]
    assert spec["image"] == IMAGE
    # A mixture of experts keeps its experts (the examples' are CPU-sized already).
    model = source["spec"]["model"]
    assert spec["model"] == {"preset": "tiny", **({"moe": model["moe"]} if "moe" in model else {})}
    assert spec["resources"]["accelerator"] == "cpu"
    assert spec["strategy"]["type"] == source["spec"]["strategy"]["type"]
    assert job["metadata"]["name"] == source["metadata"]["name"]
    plan = plan_job(with_defaults(spec), job["metadata"]["name"]).to_dict()
    assert plan["worldSize"] <= 8
    degrees = plan["layout"]
    assert degrees["dp"] * degrees["cp"] * degrees["pp"] * degrees["tp"] == plan["worldSize"]
    strategy = source["spec"]["strategy"]
    if "expertParallel" in strategy:
        assert f"(ep{strategy['expertParallel']})" in plan["layoutString"]
    # Explicit degrees survive, scaled down; none is added or dropped.
    assert spec["strategy"].keys() == source["spec"]["strategy"].keys()
    for key, name in (("contextParallel", "cp"), ("pipelineParallel", "pp")):
        if source["spec"]["strategy"].get(key, 1) > 1:
            assert degrees[name] > 1, f"{example.stem} lost its {key}"


def test_shrinking_recomputes_data_parallel_so_degrees_match_the_world() -> None:
    job: dict[str, Any] = {
        "kind": "ParallelTrainingJob",
        "metadata": {"name": "big"},
        "spec": {
            "resources": {"numNodes": 8, "numProcPerNode": 8},
            "strategy": {
                "type": "hybrid",
                "dataParallel": 2,
                "pipelineParallel": 4,
                "tensorParallel": 8,
            },
        },
    }
    small = shrinker().shrink(job, IMAGE)
    strategy = small["spec"]["strategy"]
    degrees = [strategy[k] for k in ("dataParallel", "pipelineParallel", "tensorParallel")]
    assert degrees == [2, 2, 2]
    assert job["spec"]["strategy"]["tensorParallel"] == 8, "the input must not be modified"
    job["spec"]["strategy"].update(dataParallel=1, contextParallel=4, tensorParallel=4)
    strategy = shrinker().shrink(job, IMAGE)["spec"]["strategy"]
    names = ("dataParallel", "contextParallel", "pipelineParallel", "tensorParallel")
    assert [strategy[k] for k in names] == [1, 2, 2, 2]


def test_shrinking_a_mixture_of_experts_keeps_it_and_an_expert_parallel_degree_that_divides() -> (
    None
):
    job: dict[str, Any] = {
        "kind": "ParallelTrainingJob",
        "metadata": {"name": "experts"},
        "spec": {
            "resources": {"numNodes": 8, "numProcPerNode": 8},
            "strategy": {
                "type": "hybrid",
                "dataParallel": 16,
                "pipelineParallel": 4,
                "tensorParallel": 1,
                "expertParallel": 16,
            },
            "model": {
                "preset": "moe-small",
                "moe": {
                    "experts": 64,
                    "expertsPerToken": 8,
                    "expertFfnHidden": 1408,
                    "sharedExperts": 2,
                    "firstDenseLayers": 5,
                    "router": "sigmoid",
                },
            },
        },
    }
    small = shrinker().shrink(job, IMAGE)
    spec = small["spec"]
    assert spec["model"] == {
        "preset": "tiny",
        "moe": {
            "experts": 8,
            "expertsPerToken": 8,
            "expertFfnHidden": 192,
            "sharedExperts": 2,
            "firstDenseLayers": 3,
            "router": "sigmoid",
        },
    }
    # 8 ranks in 2 stages: ep 16 becomes 4, the largest dividing the 8 experts and a stage's 4.
    assert (spec["strategy"]["dataParallel"], spec["strategy"]["expertParallel"]) == (4, 4)
    plan = plan_job(with_defaults(spec), "experts")
    assert plan.layout.text() == "dp4 x pp2 x tp1 (ep4)"
    assert job["spec"]["model"]["moe"]["experts"] == 64, "the input must not be modified"


@pytest.mark.parametrize("kind", ["ddp", "zero"])
def test_a_data_parallel_only_job_keeps_two_processes_per_pod_on_every_pod(kind: str) -> None:
    job: dict[str, Any] = {
        "kind": "ParallelTrainingJob",
        "metadata": {"name": "wide"},
        "spec": {
            "resources": {"numNodes": 8, "numProcPerNode": 8},
            "strategy": {"type": kind, **({"zeroStage": 3} if kind == "zero" else {})},
        },
    }
    small = shrinker().shrink(job, IMAGE)["spec"]
    assert small["resources"]["numNodes"] == 2 and small["resources"]["numProcPerNode"] == 2
    plan = plan_job(with_defaults(small), "wide").to_dict()
    assert plan["worldSize"] == plan["layout"]["dp"] == 4  # data-parallel within and across pods
    # a layout that splits the model keeps four per pod
    job["spec"]["strategy"] = {"type": "tensor", "tensorParallel": 8}
    assert shrinker().shrink(job, IMAGE)["spec"]["resources"]["numProcPerNode"] == 4
