"""The typed sections of a spec that name the job's own things: a Hugging Face model folder
(``spec.model.hf``), its data (``spec.training.data``), the optimizer, the learning-rate
schedule and the export folder; and the interconnect of ``spec.resources``.

Read by :func:`meshrun.api.read.read_spec` like every other section (kw_only dataclasses whose
field names are the snake_case of the CRD's keys, no defaults of their own).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

DataFormat = Literal["jsonl", "parquet", "arrow", "tokens"]
LRDecay = Literal["constant", "cosine", "linear"]


@dataclass(frozen=True, kw_only=True)
class HuggingFace:
    """``spec.model.hf``: a Hugging Face model folder."""

    path: str
    """The folder with config.json, optional *.safetensors and tokenizer.json."""


@dataclass(frozen=True, kw_only=True)
class Validation:
    """``spec.training.data.validation``: held-out data."""

    path: str
    """The validation file or arrow folder, in the training data's format."""


@dataclass(frozen=True, kw_only=True)
class Data:
    """``spec.training.data``: the job's own training data."""

    format: DataFormat
    """jsonl, parquet, arrow (a save_to_disk folder) or tokens (token ids)."""
    path: str
    """The training file or arrow folder."""
    text_field: str
    """The field holding each document's text (not read for tokens)."""
    validation: Validation | None
    """Held-out data, or None."""
    eval_every_steps: int
    """Evaluate every this many steps; 0 only before the first and after the last."""


@dataclass(frozen=True, kw_only=True)
class Optimizer:
    """``spec.training.optimizer``: AdamW's settings (the peak learning rate is learningRate)."""

    betas: list[float]
    """AdamW's beta1 and beta2."""
    weight_decay: float
    """Decoupled weight decay."""


@dataclass(frozen=True, kw_only=True)
class LRSchedule:
    """``spec.training.lrSchedule``: linear warmup, then a decay to ``min_ratio`` x the peak."""

    warmup_steps: int
    """Steps of linear warmup from 0 (step k of them runs at k / warmup_steps of the peak)."""
    decay: LRDecay
    """constant, cosine (Loshchilov and Hutter 2017) or linear, over the steps after warmup."""
    min_ratio: float
    """Floor of the decay as a fraction of the peak learning rate."""


@dataclass(frozen=True, kw_only=True)
class Export:
    """``spec.training.export``: the trained model as a Hugging Face folder."""

    path: str
    """The folder to write at the end."""


@dataclass(frozen=True, kw_only=True)
class Interconnect:
    """``spec.resources.interconnect``: how the processes talk (``key``: the CRD key where it is
    not the camelCase of the name, as meshrun.api.spec.crd_key writes it)."""

    intra_node: Literal["nvlink", "pcie"]
    """Links between the accelerators of one node."""
    inter_node: Literal["infiniband", "ethernet"]
    """Network between nodes (infiniband counts as fast)."""
    intra_node_gbps: float | None = field(metadata={"key": "intraNodeGBps"})
    """GB/s per accelerator and direction inside a node; None: the product's (intra_node)."""
    inter_node_gbps: float | None = field(metadata={"key": "interNodeGbps"})
    """Gb/s of network per accelerator; None: the product's usual one (inter_node)."""
