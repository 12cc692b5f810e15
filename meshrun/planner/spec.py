"""Typed views of a defaulted job spec: what the planner reads, checked field by field."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from meshrun.api import validate_spec, with_defaults
from meshrun.errors import SpecError
from meshrun.presets import PRESETS, ModelShape

GIB = 1024**3
DEFAULT_GPU_MEMORY_GIB = 80
"""Assumed accelerator memory when a GPU job gives none (A100/H100 80 GB class)."""


@dataclass(frozen=True)
class Resources:
    """spec.resources."""

    num_nodes: int
    """Pods in the job, one per node."""
    proc_per_node: int
    """Processes per pod, one per accelerator."""
    accelerator: str
    """``nvidia.com/gpu`` or ``cpu``."""
    accelerator_bytes: int
    """Memory of one accelerator in bytes; 0 means unknown (CPU without a size: no check)."""
    memory_assumed: bool
    """True when acceleratorMemoryGiB was unset and a GPU default is assumed."""
    fast_intra_node: bool
    """NVLink/NVSwitch between the accelerators of a node (false for PCIe)."""
    fast_inter_node: bool
    """InfiniBand-class network between nodes (false for Ethernet)."""

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.proc_per_node


@dataclass(frozen=True)
class Strategy:
    """spec.strategy, with unset degrees as None."""

    type: str
    """auto, ddp, zero, pipeline, tensor or hybrid."""
    zero_stage: int | None
    """ZeRO stage 0-3, or None when unset."""
    dp: int | None
    """Data-parallel degree, or None to derive."""
    pp: int | None
    """Pipeline stages, or None to derive."""
    tp: int | None
    """Tensor-parallel degree, or None to derive."""
    schedule: str
    """gpipe, 1f1b or interleaved-1f1b."""
    micro_batches: int | None
    """Micro-batches per pipeline step, or None to derive from the batch sizes."""
    virtual_stages: int | None
    """Model chunks per pipeline rank, or None for the schedule's default."""


@dataclass(frozen=True)
class Training:
    """spec.training fields the planner needs."""

    global_batch: int
    """Sequences per optimizer step over all data-parallel ranks."""
    micro_batch: int
    """Sequences per forward pass on one rank."""
    precision: str
    """bf16 or fp32."""
    dataset: str | None
    """synthetic, corpus, or None for the trainer's choice."""


@dataclass(frozen=True)
class JobSpec:
    """The parts of a ParallelTrainingJob spec that decide the layout."""

    resources: Resources
    """The machines."""
    strategy: Strategy
    """The requested strategy."""
    training: Training
    """Batch sizes and precision."""
    model: ModelShape
    """The resolved model shape."""
    preset: str | None
    """The preset name the shape came from, if any."""


def parse_spec(spec: Mapping[str, Any]) -> JobSpec:
    """Validate ``spec`` against the CRD schema, apply its defaults and read it into types."""
    validate_spec(spec)
    full = with_defaults(spec)
    res, strat, train = full["resources"], full["strategy"], full["training"]
    is_cpu = res["accelerator"] == "cpu"
    gib = res.get("acceleratorMemoryGiB", 0 if is_cpu else DEFAULT_GPU_MEMORY_GIB)
    resources = Resources(
        num_nodes=res["numNodes"],
        proc_per_node=res["numProcPerNode"],
        accelerator=res["accelerator"],
        accelerator_bytes=gib * GIB,
        memory_assumed=not is_cpu and "acceleratorMemoryGiB" not in res,
        fast_intra_node=res["interconnect"]["intraNode"] == "nvlink",
        fast_inter_node=res["interconnect"]["interNode"] == "infiniband",
    )
    strategy = Strategy(
        type=strat["type"],
        zero_stage=strat.get("zeroStage"),
        dp=strat.get("dataParallel"),
        pp=strat.get("pipelineParallel"),
        tp=strat.get("tensorParallel"),
        schedule=strat["pipelineSchedule"],
        micro_batches=strat.get("microBatches"),
        virtual_stages=strat.get("virtualStages"),
    )
    training = Training(
        global_batch=train["globalBatchSize"],
        micro_batch=train["microBatchSize"],
        precision=train["precision"],
        dataset=train.get("dataset"),
    )
    preset, model = resolve_model(full["model"])
    return JobSpec(resources, strategy, training, model, preset)


def resolve_model(model: Mapping[str, Any]) -> tuple[str | None, ModelShape]:
    """The model shape: a preset with any explicit field overriding it, or explicit fields."""
    preset = model.get("preset")
    if preset is not None:
        base = PRESETS[preset]
    else:
        needed = ("layers", "hidden", "heads", "vocab", "seqLen")
        missing = [name for name in needed if name not in model]
        if missing:
            raise SpecError(
                "spec.model",
                f"needs a preset or all of layers, hidden, heads, vocab and seqLen "
                f"(missing {', '.join(missing)})",
            )
        hidden = model["hidden"]
        base = ModelShape(
            layers=model["layers"],
            hidden=hidden,
            heads=model["heads"],
            vocab=model["vocab"],
            seq_len=model["seqLen"],
            ffn_hidden=default_ffn_hidden(hidden),
            kv_heads=model["heads"],
        )
    overrides = {
        "layers": model.get("layers"),
        "hidden": model.get("hidden"),
        "heads": model.get("heads"),
        "vocab": model.get("vocab"),
        "seq_len": model.get("seqLen"),
        "ffn_hidden": model.get("ffnHidden"),
        "kv_heads": model.get("kvHeads"),
    }
    shape = dataclasses.replace(base, **{k: v for k, v in overrides.items() if v is not None})
    if preset is None and "kvHeads" not in model:
        shape = dataclasses.replace(shape, kv_heads=shape.heads)
    if shape.hidden % shape.heads:
        raise SpecError(
            "spec.model.heads", f"{shape.heads} must divide spec.model.hidden={shape.hidden}"
        )
    if shape.kv_heads > shape.heads or shape.heads % shape.kv_heads:
        raise SpecError(
            "spec.model.kvHeads", f"{shape.kv_heads} must divide spec.model.heads={shape.heads}"
        )
    return preset, shape


def default_ffn_hidden(hidden: int) -> int:
    """SwiGLU width 2/3 x 4h rounded up to a multiple of 256, as Llama does (Touvron 2023)."""
    return -(-(8 * hidden // 3) // 256) * 256
