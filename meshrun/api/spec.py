"""The one typed reading of a ParallelTrainingJob spec, with the CRD's defaults applied.

Each section of the CRD's ``spec`` is a kw_only dataclass below whose field names are the
snake_case of the CRD's keys (``numProcPerNode`` is ``num_proc_per_node``; ``key`` metadata
names the few irregular ones). None of them has a default of its own: :func:`read_spec` checks
the spec against the CRD schema, applies the CRD's defaults (``meshrun.api.crd.with_defaults``) and
reads every field, so the CRD stays the single source of truth. A field the CRD leaves unset
without a default is ``None``. The planner, the operator and the env contract all read this.

Adding a spec field: add it to the CRD (with its default), then a typed field here; the reader
picks it up by name (tests/core/test_spec.py fails on a CRD key without a field, or the reverse).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from meshrun.api.hardware import (
    DEFAULT_PRODUCT,
    PROFILES,
    AcceleratorProfile,
    inter_node_rate,
    intra_node_rate,
    job_profile,
)
from meshrun.api.moe import Moe
from meshrun.api.policyspec import PodFailurePolicy
from meshrun.api.presets import Mlp, ModelShape

GIB = 1024**3
CPU = "cpu"
"""``spec.resources.accelerator`` of a CPU-only job (no accelerator request)."""
DEFAULT_GPU_MEMORY_GIB = PROFILES[DEFAULT_PRODUCT].memory_gib
"""GiB the planner assumes for a GPU job with neither memory nor a known product (H100)."""

Accelerator = Literal["nvidia.com/gpu", "cpu"]
StrategyType = Literal["auto", "ddp", "zero", "pipeline", "tensor", "hybrid"]
Schedule = Literal["gpipe", "1f1b", "interleaved-1f1b"]
Precision = Literal["bf16", "fp32"]
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


Checkpointing = Literal["none", "selective", "full"]
Dataset = Literal["synthetic", "corpus"]
Preset = Literal["tiny", "small", "1b", "7b", "13b", "70b", "moe-small", "moe-large"]
CleanPodPolicy = Literal["All", "Running", "None"]


BYTE_VOCAB = 256
"""Tokens of the byte-level corpus: one per byte value."""


def crd_key(name: str) -> dict[str, str]:
    """Field metadata naming a CRD key that is not the camelCase of the field's name."""
    return {"key": name}


DERIVED = {"derived": "true"}
"""Field metadata of a value computed from other fields rather than read from the CRD."""


@dataclass(frozen=True, kw_only=True)
class Resources:
    """``spec.resources``: the machines."""

    num_nodes: int
    """Pods in the job, one per node."""
    num_proc_per_node: int
    """Processes per pod, one per accelerator."""
    accelerator: Accelerator
    """``nvidia.com/gpu``, or ``cpu`` for CPU-only pods."""
    accelerator_product: str | None
    """The nodes' ``nvidia.com/gpu.product`` label the pods must run on; None: any GPU node."""
    accelerator_memory_gib: int | None = field(metadata=crd_key("acceleratorMemoryGiB"))
    """Memory of one accelerator; None: the product's, else 80 for GPUs, unchecked for CPUs."""
    shared_memory_gib: int | None = field(metadata=crd_key("sharedMemoryGiB"))
    """Size limit of each pod's memory-backed /dev/shm; None: no limit of its own."""
    interconnect: Interconnect
    """The links, which the auto strategy weighs."""

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.num_proc_per_node

    @property
    def memory_assumed(self) -> bool:
        """True when a GPU job gives neither memory nor a known product: the planner assumes."""
        known = self.accelerator_memory_gib is not None or self.accelerator_product in PROFILES
        return self.accelerator != CPU and not known

    @property
    def profile(self) -> AcceleratorProfile:
        """The hardware the step-time model assumes (meshrun.api.hardware.job_profile)."""
        return job_profile(self.accelerator == CPU, self.accelerator_product)

    @property
    def accelerator_bytes(self) -> int:
        """Memory of one accelerator in bytes; 0 means unknown (a CPU job without a size)."""
        if self.accelerator_memory_gib is not None:
            return self.accelerator_memory_gib * GIB
        return 0 if self.accelerator == CPU else self.profile.memory_gib * GIB

    @property
    def intra_node_bytes_per_second(self) -> float:
        """Per accelerator and direction between the accelerators of one node."""
        link = self.interconnect
        return intra_node_rate(self.profile, link.intra_node, link.intra_node_gbps)

    @property
    def inter_node_bytes_per_second(self) -> float:
        """Per accelerator between nodes."""
        link = self.interconnect
        return inter_node_rate(self.profile, link.inter_node, link.inter_node_gbps)

    @property
    def fast_intra_node(self) -> bool:
        """NVLink/NVSwitch between the accelerators of a node (false for PCIe)."""
        return self.interconnect.intra_node == "nvlink"

    @property
    def fast_inter_node(self) -> bool:
        """InfiniBand-class network between nodes (false for Ethernet)."""
        return self.interconnect.inter_node == "infiniband"


@dataclass(frozen=True, kw_only=True)
class Strategy:
    """``spec.strategy``: how the model and data are split; unset degrees are None."""

    type: StrategyType
    """auto lets the planner choose; the others name the strategy."""
    zero_stage: int | None
    """ZeRO stage 0-3, or None when unset."""
    data_parallel: int | None
    """Data-parallel degree, or None to derive."""
    context_parallel: int
    """Context-parallel degree: ranks each sequence is split over (1: none)."""
    pipeline_parallel: int | None
    """Pipeline stages, or None to derive."""
    tensor_parallel: int | None
    """Tensor-parallel degree, or None to derive."""
    pipeline_schedule: Schedule
    """The pipeline schedule."""
    micro_batches: int | None
    """Micro-batches per pipeline step, or None to derive from the batch sizes."""
    virtual_stages: int | None
    """Model chunks per pipeline rank, or None for the schedule's default."""
    expert_parallel: int | None
    """Expert-parallel degree (ranks a MoE layer's experts are spread over); None: 1."""
    expert_tensor_parallel: int | None
    """Tensor-parallel degree of each expert: 1, or tensorParallel (None: tensorParallel)."""


@dataclass(frozen=True, kw_only=True)
class Model:
    """``spec.model``: a preset, explicit sizes (which also override a preset's), or a Hugging
    Face folder whose config.json gives the shape."""

    preset: Preset | None
    """A named Llama-like size."""
    hf: HuggingFace | None
    """A Hugging Face model folder (config.json, optional weights, tokenizer)."""
    layers: int | None
    """Transformer blocks."""
    hidden: int | None
    """Model width."""
    heads: int | None
    """Attention heads."""
    kv_heads: int | None
    """Key/value heads (grouped-query attention)."""
    vocab: int | None
    """Vocabulary size."""
    seq_len: int | None
    """Training sequence length."""
    ffn_hidden: int | None
    """The MLP's hidden size."""
    mlp: Mlp
    """swiglu (three matrices, SiLU-gated) or gelu (two matrices)."""
    moe: Moe | None
    """A mixture of experts, or None for a dense model."""


@dataclass(frozen=True, kw_only=True)
class Checkpoint:
    """``spec.training.checkpoint``: distributed checkpoints."""

    every_steps: int
    """Save every this many steps; 0 saves only at the end."""
    volume: str | None
    """PersistentVolumeClaim holding the checkpoints, or None for an emptyDir."""


@dataclass(frozen=True, kw_only=True)
class Metrics:
    """``spec.training.metrics``: rank 0's TensorBoard event files."""

    tensorboard: bool
    """Write TensorBoard event files."""
    path: str | None
    """Their folder; None: ``tensorboard/`` in the checkpoint folder."""


@dataclass(frozen=True, kw_only=True)
class Training:
    """``spec.training``: the training loop."""

    steps: int
    """Optimizer steps."""
    global_batch_size: int
    """Sequences per optimizer step across all data-parallel ranks."""
    micro_batch_size: int | None
    """Sequences per forward pass on one rank; None: strategy auto chooses it, every other type
    runs 1. The plan's ``layout.micro_batch_size`` is the one that runs."""
    precision: Precision
    """bf16 mixed precision (fp32 master weights) or plain fp32."""
    activation_checkpointing: Checkpointing | None
    """Recompute activations in backward; None: the planner picks what makes the plan fit."""
    compile: bool
    """torch.compile each transformer block."""
    learning_rate: float
    """Peak AdamW learning rate."""
    seed: int
    """Random seed (weights and data)."""
    max_grad_norm: float
    """Clip the global gradient norm to this."""
    dataset: Dataset | None
    """The training data; None: corpus when the vocabulary allows (see JobSpec.dataset)."""
    checkpoint: Checkpoint
    """Distributed checkpoints."""
    data: Data | None
    """The job's own data (instead of ``dataset``), or None."""
    optimizer: Optimizer
    """AdamW's betas and weight decay."""
    lr_schedule: LRSchedule
    """Warmup and decay of the learning rate."""
    export: Export | None
    """Where to write the trained model as a Hugging Face folder, or None."""
    metrics: Metrics
    """Where rank 0 writes its TensorBoard event files, or that it writes none."""


@dataclass(frozen=True, kw_only=True)
class RunPolicy:
    """``spec.runPolicy``: restarts, deadlines and clean-up."""

    backoff_limit: int
    """Whole-gang restarts allowed after retryable failures before the job fails."""
    active_deadline_seconds: int | None
    """Seconds from start after which the job fails with DeadlineExceeded."""
    progress_deadline_seconds: int | None
    """Seconds without a new training step after which the gang is restarted (hang detection)."""
    ttl_seconds_after_finished: int | None
    """Seconds after completion after which the job object itself is deleted."""
    clean_pod_policy: CleanPodPolicy
    """Which pods to delete when the job finishes: None, Running (unfinished ones) or All."""
    suspend: bool
    """True: no pods exist (Kueue admission or a user pause); False: run."""
    pod_failure_policy: PodFailurePolicy | None
    """Which failures fail the job, restart it, or restart it uncounted; None: the built-in
    table (docs/operator.md)."""


@dataclass(frozen=True, kw_only=True)
class Scheduling:
    """``spec.scheduling``: how the pods are placed."""

    gang: bool
    """All pods bound within ``gang_timeout_seconds`` or the attempt is torn down and retried."""
    gang_timeout_seconds: int
    """Seconds the gang may wait for every pod to be bound to a node."""
    scheduler_name: str | None
    """Scheduler for the pods; volcano and scheduler-plugins also get a PodGroup."""
    priority_class_name: str | None
    """PriorityClass of the pods."""
    queue_name: str | None
    """Kueue / volcano queue; falls back to the job's kueue.x-k8s.io/queue-name label."""
    topology_key: str | None
    """Node label whose value the pods of one pipeline stage should share."""


@dataclass(frozen=True, kw_only=True)
class Egress:
    """``spec.networking.egress``: where the job's pods may connect to."""

    policy: Literal["Open", "Restricted"]
    """Open: anywhere; Restricted: DNS, the job's own pods and ``allowed_cidrs`` only."""
    allowed_cidrs: list[str] | None = field(metadata=crd_key("allowedCIDRs"))
    """CIDRs a Restricted job may also reach (the metadata address is carved out)."""


@dataclass(frozen=True, kw_only=True)
class Networking:
    """``spec.networking``: the pods' network access beyond their gang."""

    egress: Egress
    """``spec.networking.egress``."""


@dataclass(frozen=True, kw_only=True)
class Elastic:
    """``spec.elastic``: run on fewer (or more) data-parallel replicas as capacity changes."""

    min_data_parallel: int
    """The fewest data-parallel replicas the job may run on."""
    max_data_parallel: int | None
    """The most it may grow to; None: the planned degree."""
    shrink_after_seconds: int
    """Seconds pods may stay unschedulable before the job shrinks."""
    grow_after_seconds: int
    """Seconds room for more replicas must last before the job grows."""


@dataclass(frozen=True, kw_only=True)
class JobSpec:
    """A whole ``spec``, defaulted and typed."""

    image: str
    """Container image of the trainer."""
    command: list[str] | None
    """Overrides the image's entrypoint."""
    args: list[str] | None
    """Arguments to the entrypoint."""
    pod_template: dict[str, Any] | None
    """A PodTemplateSpec merged into every pod (kept as given)."""
    resources: Resources
    """``spec.resources``."""
    strategy: Strategy
    """``spec.strategy``."""
    model: Model
    """``spec.model`` as given (see :attr:`shape` for the resolved sizes)."""
    training: Training
    """``spec.training``."""
    run_policy: RunPolicy
    """``spec.runPolicy``."""
    scheduling: Scheduling
    """``spec.scheduling``."""
    networking: Networking
    """``spec.networking``."""
    elastic: Elastic | None
    """``spec.elastic``; None: the job always runs at its planned size."""

    shape: ModelShape = field(metadata=DERIVED)
    """The model's sizes: the preset's, overridden by the explicit ones in ``model``."""

    @property
    def tokens_per_step(self) -> int:
        """Tokens one optimizer step trains on: the global batch of sequences of seqLen."""
        return self.training.global_batch_size * self.shape.seq_len

    @property
    def dataset(self) -> Dataset:
        """The training data: as given, else corpus when the vocabulary holds every byte."""
        if self.training.dataset is not None:
            return self.training.dataset
        return "corpus" if self.shape.vocab >= BYTE_VOCAB else "synthetic"
