"""One set of rules: a spec the planner accepts starts every trainer without a configuration error.

Specs come from hypothesis, valid or not; each one the planner accepts is turned into every
pod's environment by the env contract and read back by the trainer's own configuration check
(no processes). The trainer must agree with the plan on every value it reads.
"""

from __future__ import annotations

import functools
import json
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from meshrun_trainer.config.read import read_job

from meshrun.api.errors import SpecError
from meshrun.envcontract import pod_env
from meshrun.files.checks import read_with_files
from meshrun.files.hf import load_hf_model
from meshrun.planner.elastic import elastic_degrees, resized
from meshrun.planner.plan import plan_job

pytestmark = pytest.mark.unit


@st.composite
def models(draw: st.DrawFn) -> dict[str, Any]:
    """A preset, a preset with overrides, or explicit sizes (odd head sizes included)."""
    sizes: dict[str, Any] = {}
    heads = draw(st.sampled_from([1, 2, 3, 4, 8]))
    if draw(st.integers(0, 3)) == 0:
        sizes["heads"] = heads
        sizes["hidden"] = heads * draw(st.sampled_from([2, 3, 4, 8, 16]))
    if draw(st.integers(0, 3)) == 0:
        sizes["kvHeads"] = draw(st.sampled_from([1, 2, 4]))
    for key, values in (
        ("layers", [1, 2, 3, 4, 8]),
        ("vocab", [64, 128, 256, 260, 512]),
        ("seqLen", [8, 16, 30, 32, 64, 100]),
        ("ffnHidden", [24, 48, 64, 96, 192]),
    ):
        if draw(st.integers(0, 3)) == 0:
            sizes[key] = draw(st.sampled_from(values))
    if draw(st.booleans()):
        return {"preset": "tiny", **sizes}
    return {"layers": 2, "hidden": 32, "heads": 4, "vocab": 256, "seqLen": 32, **sizes}


HF_CONFIGS: dict[str, dict[str, Any]] = {
    "llama": {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2},
    "qwen2": {"hidden_size": 48, "num_attention_heads": 4, "tie_word_embeddings": True},
    "mistral": {"hidden_size": 64, "num_attention_heads": 8, "sliding_window": 4096},
}
"""Small config.json files of each architecture (no weights: the plan needs only the config)."""


@functools.cache
def hf_folder(kind: str) -> str:
    folder = Path(tempfile.mkdtemp(prefix=f"meshrun-prop-{kind}-"))
    config = {
        "model_type": kind,
        "num_hidden_layers": 3,
        "intermediate_size": 96,
        "vocab_size": 256,
        "rms_norm_eps": 1e-6,
        **HF_CONFIGS[kind],
    }
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


@st.composite
def own_parts(draw: st.DrawFn, model: dict[str, Any], training: dict[str, Any]) -> dict[str, Any]:
    """A Hugging Face folder (sizes beside it sometimes, not always right) with text data, or
    token data, or neither; an optimizer, a schedule and an export sometimes. Returns the model
    and adds to ``training``."""
    kind = draw(st.sampled_from(["none", "hf", "hf", "tokens"]))
    if kind == "hf":
        arch = draw(st.sampled_from(sorted(HF_CONFIGS)))
        model = {"hf": {"path": hf_folder(arch)}, "seqLen": draw(st.sampled_from([8, 16, 32]))}
        if draw(st.integers(0, 3)) == 0:
            model["layers"] = draw(st.sampled_from([3, 4]))
        data: dict[str, Any] = {"path": "/data/train.jsonl"}
        if draw(st.booleans()):
            data["validation"] = {"path": "/data/val.jsonl"}
            data["evalEverySteps"] = draw(st.integers(0, 5))
        training["data"] = data
    elif kind == "tokens":
        training["data"] = {"format": "tokens", "path": "/data/train.u16"}
    if draw(st.booleans()):
        betas = draw(st.lists(st.floats(0, 0.999), min_size=2, max_size=2))
        training["optimizer"] = {"betas": betas, "weightDecay": draw(st.floats(0, 1))}
    if draw(st.booleans()):
        training["lrSchedule"] = {
            "warmupSteps": draw(st.integers(0, 150)),
            "decay": draw(st.sampled_from(["constant", "cosine", "linear"])),
            "minRatio": draw(st.floats(0, 1)),
        }
    if draw(st.booleans()):
        training["export"] = {"path": "/out/model"}
    return model


@st.composite
def strategies(draw: st.DrawFn, world: int, procs: int) -> dict[str, Any]:
    """A strategy with degrees that fit the machines (mostly), or any degrees at all."""
    kind = draw(st.sampled_from(["auto", "ddp", "zero", "pipeline", "tensor", "hybrid"]))
    strategy: dict[str, Any] = {"type": kind}
    tp = draw(st.sampled_from([t for t in (1, 2, 4, 8) if procs % t == 0]))
    pp = draw(st.sampled_from([p for p in (1, 2, 4) if (world // tp) % p == 0]))
    fitting = {"tensorParallel": tp, "pipelineParallel": pp, "dataParallel": world // (tp * pp)}
    if kind in ("pipeline", "tensor", "hybrid"):
        for key, value in fitting.items():
            if draw(st.booleans()):
                strategy[key] = value if draw(st.integers(0, 4)) else draw(st.sampled_from([2, 3]))
    if kind != "auto" and draw(st.booleans()):
        strategy["zeroStage"] = draw(st.integers(0 if kind != "zero" else 1, 3))
    strategy["pipelineSchedule"] = draw(st.sampled_from(["gpipe", "1f1b", "interleaved-1f1b"]))
    for key, values in (("microBatches", [1, 2, 4, 8]), ("virtualStages", [2, 3])):
        if draw(st.integers(0, 3)) == 0:
            strategy[key] = draw(st.sampled_from(values))
    return strategy


@st.composite
def specs(draw: st.DrawFn) -> dict[str, Any]:
    """A job on up to 4 pods x 8 processes with any strategy type."""
    nodes, procs = draw(st.integers(1, 4)), draw(st.sampled_from([1, 2, 4, 8]))
    micro_batch = draw(st.sampled_from([1, 2]))
    training: dict[str, Any] = {
        "globalBatchSize": micro_batch * draw(st.sampled_from([1, 3, 8, 16, 32, 64])),
        "microBatchSize": micro_batch,
        "precision": draw(st.sampled_from(["bf16", "fp32"])),
    }
    dataset = draw(st.sampled_from([None, "synthetic", "corpus"]))
    if dataset:
        training["dataset"] = dataset
    checkpointing = draw(st.sampled_from([None, "none", "selective", "full"]))
    if checkpointing:
        training["activationCheckpointing"] = checkpointing
    training["compile"] = draw(st.booleans())
    model = draw(models())
    model = draw(own_parts(model, training))
    spec: dict[str, Any] = {
        "image": "trainer:1",
        "resources": {
            "numNodes": nodes,
            "numProcPerNode": procs,
            "accelerator": draw(st.sampled_from(["cpu", "nvidia.com/gpu"])),
        },
        "strategy": draw(strategies(nodes * procs, procs)),
        "model": model,
        "training": training,
    }
    if draw(st.integers(0, 3)) == 0:
        elastic = {"minDataParallel": draw(st.sampled_from([1, 2, 3]))}
        if draw(st.booleans()):
            elastic["maxDataParallel"] = draw(st.sampled_from([2, 4, 8, 16]))
        spec["elastic"] = elastic
    return spec


@settings(max_examples=400, deadline=None)
@given(specs())
def test_an_accepted_spec_starts_every_trainer(spec: dict[str, Any]) -> None:
    try:
        job = read_with_files(spec)
        plan = plan_job(job, "prop")
    except SpecError as error:
        event(f"refused: {error.field}")
        return
    event("accepted" + (" (hf)" if job.model.hf else " (data)" if job.training.data else ""))
    for index in {0, job.resources.num_nodes - 1}:
        env = pod_env(plan, job, job_name="prop", namespace="ns", pod_index=index, master_addr="m")
        trained = read_job(env)  # raises SpecError if the trainer would refuse it
        assert trained.plan == plan and trained.pod.index == index
        assert trained.spec == replace(job, pod_template=None, command=None, args=None)
        if job.model.hf is not None:  # the architecture from config.json, the sizes planned
            assert load_hf_model(job.model.hf.path, plan.model.seq_len).shape == plan.model
        ranges = trained.plan.stage_layers
        assert len(ranges) == plan.layout.num_stages and ranges[-1][1] == plan.model.layers - 1
    # An elastic job's every allowed degree starts its trainers too, with the same TP, PP,
    # global batch and micro-batch size.
    for dp in elastic_degrees(job, plan):
        event("elastic degree")
        sized, at = resized(job, plan, dp)
        env = pod_env(at, sized, job_name="prop", namespace="ns", pod_index=0, master_addr="m")
        layout = read_job(env).plan.layout
        assert (layout.dp, layout.pp, layout.tp) == (dp, plan.layout.pp, plan.layout.tp)
        assert layout.world_size == at.world_size == sized.resources.world_size
        assert sized.training.global_batch_size == job.training.global_batch_size
        assert at.layout.micro_batch_size == plan.layout.micro_batch_size


TP8_SEQ100 = {
    "image": "trainer:1",
    "resources": {"numNodes": 1, "numProcPerNode": 8},
    "strategy": {"type": "tensor", "tensorParallel": 8},
    "model": {"layers": 2, "hidden": 512, "heads": 8, "vocab": 32000, "seqLen": 100},
}


def test_a_job_its_trainers_would_refuse_is_refused_at_plan_time() -> None:
    with pytest.raises(SpecError) as caught:
        plan_job(TP8_SEQ100)
    assert caught.value.field == "spec.strategy.tensorParallel"
    assert "(8 does not divide seqLen=100)" in caught.value.rule


def test_the_operator_marks_it_invalid_with_the_same_rule() -> None:
    from meshrun_operator.lifecycle.evaluation import evaluate

    ev = evaluate(TP8_SEQ100, "tp8")
    assert ev.error is not None and ev.plan is None
    assert ev.error.field == "spec.strategy.tensorParallel"
    assert "(8 does not divide seqLen=100)" in ev.error.rule
