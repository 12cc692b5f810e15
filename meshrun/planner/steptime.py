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
  backward unless full recomputation redoes them all) on the intra-node links, not overlapped;
* **pipelineBubble**: (p - 1) micro-batch slots per pipeline step for GPipe and 1F1B,
  (p - 1) / v for interleaved 1F1B (Narayanan et al. 2021, arXiv 2104.04473, section 2.2);
* **pipelineTransfer**: the activation and its gradient sent between neighbouring stages, once
  per micro-batch and model chunk;
* **dataParallel**: what of the gradient all-reduce (DDP) or reduce-scatter plus parameter
  all-gather (ZeRO-1/2, and ZeRO-3 once per step under pipelining) does not hide behind the
  backward (gradients) and forward (parameters) of a micro-batch; ZeRO-3 without pipelining
  gathers each micro-batch's parameters twice and reduce-scatters its gradients, hidden behind
  that micro-batch's compute as FSDP prefetches (Rajbhandari et al. 2020, arXiv 1910.02054;
  the Ultra-Scale Playbook, "ZeRO" and "Overlapping communication");
* **optimizer**: fused AdamW reading and writing each local parameter's states (memory bound).

Collectives follow the ring cost model: each rank moves ``(n - 1) / n`` of the buffer for an
all-gather or a reduce-scatter, twice that for an all-reduce (NCCL's "bus bandwidth")."""

from __future__ import annotations

from dataclasses import dataclass

from meshrun.api.hardware import AcceleratorProfile
from meshrun.api.layout import Layout, Stage
from meshrun.api.presets import ModelShape
from meshrun.api.spec import CPU, JobSpec
from meshrun.planner.memory import layer_activation_elements

GEMM_EFFICIENCY = 0.72
"""Share of the dense peak a large bf16 matrix multiply reaches (cuBLAS on H100 and A100 runs
8192-cubed GEMMs at 75-80% of the datasheet peak)."""
GEMM_HALF_SIZE = 96.0
"""A matrix dimension d costs a factor d / (d + 96): small dimensions fill the tensor cores'
tiles and the GPU's waves poorly (a 1024-wide dimension loses 9%, a 128-wide one 43%)."""
ATTENTION_EFFICIENCY = 0.40
"""Share of the peak flash attention (FlashAttention-2, cuDNN) reaches, forward and backward
together, at head size 128."""
ATTENTION_BACKWARD = 2.5
"""Flash attention's backward costs 2.5 forwards (five matrix multiplies against two)."""
LINK_EFFICIENCY = 0.8
"""Share of a link's bandwidth NCCL's ring collectives reach (bus bandwidth over line rate)."""
COLLECTIVE_LATENCY_S = 20e-6
"""Fixed cost of one collective launch and synchronisation."""
MEMORY_EFFICIENCY = 0.8
"""Share of the memory bandwidth element-wise kernels reach."""
ELEMENTWISE_ACCESSES = 4.0
"""Times each kept activation element is written or read by element-wise kernels over a
forward and backward pass (written and read forward, its gradient written and read
backward)."""
LOSS_BYTES_PER_LOGIT = 20.0
"""Bytes moved per logit by the fp32 log-softmax, its backward and the casts (about five
fp32 passes over the logits)."""
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
    return {
        "wq,wk,wv": (tokens, (q + 2 * kv) / tp, h),  # column parallel
        "wo": (tokens, h, q / tp),  # row parallel
        "w1,w3": (tokens, 2 * f / tp, h),  # column parallel
        "w2": (tokens, h, f / tp),  # row parallel
    }


def layer_compute_seconds(
    shape: ModelShape, tokens: int, tp: int, peak: float
) -> tuple[float, float]:
    """(matmul seconds forward + backward, of which forward) of one block for ``tokens`` tokens of
    whole sequences on one of ``tp`` ranks."""
    q = shape.heads * shape.head_dim
    gemms = layer_gemms(shape, tokens, tp).values()
    total = sum(gemm_seconds(m, n, k, peak) for m, n, k in gemms)
    forward = sum(2 * m * n * k / (peak * gemm_efficiency(m, n, k)) for m, n, k in gemms)
    # Causal attention: QK^T and AV over half the s x s scores, 2 s^2 q FLOPs per sequence.
    sequences = tokens / shape.seq_len
    attention_forward = 2 * sequences * shape.seq_len**2 * q / tp
    head_factor = (
        shape.head_dim / (shape.head_dim + GEMM_HALF_SIZE) / (128 / (128 + GEMM_HALF_SIZE))
    )
    attention_rate = peak * ATTENTION_EFFICIENCY * head_factor
    attention = attention_forward * (1 + ATTENTION_BACKWARD) / attention_rate
    return total + attention, forward + attention_forward / attention_rate


def ring_seconds(bytes_: float, ranks: int, bandwidth: float) -> float:
    """An all-gather or reduce-scatter of a ``bytes_`` buffer over ``ranks`` ranks."""
    if ranks <= 1:
        return 0.0
    return bytes_ * (ranks - 1) / ranks / (bandwidth * LINK_EFFICIENCY) + COLLECTIVE_LATENCY_S


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


def rank_work(
    spec: JobSpec, layout: Layout, layers: int, first: bool, last: bool, checkpointing: str
) -> RankWork:
    """The compute, element-wise and TP time of one micro-batch on a rank holding ``layers``
    blocks (and the embedding when ``first``, the output head when ``last``)."""
    shape, t, res = spec.shape, layout.tp, spec.resources
    profile = res.profile
    peak = profile.peak_tflops * 1e12
    memory_rate = profile.memory_gbps * 1e9 * MEMORY_EFFICIENCY
    tokens = spec.training.micro_batch_size * shape.seq_len
    act_bytes = 2 if spec.training.precision == "bf16" else 4
    if spec.training.precision != "bf16":
        peak /= 8  # fp32 matmuls: TF32 off by default in torch, well under the bf16 peak
    layer, layer_forward = layer_compute_seconds(shape, tokens, t, peak)
    kept = layer_activation_elements(shape, t, "none")
    elementwise = tokens * kept * act_bytes * ELEMENTWISE_ACCESSES / memory_rate
    # Sequence parallelism: 2 all-gathers and 2 reduce-scatters of the s*b*h activation each
    # way per layer (Korthikanti et al. 2022, section 4.2.2).
    # A TP group wider than a pod (only expressible by hand) talks over the network.
    tp_link = (
        res.intra_node_bytes_per_second
        if t <= res.num_proc_per_node
        else res.inter_node_bytes_per_second
    )
    collective = ring_seconds(tokens * shape.hidden * act_bytes, t, tp_link)
    tp_forward = 4 * collective
    recompute = 0.0
    tp_recompute = 0.0
    if checkpointing == "full":
        recompute = layer_forward + elementwise / ELEMENTWISE_ACCESSES * 2
        tp_recompute = tp_forward
    elif checkpointing == "selective":
        saved = kept - layer_activation_elements(shape, t, "selective")
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
    parts = {
        "compute": layers * layer + head,
        "recompute": layers * recompute,
        "elementwise": layers * elementwise,
        "tensorParallel": layers * (2 * tp_forward + tp_recompute),
    }
    forward = layers * (layer_forward + elementwise / 2 + tp_forward) + head_forward
    total = sum(parts.values())
    parameters = layers * shape.layer_parameters()
    if first:
        parameters += shape.vocab * shape.hidden
    if last:
        parameters += shape.vocab * shape.hidden + shape.hidden
    return RankWork(forward, total - forward, parts, -(-parameters // t))


WorkCache = dict[tuple[int, bool, bool, int, str], "RankWork"]
"""A pipeline rank's work by (blocks, first, last, tp, checkpointing), for one job."""


def estimate_step(
    spec: JobSpec,
    layout: Layout,
    stages: list[Stage],
    checkpointing: str = "none",
    cache: WorkCache | None = None,
) -> StepEstimate:
    """The predicted optimizer step of ``layout`` (see the module docstring); ``cache`` keeps
    the ranks' work between calls for the same job (the search times hundreds of layouts)."""
    res, shape, training = spec.resources, spec.shape, spec.training
    p, v, m, n, t = layout.pp, layout.virtual_stages, layout.micro_batches, layout.dp, layout.tp
    profile: AcceleratorProfile = res.profile
    layers_on = [0] * p
    for stage in stages:
        layers_on[stage.pp] += stage.last - stage.first + 1
    known: WorkCache = {} if cache is None else cache
    works = []
    for key in {(layers_on[r], r == 0, r == p - 1, t, checkpointing) for r in range(p)}:
        if key not in known:  # balanced stages repeat a few shapes: compute each once
            known[key] = rank_work(spec, layout, key[0], key[1], key[2], checkpointing)
        works.append(known[key])
    busiest = max(works, key=lambda w: (w.forward + w.backward, w.parameters))
    slot = busiest.forward + busiest.backward
    passes = layout.grad_accumulation * (m if p > 1 else 1)
    breakdown = {part: seconds * passes for part, seconds in busiest.parts.items()}

    act_bytes = 2 if training.precision == "bf16" else 4
    intra, inter = res.intra_node_bytes_per_second, res.inter_node_bytes_per_second
    bubble = transfer = 0.0
    if p > 1:
        chunks = v if layout.schedule == "interleaved-1f1b" else 1
        # (p - 1) / v idle slots once m micro-batches fill the ring of p * v chunks; with m < p
        # one micro-batch's trip through all p ranks is the floor, however interleaved.
        slots = max((p - 1) / chunks, p + (m - 1) / chunks - m)
        bubble = slots * slot * layout.grad_accumulation
        # Sequence-parallel stages send each rank's 1/t of the activation (Megatron's
        # scatter-gather), forward and backward, for each of the rank's v chunks.
        apart = n * t >= res.num_proc_per_node and res.num_nodes > 1
        link = inter if apart else intra
        message = training.micro_batch_size * shape.seq_len * shape.hidden * act_bytes / t
        per_slot = 2 * v * (message / (link * LINK_EFFICIENCY) + COLLECTIVE_LATENCY_S)
        transfer = per_slot * (passes + slots * layout.grad_accumulation)
    breakdown["pipelineBubble"] = bubble
    breakdown["pipelineTransfer"] = transfer

    # Data-parallel traffic: fp32 gradients (the trainer and Megatron reduce in fp32), 16-bit
    # parameters gathered.
    # A data-parallel group spans n * t consecutive ranks (TP innermost, then DP).
    dp_link = inter if n * t > res.num_proc_per_node else intra
    local = busiest.parameters
    grad_bytes, param_bytes = local * 4, local * act_bytes
    forward_window = busiest.forward
    backward_window = busiest.backward
    exposed = 0.0
    if n > 1:
        if layout.zero_stage == 0:
            reduce = 2 * ring_seconds(grad_bytes, n, dp_link)
            exposed = max(0.0, reduce - backward_window)
        elif layout.zero_stage < 3 or p > 1:
            reduce = ring_seconds(grad_bytes, n, dp_link)
            gather = ring_seconds(param_bytes, n, dp_link)
            exposed = max(0.0, reduce - backward_window) + max(0.0, gather - forward_window)
        else:
            gather = ring_seconds(param_bytes, n, dp_link)
            reduce = ring_seconds(grad_bytes, n, dp_link)
            per_pass = max(0.0, gather - forward_window) + max(
                0.0, gather + reduce - backward_window
            )
            exposed = per_pass * passes
    breakdown["dataParallel"] = exposed
    sharded = local / n if layout.zero_stage >= 1 else local
    breakdown["optimizer"] = (
        sharded * ADAM_BYTES_PER_PARAMETER / (profile.memory_gbps * 1e9 * MEMORY_EFFICIENCY)
    )
    step = sum(breakdown.values())
    tokens = training.global_batch_size * shape.seq_len
    gpus = res.world_size
    per_gpu = tokens / step / gpus
    model_flops = (
        6 * (shape.layers * shape.layer_parameters() + shape.vocab * shape.hidden)
        + 12 * shape.layers * shape.seq_len * shape.heads * shape.head_dim
    )
    mfu = per_gpu * model_flops / (profile.peak_tflops * 1e12) if res.accelerator != CPU else 0.0
    return StepEstimate(step, per_gpu, mfu, breakdown)
