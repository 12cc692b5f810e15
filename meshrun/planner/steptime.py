"""Predicted time of one optimizer step of a layout, by part (docs/planner.md, "The step-time
model"). Pure arithmetic on the model shape, the layout and the hardware profile: no I/O.

The parts, on the busiest rank (the pipeline rank with the most compute):

* **compute**: every matrix multiply of the forward and backward pass at an efficiency that
  falls as the matrices a rank multiplies shrink (:func:`gemm_efficiency`: a TP-split layer
  multiplies narrower matrices and gets less of the peak per FLOP), and causal attention at the
  flash-attention kernels' efficiency;
* **recompute**: the forward pass again under full activation checkpointing (Korthikanti et al.
  2022, arXiv 2205.05198); under selective checkpointing only the element-wise operations, which
  are memory-bound;
* **elementwise**: norms, activations, residual adds, rotary embeddings and the loss, which move
  bytes rather than multiply (memory bandwidth bound);
* **tensorParallel**: the sequence-parallel all-gathers and reduce-scatters of every layer (four
  each way per layer, Korthikanti et al. section 4.2.2, and the norms' two all-gathers again in
  backward unless full recomputation redoes them all), not overlapped;
* **contextParallel**: under context parallelism, the all-gather of every attention layer's
  keys and values over the CP group in forward (and again when full or selective
  recomputation redoes it) and the reduce-scatter of their gradients in backward, on the links
  the group spans (inside a pod while cp x tp fits one), exposed: attention cannot start
  before the whole sequence's keys and values are there, and the all-gather overlaps only the
  few operations between the key and value projections and attention (Llama 3's report says
  the same of its all-gather context parallelism, Dubey et al. 2024, section 3.3.2: exposed,
  but small next to attention at long sequences since grouped-query attention makes keys and
  values small). The split into 2 x cp chunks, rank i holding chunks i and 2 x cp - 1 - i,
  gives every rank the same causal-attention FLOPs (:data:`CP_LOAD_BALANCE`);
* **launch**: the time the GPU waits on the host when a block's kernels take less time than
  eager PyTorch takes to launch them (small micro-batches, narrow TP shards);
* **pipelineBubble**: (p - 1) micro-batch slots per pipeline step for GPipe and 1F1B,
  (p - 1) / v for interleaved 1F1B (Narayanan et al. 2021, arXiv 2104.04473, section 2.2);
* **pipelineTransfer**: the activation and its gradient sent between neighbouring stages, once
  per micro-batch and model chunk;
* **dataParallel**: what of the data-parallel collectives does not hide behind compute
  (:func:`data_parallel_seconds`; Rajbhandari et al. 2020, arXiv 1910.02054; the Ultra-Scale
  Playbook, "ZeRO" and "Overlapping communication");
* **optimizer**: fused AdamW reading and writing each local parameter's states (memory bound);
* **memoryPressure**: the slowdown of a layout whose memory estimate leaves the caching
  allocator too little headroom (:func:`pressure_slowdown`).

Collectives follow the ring cost model: each rank moves ``(n - 1) / n`` of the buffer for an
all-gather or a reduce-scatter, twice that for an all-reduce (NCCL's "bus bandwidth"), at the
bandwidth of the group's links (:func:`group_of`), plus a latency per rank and per pod the
group spans."""

from __future__ import annotations

from dataclasses import dataclass

from meshrun.api.fsdpunits import block_units
from meshrun.api.hardware import AcceleratorProfile
from meshrun.api.layout import Layout, Stage, layers_per_rank
from meshrun.api.presets import MLP_MATRICES, ModelShape
from meshrun.api.spec import CPU, JobSpec, Resources
from meshrun.planner.memory import (
    MemoryEstimate,
    element_bytes,
    fsdp_shards,
    layer_activation_elements,
)
from meshrun.planner.moe import (
    ALL_TO_ALLS,
    active_flops_parameters,
    all_to_all_bytes,
    compute_shape,
    ep_stride,
    expert_parameters,
    routed_parameters,
)

GEMM_EFFICIENCY = 0.72
"""Share of the dense peak a large bf16 matrix multiply reaches (cuBLAS on H100 and A100 runs
8192-cubed GEMMs at 75-80% of the datasheet peak)."""
GEMM_HALF_SIZE = 96.0
"""A matrix dimension d costs a factor d / (d + 96): small dimensions fill the tensor cores'
tiles and the GPU's waves poorly (a 1024-wide dimension loses 9%, a 128-wide one 43%)."""
ATTENTION_EFFICIENCY = 0.40
"""Share of the peak flash attention (FlashAttention-2, cuDNN) reaches, forward and backward
together, at head size 128."""
ATTENTION_EFFICIENCY_HOPPER = 0.30
"""The same on Hopper GPUs, where FlashAttention-2 (torch's flash backend) does not use the
Hopper tensor-core instructions cuBLAS's matrix multiplies get, so it reaches a smaller share
of a larger peak (about 300 TFLOP/s forward and backward on an H100, its authors' figures).
Measured: llm-foundry's FSDP runs of 760M-13B models at 16K-64K tokens on H100s came out 40-100%
slower than the model at 0.40 gave them; at 0.30 they are 10-60% slower (their kernels
predate FlashAttention-2), while the rows of Megatron-Core and NeMo (cuDNN's fused attention,
faster on Hopper) would be 20-40% faster than a lower figure gives."""
HOPPER = ("H100", "H200", "GH200")
ATTENTION_BACKWARD = 2.5
"""Flash attention's backward costs 2.5 forwards (five matrix multiplies against two)."""
LINK_EFFICIENCY = 0.8
"""Share of a link's bandwidth NCCL's ring collectives reach (bus bandwidth over line rate)."""
COLLECTIVE_LATENCY_S = 20e-6
"""Fixed cost of one collective launch and synchronisation."""
NVLINK_HOP_S = 1e-6
"""Latency each further rank of a pod adds to a collective."""
NETWORK_HOP_S = 8e-6
"""Latency each further pod adds to a collective (a network round of NCCL's ring). With 25 MiB
buckets it makes DP all-reduces over 32 pods about 0.5 ms each, which is what measured DP-only
runs lose at that scale beyond their bandwidth (the Ultra-Scale Playbook's sweep: 1B and 3B
models, 4 to 32 nodes of 8 H100s)."""
POD_SPREAD_EXPONENT = 0.5
"""A collective across pods moves at up to its ranks-per-pod times each GPU's network share
(NCCL crosses each node boundary once per channel, a channel per NIC), divided by the square
root of the pods it spans (more crossings share the fabric), and never below one share: 2
pods of 8 ranks move at 5.7 shares (measured: a TP 16 group over 2 H100 nodes moved about
310 GB/s per rank, where 80% of 5.7 shares of 50 GB/s is 230), 32 pods at 1.4, 64 and more at 1
(ZeRO-3 over 192 A100 nodes reached its GPUs' own 25 GB/s)."""
DDP_BUCKET_BYTES = 25 * 2**20
"""DDP all-reduces gradients in 25 MiB buckets (torch's ``bucket_cap_mb`` default): one
collective, and its latency, per bucket."""
HOST_LAYER_S = 0.4e-3
"""Host time to launch one block's kernels, forward and backward, for one micro-batch (eager
PyTorch): the GPU waits when the block's own work is shorter."""
HOST_TP_LAYER_S = 5e-3
"""The same for a tensor-parallel block, whose collectives make the host wait for the GPU every
few kernels, so the GPU cannot run ahead: measured, a TP block at one sequence of 4,096 tokens
takes 4.4-4.6 ms forward and backward at TP 2, 4 and 8, for a 1B and an 8B model alike, however
little work each rank's shard holds (the Ultra-Scale Playbook's sweep on H100s)."""
CPU_LAYER_S = 10e-3
"""Host time of one block, forward and backward, for one micro-batch on a CPU process (eager
PyTorch runs each operation's dispatch and kernel on the host, so none of it overlaps): a tiny
block of 128 tokens took 2.5 ms on a core of its own here and 10.8 ms (median) with the machine's
2 cores shared by other processes, as a local run's processes share them."""
GLOO_LATENCY_S = 2e-3
"""Fixed cost of one gloo collective or send between CPU processes that share cores, as local
runs here do: 0.3-0.5 ms between 2 processes on 2 cores, 1.6-4 ms for a barrier of 8 processes
on 2 cores (each waits until the others are scheduled)."""
CPU_STEP_S = 0.4
"""Per-step cost of a CPU process beyond its blocks and its layout's collectives: the
optimizer's loop over the parameters, gradient clipping's norm and the loss's reductions
(collectives over every group), the step's logging and the data, all while the processes share
the cores. Fitted, with the two constants above, to the demo (examples/demo-3d-cpu.yaml, 8 gloo
processes on this 2-core machine), which measured 893 tokens/s (512 with the machine loaded by
other work): the model predicts 828."""
PRESSURE_START = 0.95
"""Share of accelerator memory (by the estimate, which leaves out the CUDA context, the
communication library's buffers and fragmentation) above which a step slows down: the caching
allocator runs out of free blocks, releases its cache and retries, synchronising the device.
llm-foundry's FSDP runs estimated at 90-99% of their GPUs' memory ran at their neighbours'
speed (at 0.80 the model slowed them by up to 47%), while the sweep's runs that slowed near
the limit are estimated well below it (nanotron holds more than meshrun's trainer), so only the
last 5% of the estimate counts."""
PRESSURE_SLOWDOWN = 0.5
"""How much slower a step whose estimate fills the accelerator is (linear from
``PRESSURE_START``): measured runs within a few GiB of an H100's 80 GiB ran at 0.1-0.6 of the
speed of their neighbours (the Ultra-Scale Playbook's sweep; its authors name memory pressure
as the cause)."""
GATHERED_PRESSURE = (0.75, 0.2)
"""(start, slowdown at a full estimate) under ZeRO-3, taken where it exceeds the above: every
unit's parameters are gathered into new buffers and freed again in each forward and backward,
so the caching allocator splits and frees blocks all step long and runs short of a free block
of the right size with more headroom left than static buffers need. llm-foundry's single-node
FSDP runs of its 13B model on A100 40GB and 30B on H100, estimated at 82-88%, measured 10-17%
below their multi-node twins (estimated at 29-72%) relative to the model without it; with it,
22 of the 23 groups of three or more layouts (llm-foundry's and torchtitan's) rank at a
correlation of 0.6 or better (20 without it), and 25 of 26 groups pick within 0.9 of the
fastest (24)."""
MEMORY_EFFICIENCY = 0.8
"""Share of the memory bandwidth element-wise kernels reach."""
ELEMENTWISE_ACCESSES = 4.0
"""Times each kept activation element is written or read by element-wise kernels over a
forward and backward pass (written and read forward, its gradient written and read
backward)."""
EAGER_ELEMENTWISE = 2.0
"""How many times the fused count of element-wise traffic eager PyTorch moves: RMSNorm, rotary
embeddings, SiLU and the residual adds run as several kernels each, every one reading and
writing its tensors, where ``spec.training.compile`` fuses each into one (the fused count is
``ELEMENTWISE_ACCESSES``). torchtitan's Llama 3.1 8B FSDP run on 8 H100s measured 5,762
tokens/s per GPU eager and 6,667 compiled (+16%), on 128 H100s 5,605 and 6,514 (+16%)."""
LOSS_BYTES_PER_LOGIT = 30.0
"""Bytes moved per 16-bit logit by the trainer's cross-entropy (meshrun_trainer.models.loss):
forward an fp32 copy and its log-sum-exp (2 + 4 + 4), backward the fp32 softmax, its scaling
and the 16-bit gradient (2 + 4, 4 + 4, 4 + 2)."""
CP_LOAD_BALANCE = 1.0
"""Attention time of the busiest CP rank over the average: the load-balanced split gives rank i
chunks i and 2cp-1-i, whose causal work (i + 1/2 and 2cp - i - 1/2 chunk-lengths of keys per
query) adds to 2cp on every rank; a plain split into cp chunks would give the last rank
(2cp - 1) / cp times the average."""
CP_OVERLAP = 0.0
"""Share of the CP all-gathers and reduce-scatters hidden behind compute: attention waits for
the gathered keys and values (forward) and the reduce-scatter of their gradients follows
attention's backward, so all-gather context parallelism exposes them; a ring implementation
would overlap each step's send with the previous block's attention."""
PIPELINE_MICRO_BATCH_S = 3e-3
"""Fixed cost of each micro-batch a pipeline stage runs, beyond its transfers: the schedule's
blocking sends and receives make every stage wait for its neighbour's host once per
micro-batch, forward and backward (once, not once per model chunk: an interleaved schedule
posts the chunks' sends together, as Megatron-Core's ``--overlap-p2p-comm`` does; counted per
chunk, the interleaved DGX Cloud rows came out 5-10% slower). Fitted to the Ultra-Scale
Playbook's sweep, where pipelined layouts measured 0.6-0.8 of the speed the model gave them
beside layouts without a pipeline of the same model and cluster, most at micro-batch 1 (0.59)
and none at 8 or more."""
DP_EXPOSED = 0.3
"""Share of each data-parallel collective that stays exposed even behind enough compute: NCCL's
kernels take SMs and memory bandwidth from the matrix multiplies they overlap, and the last
bucket or unit of a backward has nothing after it to hide behind. llm-foundry's FSDP runs of
1B-70B models on 128, 256 and 512 H100s measured 2-10% fewer tokens/s per GPU at each
doubling (the model without it: flat, the collectives fully hidden)."""
PARAM_GATHER_EXPOSED = True
"""ZeRO-1 and 2 gather the updated parameters after the optimizer step, before the next
forward can start: exposed, as Megatron's distributed optimizer without
``--overlap-param-gather``, DeepSpeed's ZeRO-1 and 2 and nanotron do. In the Ultra-Scale
Playbook's sweep ZeRO-1 layouts measured below the same layouts under ZeRO-0 (the model had
them up to 30% faster: at 16 and 32 nodes its pick was the ZeRO-1 twin of the measured
fastest)."""
CROSS_POD_TP_LATENCY_S = 300e-6
"""Added to every tensor-parallel collective whose group spans pods: each waits on a network
round trip of every rank, in the middle of a block, with nothing to overlap. The sweep's TP 16
and 32 layouts measured 0.4-0.6 of the speed the model gave them at micro-batches of 1-2 (a
block's collectives then small), near it at 16 and more."""
TP_OVERLAP = 0.5
"""Share of the sequence-parallel all-gathers and reduce-scatters hidden behind the matrix
multiplies next to them (Megatron-Core's ``--tp-comm-overlap`` hides most; NCCL's
collectives on NVLink run beside the GEMMs on other streams in torch's async TP). Measured:
Megatron-Core's weak-scaling rows at TP 2, 4 and 8 came out 20-35% slow with TP fully
exposed, and in the sweep layouts with TP inside a pod and no pipeline measured 1.4-1.55
times the group's median against 1.1 for TP 1."""
"""Extra latency of a TP collective spanning pods."""
ADAM_BYTES_PER_PARAMETER = 34.0
"""Fused AdamW per local parameter: read fp32 master, both moments and the fp32 gradient,
write them back with the bf16 copy, and the gradient norm's read (4*4 + 3*4 + 2 + 4)."""


@dataclass(frozen=True)
class StepEstimate:
    """A predicted optimizer step."""

    step_seconds: float
    """Wall time of one optimizer step."""
    tokens_per_second_per_gpu: float
    """Training tokens per second divided by the accelerators."""
    mfu: float
    """Model FLOPs utilisation: 6 N + 12 L s q FLOPs per token (PaLM's count, no recompute)
    against the accelerators' dense peak."""
    breakdown: dict[str, float]
    """Seconds by part; they add up to ``step_seconds``."""


def gemm_efficiency(m: float, n: float, k: float) -> float:
    """Share of the peak for an (m x k) by (k x n) matrix multiply."""
    h = GEMM_HALF_SIZE
    return GEMM_EFFICIENCY * (m / (m + h)) * (n / (n + h)) * (k / (k + h))


def gemm_passes(m: float, n: float, k: float) -> dict[str, tuple[float, float, float]]:
    """The three products a forward (m x k) by (k x n) multiply costs in training, as (m, n, k)
    of each: the forward, and the backward's two, which reduce over n (the input's gradient)
    and over m (the weight's gradient)."""
    return {"forward": (m, n, k), "inputGradient": (m, k, n), "weightGradient": (k, n, m)}


def gemm_seconds(m: float, n: float, k: float, peak: float) -> float:
    """Forward plus backward (data and weight gradients) of one matrix multiply, seconds."""
    return sum(
        2 * a * b * c / (peak * gemm_efficiency(a, b, c))
        for a, b, c in gemm_passes(m, n, k).values()
    )


def layer_gemms(shape: ModelShape, tokens: int, tp: int) -> dict[str, tuple[float, float, float]]:
    """The forward matrix multiplies (m, n, k) of one block on one of ``tp`` ranks, for
    ``tokens`` tokens, by the weights they use."""
    q = shape.heads * shape.head_dim
    kv = shape.kv_heads * shape.head_dim
    h, f = shape.hidden, shape.ffn_hidden
    up = "w1,w3" if shape.mlp == "swiglu" else "w1"  # a GeLU MLP has no gate
    return {
        "wq,wk,wv": (tokens, (q + 2 * kv) / tp, h),  # column parallel
        "wo": (tokens, h, q / tp),  # row parallel
        up: (tokens, (MLP_MATRICES[shape.mlp] - 1) * f / tp, h),  # column parallel
        "w2": (tokens, h, f / tp),  # row parallel
    }


def attention_efficiency(product: str) -> float:
    hopper = any(name in product for name in HOPPER)
    return ATTENTION_EFFICIENCY_HOPPER if hopper else ATTENTION_EFFICIENCY


def layer_compute_seconds(
    shape: ModelShape, tokens: int, tp: int, peak: float, product: str = ""
) -> tuple[float, float]:
    """(matmul seconds forward + backward, of which forward) of one block for ``tokens`` tokens on
    one of ``tp`` ranks: whole sequences, or under context parallelism a rank's load-balanced
    share of them."""
    q = shape.heads * shape.head_dim
    gemms = layer_gemms(shape, tokens, tp).values()
    total = sum(gemm_seconds(m, n, k, peak) for m, n, k in gemms)
    forward = sum(2 * m * n * k / (peak * gemm_efficiency(m, n, k)) for m, n, k in gemms)
    # Causal attention: QK^T and AV over half the s x s scores, 2 s^2 q FLOPs per sequence, so
    # 2 s q per token whichever ranks of a CP group hold it (the split balances them).
    attention_forward = 2 * tokens * shape.seq_len * q / tp * CP_LOAD_BALANCE
    head_factor = (
        shape.head_dim / (shape.head_dim + GEMM_HALF_SIZE) / (128 / (128 + GEMM_HALF_SIZE))
    )
    attention_rate = peak * attention_efficiency(product) * head_factor
    attention = attention_forward * (1 + ATTENTION_BACKWARD) / attention_rate
    return total + attention, forward + attention_forward / attention_rate


@dataclass(frozen=True)
class Group:
    """A communication group as its collectives see it."""

    size: int
    """Ranks in the group."""
    per_pod: int
    """Of them on one pod."""
    bandwidth: float
    """Bytes/s each rank's share of a collective moves at: the intra-node link inside a pod;
    across pods, the network of the group's ranks on a pod together (NCCL's rings and trees
    cross each node boundary once per channel, a channel per NIC), at most the intra-node
    link."""
    latency: float = COLLECTIVE_LATENCY_S
    """Fixed cost of one collective: NCCL's launch and synchronisation, or gloo's between CPU
    processes."""

    @property
    def pods(self) -> int:
        return -(-self.size // self.per_pod)


def group_of(res: Resources, size: int, stride: int) -> Group:
    """The group of ``size`` ranks ``stride`` apart (TP: 1, CP: the TP degree, DP and ZeRO:
    the TP degree, over the dp x cp ranks), with the rank order of
    :data:`meshrun.api.layout.RANK_ORDER`."""
    per_pod_ranks = res.num_proc_per_node
    per_pod = max(1, min(size, per_pod_ranks // stride))
    latency = GLOO_LATENCY_S if res.accelerator == CPU else COLLECTIVE_LATENCY_S
    if size <= per_pod:
        return Group(size, size, res.intra_node_bytes_per_second, latency)
    pods = -(-size // per_pod)
    spread = max(1.0, per_pod / pods**POD_SPREAD_EXPONENT)
    bandwidth = min(res.intra_node_bytes_per_second, spread * res.inter_node_bytes_per_second)
    return Group(size, per_pod, bandwidth, latency)


def collective_seconds(bytes_: float, group: Group, rounds: int = 1) -> float:
    """An all-gather or reduce-scatter (``rounds`` 1) or all-reduce (2) of a ``bytes_`` buffer:
    each rank moves ``(n - 1) / n`` of it per round, and each round waits on a hop per rank in
    a pod and per pod."""
    n = group.size
    if n <= 1:
        return 0.0
    transfer = bytes_ * (n - 1) / n / (group.bandwidth * LINK_EFFICIENCY)
    hops = (group.per_pod - 1) * NVLINK_HOP_S + (group.pods - 1) * NETWORK_HOP_S
    return rounds * (transfer + hops) + group.latency


@dataclass(frozen=True)
class RankWork:
    """One pipeline rank's share of one micro-batch."""

    forward: float
    """Seconds of forward compute (matmuls, attention, element-wise)."""
    backward: float
    """Seconds of backward compute, recomputation included."""
    parts: dict[str, float]
    """Seconds by part for one micro-batch."""
    parameters: int
    """Parameters the rank holds (before ZeRO sharding)."""
    units: int
    """FSDP2's units the rank holds (its blocks, or their matrices and norms, the embedding
    and the head), one collective each."""


def rank_work(
    spec: JobSpec, layout: Layout, layers: int, first: bool, last: bool, checkpointing: str
) -> RankWork:
    """The compute, element-wise and TP time of one micro-batch on a rank holding ``layers``
    blocks (and the embedding when ``first``, the output head when ``last``)."""
    # A mixture of experts computes as the dense MLP its busiest rank runs; the experts it
    # holds are its share of them (meshrun.planner.moe).
    model, t, cp, res = spec.shape, layout.tp, layout.cp, spec.resources
    shape = compute_shape(model)
    profile = res.profile
    peak = profile.peak_tflops * 1e12
    memory_rate = profile.memory_gbps * 1e9 * MEMORY_EFFICIENCY
    tokens = layout.micro_batch_size * shape.seq_len // cp  # a rank's share of the sequences
    act_bytes = element_bytes(spec.training.precision)
    if spec.training.precision != "bf16":
        peak /= 8  # fp32 matmuls: TF32 off by default in torch, well under the bf16 peak
    layer, layer_forward = layer_compute_seconds(shape, tokens, t, peak, profile.product)
    kept = layer_activation_elements(shape, t, "none", cp)
    elementwise = tokens * kept * act_bytes * ELEMENTWISE_ACCESSES / memory_rate
    fused = elementwise  # what recomputation rewrites: each kept tensor once
    if not spec.training.compile:
        elementwise *= EAGER_ELEMENTWISE  # unfused: each operation reads and writes again
    # Sequence parallelism: 2 all-gathers and 2 reduce-scatters of the s*b*h activation each
    # way per layer (Korthikanti et al. 2022, section 4.2.2); a TP group wider than a pod
    # spans whole pods and crosses the network.
    tp_group = group_of(res, t, 1)
    collective = collective_seconds(tokens * shape.hidden * act_bytes, tp_group)
    if tp_group.pods > 1:
        collective += CROSS_POD_TP_LATENCY_S
    if res.accelerator != CPU:  # gloo's thread shares the cores: nothing hides
        collective *= 1 - TP_OVERLAP
    tp_forward = 4 * collective
    recompute = 0.0
    tp_recompute = 0.0
    if checkpointing == "full":
        recompute = layer_forward + fused / ELEMENTWISE_ACCESSES * 2
        tp_recompute = tp_forward
    elif checkpointing == "selective":
        saved = kept - layer_activation_elements(shape, t, "selective", cp)
        recompute = tokens * max(saved, 0.0) * act_bytes * 2 / memory_rate
        tp_recompute = 2 * collective if t > 1 else 0.0  # the norms' all-gathers again
    elif t > 1:
        # Backward keeps the norms' outputs as sequence shards and gathers them again
        # (meshrun_trainer.distributed.gather, as Megatron-LM does).
        tp_recompute = 2 * collective
    head = head_forward = 0.0
    if last:
        head = gemm_seconds(tokens, shape.vocab / t, shape.hidden, peak)
        head_forward = (
            2
            * tokens
            * shape.vocab
            / t
            * shape.hidden
            / (peak * gemm_efficiency(tokens, shape.vocab / t, shape.hidden))
        )
        head += tokens * shape.vocab / t * LOSS_BYTES_PER_LOGIT / memory_rate
    tp_layer = 2 * tp_forward + tp_recompute
    # Two all-to-alls forward and two in backward per MoE layer, waited for (no overlap).
    dispatch = collective_seconds(
        all_to_all_bytes(model, layout, tokens, act_bytes),
        group_of(res, layout.ep, ep_stride(layout)),
    )
    expert_layer = ALL_TO_ALLS * dispatch if model.moe is not None and layout.ep > 1 else 0.0
    # Context parallelism: the whole sequence's keys and values (kv heads / t of them on this
    # rank) all-gathered over the CP group forward, their gradients reduce-scattered backward;
    # recomputation (full or selective: the gathered keys and values are not kept) gathers
    # them again.
    cp_gather = 0.0
    if cp > 1:
        kv = shape.kv_heads * shape.head_dim / t
        gathered = 2 * tokens * cp * kv * act_bytes
        cp_gather = collective_seconds(gathered, group_of(res, cp, t)) * (1 - CP_OVERLAP)
    cp_layer = cp_gather * (2 if checkpointing == "none" else 3)
    # A block whose GPU work is shorter than the host's launching of it waits on the host; a
    # CPU process runs its operations on the host, one after the other.
    busy = layer + elementwise + recompute + tp_layer + cp_layer
    host = HOST_TP_LAYER_S if t > 1 else HOST_LAYER_S
    if res.accelerator == CPU:
        host, busy = CPU_LAYER_S, 0.0
    parts = {
        "compute": layers * layer + head,
        "recompute": layers * recompute,
        "elementwise": layers * elementwise,
        "tensorParallel": layers * tp_layer,
        "contextParallel": layers * cp_layer,
        "launch": layers * max(0.0, host - busy),
        "expertParallel": layers * expert_layer,
    }
    # The host launches a forward's kernels in about a third of a block's time.
    forward = (
        layers * (layer_forward + elementwise / 2 + tp_forward + cp_gather + expert_layer / 2)
        + parts["launch"] / 3
        + head_forward
    )
    total = sum(parts.values())
    dense_layer = model.layer_parameters() - routed_parameters(model)
    parameters = layers * dense_layer + expert_parameters(model, layers, layout.ep)
    if first:
        parameters += shape.vocab * shape.hidden
    if last:
        parameters += shape.vocab * shape.hidden + shape.hidden
    units = layers * block_units(model, layout) + int(first) + int(last)
    return RankWork(forward, total - forward, parts, -(-parameters // t), units)


WorkCache = dict[tuple[int, bool, bool, int, int, str, int, int], "RankWork"]
"""A pipeline rank's work by (blocks, first, last, tp, cp, checkpointing, ep, FSDP2 units per
block), for one job and micro-batch size."""


def data_parallel_seconds(spec: JobSpec, layout: Layout, busiest: RankWork, passes: int) -> float:
    """What of one step's data-parallel traffic does not hide behind compute.

    Gradients are reduced in fp32 (the trainer and Megatron do), parameters gathered in 16
    bits, all during the last micro-batch (earlier ones accumulate locally). Plain data
    parallelism (DDP) all-reduces in buckets while backward runs; beside TP or PP, FSDP2
    all-reduces (ZeRO-0) or reduce-scatters (ZeRO-1 and 2) one unit at a time, and ZeRO-1 and
    2 gather the updated parameters again unit by unit in the next forward, each behind the
    previous unit's compute. ZeRO-1 without TP or PP is DDP with ZeroRedundancyOptimizer,
    which broadcasts the updated shards after the optimizer step, with nothing to hide behind.
    ZeRO-3 without pipelining gathers each micro-batch's parameters twice (forward and
    backward) and reduce-scatters its gradients, each hidden behind that micro-batch's compute
    as FSDP prefetches.
    """
    n = layout.data_shards  # the dp x cp ranks holding the same parameters
    if n <= 1:
        return 0.0
    act_bytes = element_bytes(spec.training.precision)
    group = group_of(spec.resources, n, layout.tp)
    grad_bytes = busiest.parameters * 4
    param_bytes = busiest.parameters * act_bytes
    forward, backward = busiest.forward, busiest.backward
    if spec.resources.accelerator == CPU:
        forward = backward = 0.0  # gloo's thread shares the cores: nothing hides behind compute
    fsdp = layout.tp > 1 or layout.pp > 1 or layout.zero_stage >= 2
    # One collective per DDP bucket, or per FSDP2 unit (a block, the embedding, the head).
    pieces = busiest.units if fsdp else max(1, -(-grad_bytes // DDP_BUCKET_BYTES))
    rounds = 2 if layout.zero_stage == 0 or not fsdp else 1  # all-reduce or reduce-scatter
    reduce = pieces * collective_seconds(grad_bytes / pieces, group, rounds)
    gather = busiest.units * collective_seconds(param_bytes / busiest.units, group)

    def hidden(comm: float, behind: float) -> float:
        return max(comm - behind, DP_EXPOSED * comm, 0.0)

    if layout.zero_stage == 0:
        return hidden(reduce, backward)
    if not fsdp:  # ZeRO-1 as DDP + ZeroRedundancyOptimizer
        return hidden(reduce, backward) + gather
    if layout.zero_stage < 3 or layout.pp > 1:
        return hidden(reduce, backward) + (
            gather if PARAM_GATHER_EXPOSED else hidden(gather, forward)
        )
    per_pass = hidden(gather, forward) + hidden(gather + reduce, backward)
    return per_pass * passes


def pressure_slowdown(memory: MemoryEstimate | None, layout: Layout | None = None) -> float:
    """The share a step slows by when the memory estimate leaves the caching allocator too
    little headroom; under ZeRO-3 (``layout``) from less full, see ``GATHERED_PRESSURE``."""
    if memory is None or not memory.accelerator_bytes:
        return 0.0
    used = min(1.0, memory.total / memory.accelerator_bytes)

    def ramp(start: float, most: float) -> float:
        return most * max(0.0, (used - start) / (1 - start))

    slowdown = ramp(PRESSURE_START, PRESSURE_SLOWDOWN)
    if layout is not None and layout.zero_stage >= 3:
        slowdown = max(slowdown, ramp(*GATHERED_PRESSURE))
    return slowdown


def estimate_step(
    spec: JobSpec,
    layout: Layout,
    stages: list[Stage],
    checkpointing: str = "none",
    cache: WorkCache | None = None,
    memory: MemoryEstimate | None = None,
) -> StepEstimate:
    """The predicted optimizer step of ``layout`` (see the module docstring); ``cache`` keeps
    the ranks' work between calls for the same job (the search times hundreds of layouts)."""
    res, shape, training = spec.resources, spec.shape, spec.training
    p, v, m, t, cp = layout.pp, layout.virtual_stages, layout.micro_batches, layout.tp, layout.cp
    profile: AcceleratorProfile = res.profile
    layers_on = layers_per_rank(stages, p)
    known: WorkCache = {} if cache is None else cache
    works = []
    units = block_units(shape, layout)
    for key in {
        (layers_on[r], r == 0, r == p - 1, t, cp, checkpointing, layout.ep, units) for r in range(p)
    }:
        if key not in known:  # balanced stages repeat a few shapes: compute each once
            known[key] = rank_work(spec, layout, key[0], key[1], key[2], checkpointing)
        works.append(known[key])
    busiest = max(works, key=lambda w: (w.forward + w.backward, w.parameters))
    slot = busiest.forward + busiest.backward
    passes = layout.grad_accumulation * (m if p > 1 else 1)
    breakdown = {part: seconds * passes for part, seconds in busiest.parts.items()}

    act_bytes = element_bytes(training.precision)
    bubble = transfer = 0.0
    if p > 1:
        chunks = v if layout.schedule == "interleaved-1f1b" else 1
        # (p - 1) / v idle slots once m micro-batches fill the ring of p * v chunks; with m < p
        # one micro-batch's trip through all p ranks is the floor, however interleaved.
        slots = max((p - 1) / chunks, p + (m - 1) / chunks - m)
        bubble = slots * slot * layout.grad_accumulation
        # Sequence-parallel stages send each rank's 1/t of the activation (Megatron's
        # scatter-gather), forward and backward, for each of the rank's v chunks, point to
        # point: over one rank's own network share when neighbouring stages sit on different
        # pods.
        apart = layout.dp * cp * t >= res.num_proc_per_node and res.num_nodes > 1
        link = res.inter_node_bytes_per_second if apart else res.intra_node_bytes_per_second
        hop = NETWORK_HOP_S if apart else NVLINK_HOP_S
        message = layout.micro_batch_size * shape.seq_len // cp * shape.hidden * act_bytes / t
        latency = GLOO_LATENCY_S if res.accelerator == CPU else COLLECTIVE_LATENCY_S
        per_slot = 2 * v * (message / (link * LINK_EFFICIENCY) + latency + hop)
        transfer = per_slot * (passes + slots * layout.grad_accumulation)
        transfer += PIPELINE_MICRO_BATCH_S * passes
    breakdown["pipelineBubble"] = bubble
    breakdown["pipelineTransfer"] = transfer
    breakdown["dataParallel"] = data_parallel_seconds(spec, layout, busiest, passes)
    local = busiest.parameters
    shards = layout.data_shards if layout.zero_stage >= 1 else fsdp_shards(layout)
    sharded = local / shards
    breakdown["optimizer"] = (
        sharded * ADAM_BYTES_PER_PARAMETER / (profile.memory_gbps * 1e9 * MEMORY_EFFICIENCY)
    )
    breakdown["memoryPressure"] = sum(breakdown.values()) * pressure_slowdown(memory, layout)
    if res.accelerator == CPU:
        breakdown["stepOverhead"] = CPU_STEP_S
    step = sum(breakdown.values())
    tokens = training.global_batch_size * shape.seq_len
    gpus = res.world_size
    per_gpu = tokens / step / gpus
    model_flops = (
        6 * active_flops_parameters(shape)
        + 12 * shape.layers * shape.seq_len * shape.heads * shape.head_dim
    )
    mfu = per_gpu * model_flops / (profile.peak_tflops * 1e12) if res.accelerator != CPU else 0.0
    return StepEstimate(step, per_gpu, mfu, breakdown)
