"""The plan as others read it: ``status.plan``, ``meshrun plan -o json`` and its candidates.

Each report is a dataclass whose fields are its keys, in order (the camelCase of the name, or
``key`` metadata), filled from the plan (or a candidate) by :func:`meshrun.api.read.view_of`:
from the attribute of the field's name, or the ``source`` metadata's path or function. The
writer of the job document, :func:`meshrun.api.read.write_section`, writes them, so a value a
report should show is one field here (and, for ``status.plan``, its key in the CRD's status
schema; tests/core/test_plan_written.py pins the keys).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from meshrun.api.layout import Degrees
from meshrun.planner.ranks import pod_table, rank_table

DEGREES: Any = {"source": "layout.degrees", "inline": True}
"""Metadata of a field showing the degrees by name (dp, cp, pp, tp) as keys of the report itself."""


@dataclass(frozen=True)
class PerGpuBytes:
    """The memory estimate by part, and their total (bytes per accelerator)."""

    params: int
    grads: int
    optimizer: int
    activations: int
    gathered: int
    total: int


@dataclass(frozen=True)
class MemoryReport:
    """``memory``: the estimate of the most loaded accelerator, and whether it fits."""

    per_gpu_bytes: PerGpuBytes = field(metadata={"source": lambda memory: memory})
    accelerator_bytes: int
    fits: bool


@dataclass(frozen=True)
class EstimateReport:
    """``estimate``: the predicted optimizer step (docs/planner.md, "The step-time model")."""

    step_seconds: float = field(metadata={"digits": 6})
    tokens_per_second_per_gpu: float = field(metadata={"digits": 3})
    mfu: float = field(metadata={"digits": 4})
    breakdown: dict[str, float] = field(metadata={"digits": 6})


@dataclass(frozen=True)
class PlanStatus:
    """``status.plan``: the summary the operator writes (the CRD's status schema declares each
    key)."""

    strategy: str
    layout: str = field(metadata={"source": "layout.text"})
    degrees: Degrees = field(metadata=DEGREES)
    zero_stage: int = field(metadata={"source": "layout.zero_stage"})
    micro_batch_size: int = field(metadata={"source": "layout.micro_batch_size"})
    world_size: int
    gpus: int
    memory: MemoryReport
    estimate: EstimateReport | None
    predicted_tokens_per_second: float | None
    explanation: str
    warnings: list[str]


@dataclass(frozen=True)
class LayoutReport:
    """``layout`` of ``meshrun plan -o json``: degrees, schedule, batch split, recomputation."""

    degrees: Degrees = field(metadata=DEGREES)
    zero_stage: int = field(metadata={"source": "layout.zero_stage"})
    pipeline_schedule: str = field(metadata={"source": "layout.schedule"})
    micro_batches: int = field(metadata={"source": "layout.micro_batches"})
    virtual_stages: int = field(metadata={"source": "layout.virtual_stages"})
    grad_accumulation: int = field(metadata={"source": "layout.grad_accumulation"})
    micro_batch_size: int = field(metadata={"source": "layout.micro_batch_size"})
    bubble_fraction: float = field(metadata={"source": "layout.bubble_fraction", "digits": 4})
    activation_checkpointing: str


@dataclass(frozen=True)
class ModelReport:
    """``model`` of ``meshrun plan -o json``: the preset, parameters and sizes."""

    preset: str | None
    parameters: int = field(metadata={"source": "model.parameters"})
    layers: int = field(metadata={"source": "model.layers"})
    hidden: int = field(metadata={"source": "model.hidden"})
    heads: int = field(metadata={"source": "model.heads"})
    kv_heads: int = field(metadata={"source": "model.kv_heads"})
    vocab: int = field(metadata={"source": "model.vocab"})
    seq_len: int = field(metadata={"source": "model.seq_len"})
    ffn_hidden: int = field(metadata={"source": "model.ffn_hidden"})
    mlp: str = field(metadata={"source": "model.mlp"})


@dataclass(frozen=True)
class StageReport:
    """One model chunk: its pipeline rank, its index there, and its layers (inclusive)."""

    pp: int
    virtual: int
    layers: list[int] = field(metadata={"source": lambda stage: [stage.first, stage.last]})


@dataclass(frozen=True)
class PlanReport:
    """``meshrun plan -o json`` (docs/planner.md describes each key)."""

    name: str
    world_size: int
    gpus: int
    num_nodes: int
    num_proc_per_node: int
    accelerator: str
    strategy: str
    layout_string: str = field(metadata={"source": "layout.text"})
    layout: LayoutReport = field(metadata={"source": lambda plan: plan})
    model: ModelReport = field(metadata={"source": lambda plan: plan})
    pods: list[dict[str, Any]] = field(
        metadata={
            "source": lambda plan: pod_table(plan.name, plan.num_nodes, plan.num_proc_per_node)
        }
    )
    ranks: list[dict[str, Any]] = field(
        metadata={"source": lambda plan: rank_table(plan.layout.degrees, plan.num_proc_per_node)}
    )
    stages: list[StageReport]
    memory: MemoryReport
    estimate: EstimateReport | None
    explanation: str
    warnings: list[str]


@dataclass(frozen=True)
class CandidateReport:
    """One entry of ``candidates`` in ``meshrun plan --candidates N -o json``."""

    layout_string: str = field(metadata={"source": "layout.text"})
    strategy: str
    degrees: Degrees = field(metadata=DEGREES)
    zero_stage: int = field(metadata={"source": "layout.zero_stage"})
    pipeline_schedule: str = field(metadata={"source": "layout.schedule"})
    virtual_stages: int = field(metadata={"source": "layout.virtual_stages"})
    micro_batches: int = field(metadata={"source": "layout.micro_batches"})
    micro_batch_size: int = field(metadata={"source": "layout.micro_batch_size"})
    activation_checkpointing: str = field(metadata={"source": "checkpointing"})
    memory_bytes: int = field(metadata={"source": "memory.total"})
    step_seconds: float = field(metadata={"source": "estimate.step_seconds", "digits": 6})
    tokens_per_second_per_gpu: float = field(
        metadata={"source": "estimate.tokens_per_second_per_gpu", "digits": 3}
    )
    mfu: float = field(metadata={"source": "estimate.mfu", "digits": 4})
