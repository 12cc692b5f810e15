"""Per-accelerator memory estimate of a layout.

Model states follow the ZeRO paper (Rajbhandari et al. 2020, arXiv 1910.02054, section 3.1 and
figure 1): mixed-precision Adam keeps 2 B of bf16 weights, 2 B of bf16 gradients and K = 12 B of
fp32 master weights and moments per parameter (plain fp32: 4 + 4 + 8). Stage 1 divides the
optimizer part by the data-parallel degree N, stage 2 also the gradients, stage 3 also the
weights. Tensor parallelism divides a stage's weights by t; pipeline parallelism gives each rank
its own layers (plus the embedding on the first stage and the output head on the last).

Activations per transformer layer: Korthikanti et al. 2022's accounting (arXiv 2205.05198,
section 4: every tensor autograd keeps for backward, per token) applied to the trainer's Llama
block (RMSNorm, rotary attention, SwiGLU of width f or the two-matrix GeLU MLP, no dropout)
instead of GPT's; see
:func:`layer_activation_elements`. torch's scaled_dot_product_attention keeps no a*s*s score
matrix on any backend it picks for causal attention (flash, memory-efficient or cuDNN on GPUs,
flash on CPUs), so Korthikanti's 5*a*s/h term never appears. Activation checkpointing (see
meshrun_trainer.distributed.blocks) keeps less: ``selective`` keeps the outputs of the matrix
multiplies and of attention, ``full`` only each layer's input (2*s*b*h bytes in bf16, Korthikanti's
full recomputation) plus, while one layer is recomputed, that layer's full set.
The pipeline schedule sets how many micro-batches are in flight on a rank: GPipe keeps all m,
1F1B at most p - i on stage i, interleaving multiplies 1F1B's by 1 + (p-1)/(p*v) (Narayanan et
al. 2021, arXiv 2104.04473, section 2.2). The last stage also holds the logits s*b*V/t (16-bit
under bf16), which the trainer's cross-entropy keeps for backward with one fp32 number a row,
and the final norm's tensors, and at the start of backward the logits' gradient and one slice
of fp32 scratch (meshrun_trainer.models.loss).

FSDP2 (ZeRO-2 and 3, and ZeRO-1 beside TP or PP: see :func:`sharded_by_fsdp`) keeps fp32
parameter shards and reduces gradients into fp32 shards (:func:`fsdp_states`). Under pipelining
it keeps a stage's parameters gathered for the whole step (no all-gather per micro-batch), so
its weights count whole, as under ZeRO-2, and its gradients accumulate whole until the last
micro-batch's backward. Its working set beyond the shards (``gathered``) is, under ZeRO-3, the
largest unit (a block, the embedding or the head, as the trainer wraps them) gathered, the next
unit prefetched, the unit's unsharded gradient and the previous unit's reduce-scatter input;
under ZeRO-2 and pipelining one unit's gradient buffers. DDP's gradients are views into its
buckets (no copy beside them). Outside FSDP2 a gradient arriving under accumulation exists
beside the one it is added into, and under TP the embedding's gradient arrives whole (DTensor
computes it so before the trainer reshards it): both count with the gradients.
Context parallelism (cp ranks per sequence, each holding 2 of its 2 x cp chunks) gives every
rank s / cp of each sequence's tokens, so every term above that scales with the sequence counts
s / cp tokens; the ZeRO and FSDP2 shards are over the dp x cp ranks that hold the same
parameters (torchtitan shards over dp_shard x cp, Megatron's distributed optimizer over its
data-parallel group with context). What it adds: attention reads the keys and values of the
whole sequence, all-gathered (Llama 3's context parallelism, Dubey et al. 2024, section
3.3.2), expanded to every query head as the trainer's attention does for grouped-query
attention, and keeps them for backward: 2q/t elements per token of the whole sequence, cp
times a rank's own share (:func:`layer_activation_elements`). Selective and full checkpointing
keep neither: the all-gather runs again in the recomputation, and while one layer recomputes,
its whole sequence's keys and values exist again (the recomputation term). Under ZeRO-0 in a
hybrid the trainer's FSDP2 replicates over dp and shards over cp (HSDP, torchtitan's
dp_shard x cp), so there the parameters shard over the cp ranks (:func:`fsdp_shards`).
bench/trainer_run_memory.py measures every layout family's whole-run peak against this
estimate. The estimate ignores the process's fixed part (the CUDA context, torch, the
communication library) and allocator fragmentation on GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshrun.api.fsdpunits import block_unit_parameters
from meshrun.api.layout import Layout, Stage, layers_per_rank
from meshrun.api.presets import MLP_MATRICES, ModelShape
from meshrun.api.spec import CPU, JobSpec
from meshrun.planner.moe import (
    compute_spec,
    dispatch_bytes,
    expert_parameters,
    moe_layers_per_rank,
    routed_parameters,
)

CHECKPOINTING = ("none", "selective", "full")
"""Activation checkpointing modes, least recomputation first."""


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per accelerator on the most loaded pipeline rank."""

    params: int
    """Model weights held (bf16, or fp32 for fp32 training)."""
    grads: int
    """Gradients held, with the one arriving beside its accumulation and, under tensor
    parallelism, the embedding's gradient as DTensor computes it (whole)."""
    optimizer: int
    """Optimizer state held (fp32 master weights and Adam moments)."""
    activations: int
    """Activations kept for backward, for the micro-batches in flight."""
    accelerator_bytes: int
    """Memory of one accelerator; 0 when unknown (no fit check)."""
    gathered: int = 0
    """FSDP2's working set beyond the shards: under ZeRO-3 the largest unit (a block, the
    embedding or the head) gathered whole while it computes, the next one prefetched, its
    unsharded gradient and the previous unit's reduce-scatter input; under ZeRO-2 and
    pipelining the gradient and reduce-scatter buffers of one unit."""

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer + self.activations + self.gathered

    @property
    def fits(self) -> bool:
        return self.accelerator_bytes == 0 or self.total <= self.accelerator_bytes


LOSS_SLICE_ELEMENTS = 32 * 2**20
"""Logits the trainer's cross-entropy turns into fp32 at a time (meshrun_trainer.models.loss): one
slice of rows is at most 128 MiB of scratch."""
REDUCE_BYTES = 4
"""FSDP2 reduces gradients in fp32 (the trainer's MixedPrecisionPolicy, and fp32 training)."""
ADAM_MOMENTS = 8
"""Adam's two fp32 moments per parameter."""


def loss_slice_rows(vocab: int) -> int:
    """Rows of logits (``vocab`` of them per row, on this rank) in one slice of the loss."""
    return max(1, LOSS_SLICE_ELEMENTS // vocab)


def sharded_by_fsdp(layout: Layout) -> bool:
    """Whether the trainer's data parallelism is FSDP2 sharding
    (meshrun_trainer.distributed.parallel): ZeRO-2 and 3, and ZeRO-1 beside tensor or pipeline
    parallelism (FSDP2 has no optimizer-only sharding, so there it shards the gradients too) or
    expert parallelism (ZeroRedundancyOptimizer would broadcast one rank's experts over
    another's);
    and ZeRO-0 beside them with context parallelism (HSDP sharding over the cp ranks)."""
    return fsdp_shards(layout) > 1


def fsdp_shards(layout: Layout) -> int:
    """The ranks FSDP2 shards each parameter over: the dp x cp ranks holding the same
    parameters under ZeRO-1 to 3 (ZeRO-1 only beside TP, PP or EP), the cp ranks under ZeRO-0
    beside TP or PP (HSDP: replicated over dp), else 1 (DDP, with ZeroRedundancyOptimizer under
    ZeRO-1, or nothing to shard)."""
    beside = layout.pp > 1 or layout.tp > 1
    if layout.zero_stage >= 2 or (layout.zero_stage == 1 and (beside or layout.ep > 1)):
        return layout.data_shards
    if layout.zero_stage == 0 and beside:
        return layout.cp
    return 1


def fsdp_states(local: int, n: int, layout: Layout, precision: str) -> tuple[int, int, int]:
    """(params, grads, optimizer) bytes of ``local`` parameters sharded by FSDP2 over ``n``.

    The shards are fp32 parameters (under bf16 the master weights, the paper's K = 12 B less
    Adam's 8 B of moments, which the optimizer part keeps), their gradients are reduced into
    fp32 shards, and the moments follow the shards. Without resharding after forward (ZeRO-2
    and every stage of a pipeline) the whole compute copy of the weights is held through the
    step; under pipelining the gradients also accumulate whole over the micro-batches (the
    reduce-scatter waits for the last backward), in fp32.
    """
    weight_b = bytes_per_parameter(precision)[0]
    shard = -(-local // n)
    params, grads = shard * 4, shard * REDUCE_BYTES
    if layout.zero_stage < 3 or layout.pp > 1:
        params += local * weight_b
    if layout.pp > 1:
        grads += local * REDUCE_BYTES
    return params, grads, shard * ADAM_MOMENTS


def element_bytes(precision: str) -> int:
    """Bytes of one element in the training precision (an activation, or a weight as the
    collectives gather it): 2 under bf16, 4 in fp32."""
    return 2 if precision == "bf16" else 4


def bytes_per_parameter(precision: str) -> tuple[int, int, int]:
    """(weights, gradients, optimizer) bytes per parameter for Adam (ZeRO paper, section 3.1)."""
    return (2, 2, 12) if precision == "bf16" else (4, 4, 8)


def layer_activation_elements(
    shape: ModelShape, tp: int, checkpointing: str = "none", cp: int = 1
) -> float:
    """Elements one transformer layer keeps for backward per token of a rank's own share of
    the sequence, with sequence-parallel TP and ``cp``-way context parallelism.

    With q = heads*head_dim, kv = kv_heads*head_dim, a = heads; under TP the tensors along the
    sequence (norm inputs and outputs, the residual) are split t ways, the column-parallel
    outputs hold a/t heads or f/t columns, and each norm's output is gathered whole for the
    column-parallel matrices:

    - none: block input, normalized input, residual, normalized residual (4h/t), both norms'
      outputs, which the column-parallel matrices read gathered but backward keeps as their
      sequence shards and gathers again, as Megatron-LM does (2h/t), q, k and v as attention
      reads them and attention's output (4q/t), w1 and w3 outputs, SiLU's output and the
      product (4f/t; a GeLU MLP keeps w1's output and GeLU's, 2f/t), attention's log-sum-exp
      (a/t) and the norms' reciprocal RMS (2/t);
    - selective: the block input (h/t), the outputs of wq, wk, wv and attention (2q/t + 2kv/t
      + a/t), of w1 and w3 (2f/t; a GeLU MLP's w1, f/t), and of wo and w2 (2h; under TP their
      partial sums, h each, and their reduce-scattered results, h/t each);
    - full: the block input (h/t).

    Under context parallelism attention reads (and keeps) the keys and values of the whole
    sequence, cp times a rank's share: k and v count 2q*cp/t instead of 2q/t. Selective
    checkpointing keeps wk's and wv's own outputs and gathers again in backward.
    """
    h, f, t, a = shape.hidden, shape.ffn_hidden, tp, shape.heads
    q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    up = MLP_MATRICES[shape.mlp] - 1  # the MLP's column-parallel outputs: w1 and w3, or w1
    if checkpointing == "full":
        return h / t
    if checkpointing == "selective":
        outputs = 2 * h if t == 1 else 2 * h + 2 * h / t
        return h / t + (2 * q + 2 * kv + a + up * f) / t + outputs
    return (6 * h + 2 * q + 2 * q * cp + 2 * up * f + a + 2) / t


def layer_activation_bytes(
    spec: JobSpec, tp: int, micro_batch: int, checkpointing: str = "none", cp: int = 1
) -> int:
    """Bytes one transformer layer keeps for backward for one micro-batch on one rank (16-bit
    activations in bf16, 32-bit in fp32); under context parallelism a rank's s / cp tokens."""
    per_element = element_bytes(spec.training.precision)
    elements = layer_activation_elements(spec.shape, tp, checkpointing, cp)
    return int(spec.shape.seq_len // cp * micro_batch * elements * per_element)


def in_flight(layout: Layout, pp_rank: int) -> float:
    """Micro-batches whose activations pipeline rank ``pp_rank`` holds at its peak."""
    p, m = layout.pp, layout.micro_batches
    if p == 1:
        return 1.0
    if layout.schedule == "gpipe":
        return float(m)
    one_f_one_b = float(min(m, p - pp_rank))
    if layout.schedule == "interleaved-1f1b":
        return one_f_one_b * (1 + (p - 1) / (p * layout.virtual_stages))
    return one_f_one_b


def estimate_memory(
    spec: JobSpec, layout: Layout, stages: list[Stage], checkpointing: str = "none"
) -> MemoryEstimate:
    """The estimate for the pipeline rank with the largest total."""
    layers_on = layers_per_rank(stages, layout.pp)
    moe_on = moe_layers_per_rank(spec.shape, stages, layout.pp)
    kept = ActivationTerms.of(spec, layout, checkpointing)
    gathered = fsdp_working_set(spec, layout)
    temporaries = step_temporaries(spec, layout)
    arriving = arriving_gradient(spec, layout)
    best: tuple[int, int, int, int, int] | None = None
    seen: set[tuple[int, bool, bool]] = set()
    for rank in range(layout.pp):
        # A later rank with the same blocks holds no more micro-batches in flight.
        shape_of_rank = (layers_on[rank], rank == 0, rank == layout.pp - 1)
        if shape_of_rank in seen:
            continue
        seen.add(shape_of_rank)
        params, grads, optim = model_states(spec, layout, rank, layers_on[rank], moe_on[rank])
        activations = kept.on_rank(layout, rank, layers_on[rank], moe_on[rank])
        grads += arriving
        if rank == 0:
            grads += embedding_gradient(spec, layout, activations)
        parts = (params, grads, optim + temporaries, activations, gathered)
        if best is None or sum(parts) > sum(best):
            best = parts
    assert best is not None
    params, grads, optim, activations, gathered = best
    accelerator_bytes = spec.resources.accelerator_bytes
    return MemoryEstimate(params, grads, optim, activations, accelerator_bytes, gathered)


@dataclass(frozen=True)
class ActivationTerms:
    """What a rank keeps for backward, before counting its layers and micro-batches."""

    per_layer: int
    """One layer's activations for one micro-batch."""
    recompute: int
    """The working set of one layer's recomputation under checkpointing (0 without)."""
    dispatch: int
    """One MoE layer's token dispatch buffers for one micro-batch."""
    head: int
    """The last stage's logits and final norm's tensors."""
    head_grads: int
    """The logits' gradient and one slice of the loss's fp32 scratch, as backward starts."""

    @classmethod
    def of(cls, spec: JobSpec, layout: Layout, checkpointing: str) -> ActivationTerms:
        model, t, cp, micro_batch = spec.shape, layout.tp, layout.cp, layout.micro_batch_size
        dense = compute_spec(spec)  # a mixture of experts as the MLP its busiest rank runs
        per_element = element_bytes(spec.training.precision)
        recompute = 0
        if checkpointing == "full":
            # Full recomputation rebuilds one layer's whole set at a time, for one micro-batch.
            recompute = layer_activation_bytes(dense, t, micro_batch, cp=cp)
        elif checkpointing == "selective" and cp > 1:
            # One layer's recomputation gathers the whole sequence's keys and values again and
            # expands them to every query head for attention's backward.
            recompute = 2 * model.heads * model.head_dim // t * model.seq_len * micro_batch
            recompute *= per_element
        tokens = model.seq_len // cp * micro_batch
        # The (vocabulary-sharded) logits, which the loss keeps for backward with one fp32
        # number a row; the final norm's input and normalized input (sequence-sharded) and its
        # gathered output.
        local_vocab = model.vocab // t
        head = tokens * (
            per_element * local_vocab + per_element * (2 * model.hidden // t + model.hidden)
        )
        # Backward starts with the logits' gradient, built one slice of rows at a time in fp32
        # scratch; they are gone before full recomputation rebuilds the last layer, so the
        # larger counts.
        head_grads = (
            tokens * per_element * local_vocab
            + 4 * min(tokens, loss_slice_rows(local_vocab)) * local_vocab
        )
        return cls(
            per_layer=layer_activation_bytes(dense, t, micro_batch, checkpointing, cp),
            recompute=recompute,
            dispatch=dispatch_bytes(model, tokens, per_element),
            head=head,
            head_grads=head_grads,
        )

    def on_rank(self, layout: Layout, rank: int, layers: int, moe_layers: int) -> int:
        """Bytes pipeline rank ``rank`` keeps at its peak, holding ``layers`` layers (of them
        ``moe_layers`` mixtures of experts)."""
        held = self.per_layer * layers + self.dispatch * moe_layers
        activations = int(held * in_flight(layout, rank)) + self.recompute
        if rank == layout.pp - 1:
            activations += self.head + max(self.head_grads - self.recompute, 0)
        return activations


def model_states(
    spec: JobSpec, layout: Layout, rank: int, layers: int, moe_layers: int
) -> tuple[int, int, int]:
    """(params, grads, optimizer) bytes pipeline rank ``rank`` holds for its ``layers`` layers
    (``moe_layers`` of them mixtures of experts), its embedding or head, and its experts."""
    model, precision = spec.shape, spec.training.precision
    weight_b, grad_b, optim_b = bytes_per_parameter(precision)
    # Routed experts are counted apart: spread over the EP group, never sharded by ZeRO.
    count = layers * (model.layer_parameters() - routed_parameters(model))
    if rank == 0:
        count += model.vocab * model.hidden
    if rank == layout.pp - 1:
        # A tied head shares the embedding's weight on one stage; a last stage of its own keeps
        # a copy (synchronised with the first stage's).
        shared = model.tie_embeddings and rank == 0
        count += (0 if shared else model.vocab * model.hidden) + model.hidden
    local = -(-count // layout.tp)
    if sharded_by_fsdp(layout):
        params, grads, optim = fsdp_states(local, fsdp_shards(layout), layout, precision)
    else:
        params, grads, optim = local * weight_b, local * grad_b, local * optim_b
        if layout.zero_stage >= 1:
            optim = -(-optim // layout.data_shards)  # ZeroRedundancyOptimizer
    experts = expert_parameters(model, moe_layers, layout.ep)
    return params + experts * weight_b, grads + experts * grad_b, optim + experts * optim_b


def fsdp_working_set(spec: JobSpec, layout: Layout) -> int:
    """FSDP2's bytes beyond the shards (:attr:`MemoryEstimate.gathered`), 0 outside FSDP2."""
    if not sharded_by_fsdp(layout):
        return 0
    model = spec.shape
    weight_b, grad_b, _ = bytes_per_parameter(spec.training.precision)
    block = block_unit_parameters(model, layout)  # a block, or its largest matrix
    unit = max(block, -(-(model.vocab * model.hidden + model.hidden) // layout.tp))
    if layout.pp > 1:  # ZeRO-3 does not reshard between micro-batches
        return unit * REDUCE_BYTES  # the gradients accumulate whole until the last backward
    if layout.zero_stage >= 3:
        # Backward of one unit: its weights and the next unit's (prefetched), its unsharded
        # gradient, and the previous unit's reduce-scatter input (fp32), kept until this unit's
        # reduce-scatter starts.
        return unit * (2 * weight_b + grad_b + REDUCE_BYTES)
    return unit * (grad_b + REDUCE_BYTES)  # every unit's weights are counted whole


def step_temporaries(spec: JobSpec, layout: Layout) -> int:
    """The optimizer step's temporaries beside its state.

    On CUDA AdamW is fused (no temporaries). On CPUs it updates one parameter at a time and
    makes two temporaries of it (the square root of the second moment, then its quotient by
    the bias correction): two of the largest (local) parameter, in fp32. The step's working set
    is freed before the optimizer step, but on CPUs its pages stay in malloc's heaps while a
    temporary of 1 MiB or more gets a mapping of its own
    (meshrun_trainer.distributed.hostmemory), so there the temporaries count in full.
    """
    if spec.resources.accelerator != CPU:
        return 0
    model = spec.shape
    largest = -(-max(model.vocab, model.ffn_hidden) * model.hidden // layout.tp)
    shards = fsdp_shards(layout)
    return 2 * 4 * (-(-largest // shards) if shards > 1 else largest)


def arriving_gradient(spec: JobSpec, layout: Layout) -> int:
    """A gradient arriving while the accumulated ones are held (micro-batches under
    accumulation or pipelining): autograd adds each new gradient into the one kept, so the
    largest local one exists twice for a moment. FSDP2 reduces into its own shards (counted in
    :func:`fsdp_working_set`), so there it is 0."""
    accumulating = layout.grad_accumulation > 1 or layout.micro_batches > 1
    if not accumulating or sharded_by_fsdp(layout):
        return 0
    model = spec.shape
    grad_b = bytes_per_parameter(spec.training.precision)[1]
    return grad_b * -(-max(model.vocab, model.ffn_hidden) * model.hidden // layout.tp)


def embedding_gradient(spec: JobSpec, layout: Layout, activations: int) -> int:
    """What the first stage's embedding gradient adds beside the rest, its ``activations``
    held at their peak.

    Under TP, DTensor computes the vocabulary-sharded embedding's gradient whole on every rank
    before the trainer reshards it, at any accumulation, as the last step of a micro-batch's
    backward. That one micro-batch's activations are freed by then (the other micro-batches in
    flight still held), and on an accelerator the caching allocator gives their blocks to the
    gradient. On CPUs it cannot: they were small tensors, whose pages malloc keeps in its
    heaps, and a gradient of 1 MiB or more gets a mapping of its own
    (meshrun_trainer.distributed.hostmemory).
    """
    if layout.tp == 1:
        return 0
    model = spec.shape
    whole = bytes_per_parameter(spec.training.precision)[1] * model.vocab * model.hidden
    on_cpu = spec.resources.accelerator == CPU
    freed = 0 if on_cpu else int(activations / in_flight(layout, 0))
    return max(0, whole - freed)
