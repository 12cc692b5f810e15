"""Every rule a job must satisfy, written once.

``meshrun plan`` and the operator (its Invalid condition) run these through
:func:`meshrun.planner.plan.plan_job`; the trainer runs the model, layout and data rules on the
job document it reads (meshrun.jobdoc), so a job the planner accepts starts without a
configuration error. Each rule raises SpecError naming a spec field.

Rules the API server can check alone are also CEL rules of the CRD (``x-kubernetes-validations``);
those are the ``Rule`` constants below, whose messages appear word for word in the CRD
(tests/core/test_crd.py), so ``kubectl apply`` and ``meshrun plan`` say the same thing.
"""

from __future__ import annotations

import ipaddress

from meshrun.api.errors import Rule, SpecError
from meshrun.api.layout import Layout
from meshrun.api.policyspec import POLICY_RULES, check_policy
from meshrun.api.presets import ModelShape
from meshrun.api.spec import BYTE_VOCAB, JobSpec
from meshrun.rules.elastic import ELASTIC_RULES, check_elastic
from meshrun.rules.files import FILE_RULES, check_files_spec
from meshrun.rules.moe import MOE_RULES, check_expert_layout, check_moe_spec
from meshrun.rules.names import NAME_RULES, check_queue_name

CORPUS_BYTES = 10984
"""Bytes (tokens) of the corpus the trainer ships; a sequence needs seqLen + 1 of them."""


STRATEGY, MODEL, TRAINING, RESOURCES = (
    "spec.strategy",
    "spec.model",
    "spec.training",
    "spec.resources",
)
AUTO_DEGREES = Rule(
    f"{STRATEGY}.type",
    f"{STRATEGY}.type auto chooses dataParallel, contextParallel, pipelineParallel, "
    "tensorParallel and zeroStage itself; leave them unset (contextParallel 1) or pick a type",
)
DATA_PARALLEL_ONLY = Rule(
    f"{STRATEGY}.type",
    f"{STRATEGY}.pipelineParallel and {STRATEGY}.tensorParallel must be 1 (or unset) when "
    f"{STRATEGY}.type is ddp or "
    "zero",
)
DATA_PARALLEL_WORLD = Rule(
    f"{STRATEGY}.dataParallel",
    f"{STRATEGY}.dataParallel must equal the world size ({RESOURCES}.numNodes x numProcPerNode) "
    f"divided by {STRATEGY}.contextParallel when {STRATEGY}.type is ddp or zero",
)
DDP_ZERO = Rule(
    f"{STRATEGY}.zeroStage",
    f"{STRATEGY}.zeroStage must be 0 when {STRATEGY}.type is ddp (use type zero to shard)",
)
ZERO_STAGE = Rule(
    f"{STRATEGY}.zeroStage", f"{STRATEGY}.zeroStage must be 1, 2 or 3 when {STRATEGY}.type is zero"
)
PIPELINE_TP = Rule(
    f"{STRATEGY}.tensorParallel",
    f"{STRATEGY}.tensorParallel must be 1 (or unset) when {STRATEGY}.type is pipeline (use hybrid)",
)
TENSOR_PP = Rule(
    f"{STRATEGY}.pipelineParallel",
    f"{STRATEGY}.pipelineParallel must be 1 (or unset) when {STRATEGY}.type is tensor (use hybrid)",
)
VIRTUAL_STAGES = Rule(
    f"{STRATEGY}.virtualStages",
    f"{STRATEGY}.virtualStages above 1 needs {STRATEGY}.pipelineSchedule interleaved-1f1b",
)
INTERLEAVED_VIRTUAL = Rule(
    f"{STRATEGY}.virtualStages",
    f"{STRATEGY}.virtualStages must be at least 2 (or unset) for {STRATEGY}.pipelineSchedule "
    "interleaved-1f1b",
)
ONE_F_ONE_B = Rule(
    f"{STRATEGY}.microBatches",
    f"{STRATEGY}.microBatches must be at least {STRATEGY}.pipelineParallel for a layout run with "
    "torch's 1F1B schedule (the planner gives fewer micro-batches GPipe's order, which 1F1B "
    "reduces to)",
)
"""Not a CEL rule: the planner never hands the trainer such a layout (see
:func:`meshrun.planner.degrees.complete_layout`); the trainer checks it of what it reads."""
TP_PROCS = Rule(
    f"{STRATEGY}.tensorParallel",
    f"{STRATEGY}.tensorParallel must divide {RESOURCES}.numProcPerNode or be a multiple of it (a "
    "tensor-parallel group stays inside one pod or spans whole pods)",
)
DEGREES_WORLD = Rule(
    STRATEGY,
    f"{STRATEGY}.dataParallel x contextParallel x pipelineParallel x tensorParallel must equal "
    f"{RESOURCES}.numNodes x numProcPerNode",
)
CP_WORLD = Rule(
    f"{STRATEGY}.contextParallel",
    f"{STRATEGY}.contextParallel must divide the world size ({RESOURCES}.numNodes x "
    "numProcPerNode)",
)
CP_SEQUENCE = Rule(
    f"{STRATEGY}.contextParallel",
    f"{STRATEGY}.contextParallel must split {MODEL}.seqLen into 2 x contextParallel equal chunks "
    "(seqLen a multiple of 2 x contextParallel: each rank holds one early and one late chunk, so "
    "causal attention balances)",
)
CP_TP_SEQUENCE = Rule(
    f"{STRATEGY}.contextParallel",
    f"{MODEL}.seqLen / {STRATEGY}.contextParallel (a rank's tokens) must be a multiple of "
    f"{STRATEGY}.tensorParallel (sequence parallelism splits them further)",
)
"""Not a CEL rule: a preset's seqLen is not in the spec the API server sees."""
BATCH = Rule(
    f"{TRAINING}.globalBatchSize",
    f"{TRAINING}.globalBatchSize must be a multiple of {TRAINING}.microBatchSize",
)
DP_BATCH = Rule(
    f"{TRAINING}.globalBatchSize",
    f"{TRAINING}.globalBatchSize must be a multiple of {STRATEGY}.dataParallel x "
    f"{TRAINING}.microBatchSize",
)
TP_MODEL = Rule(
    f"{STRATEGY}.tensorParallel",
    f"{STRATEGY}.tensorParallel must divide {MODEL}.heads, kvHeads, ffnHidden, vocab and seqLen "
    "(tensor "
    "and sequence parallelism split them)",
)
PP_LAYERS = Rule(
    f"{STRATEGY}.pipelineParallel",
    f"{STRATEGY}.pipelineParallel must not exceed {MODEL}.layers (each stage needs a layer)",
)
HEADS = Rule(f"{MODEL}.heads", f"{MODEL}.heads must divide {MODEL}.hidden")
KV_HEADS = Rule(f"{MODEL}.kvHeads", f"{MODEL}.kvHeads must divide {MODEL}.heads")
ROTARY = Rule(
    f"{MODEL}.heads",
    f"{MODEL}.hidden / {MODEL}.heads (the head size) must be even for rotary embeddings",
)
PRODUCT_GPU = Rule(
    f"{RESOURCES}.acceleratorProduct",
    f"{RESOURCES}.acceleratorProduct names a GPU product and needs {RESOURCES}.accelerator "
    "nvidia.com/gpu",
)
CORPUS_VOCAB = Rule(
    f"{TRAINING}.dataset",
    f"{TRAINING}.dataset corpus is byte-tokenized and needs {MODEL}.vocab >= {BYTE_VOCAB}",
)
ALL_RULES = (
    AUTO_DEGREES,
    DATA_PARALLEL_ONLY,
    DATA_PARALLEL_WORLD,
    DDP_ZERO,
    ZERO_STAGE,
    PIPELINE_TP,
    TENSOR_PP,
    VIRTUAL_STAGES,
    INTERLEAVED_VIRTUAL,
    TP_PROCS,
    DEGREES_WORLD,
    CP_WORLD,
    CP_SEQUENCE,
    BATCH,
    DP_BATCH,
    TP_MODEL,
    PP_LAYERS,
    HEADS,
    KV_HEADS,
    ROTARY,
    CORPUS_VOCAB,
    PRODUCT_GPU,
    *FILE_RULES,
    *NAME_RULES,
    *POLICY_RULES,
    *ELASTIC_RULES,
    *MOE_RULES,
)
"""The rules the CRD also states as CEL."""


def check_spec(spec: JobSpec) -> None:
    """The rules that need no layout: the CRD's CEL rules, the model's, the job's own parts'
    (meshrun.rules.files) and the built-in data's."""
    s, t, res = spec.strategy, spec.training, spec.resources
    dp, pp, tp = s.data_parallel, s.pipeline_parallel, s.tensor_parallel
    cp = s.context_parallel
    unset_or_one = (None, 1)
    if s.type == "auto" and ((dp, pp, tp, s.zero_stage) != (None, None, None, None) or cp != 1):
        raise AUTO_DEGREES.error()
    if res.world_size % cp:
        raise CP_WORLD.error(f"{cp} does not divide {res.world_size}")
    check_context(cp, spec.shape)
    if s.type in ("ddp", "zero"):
        if pp not in unset_or_one or tp not in unset_or_one:
            raise DATA_PARALLEL_ONLY.error()
        if dp is not None and dp * cp != res.world_size:
            raise DATA_PARALLEL_WORLD.error(
                f"{dp}x{cp} = {dp * cp}, not the world size {res.world_size}"
            )
    if s.type == "ddp" and s.zero_stage not in (None, 0):
        raise DDP_ZERO.error()
    if s.type == "zero" and not s.zero_stage:
        raise ZERO_STAGE.error()
    if s.type == "pipeline" and tp not in unset_or_one:
        raise PIPELINE_TP.error()
    if s.type == "tensor" and pp not in unset_or_one:
        raise TENSOR_PP.error()
    if s.virtual_stages not in unset_or_one and s.pipeline_schedule != "interleaved-1f1b":
        raise VIRTUAL_STAGES.error()
    if s.pipeline_schedule == "interleaved-1f1b" and s.virtual_stages == 1:
        raise INTERLEAVED_VIRTUAL.error()
    if tp is not None and not tp_fits_pods(tp, res.num_proc_per_node):
        raise TP_PROCS.error(
            f"{tp} neither divides nor is a multiple of numProcPerNode={res.num_proc_per_node}"
        )
    if dp is not None and pp is not None and tp is not None:
        product = dp * cp * pp * tp
        if product != res.world_size:
            raise DEGREES_WORLD.error(f"{dp}x{cp}x{pp}x{tp} = {product}, not {res.world_size}")
    if res.accelerator_product is not None and res.accelerator != "nvidia.com/gpu":
        raise PRODUCT_GPU.error(f"accelerator is {res.accelerator}")
    if t.micro_batch_size is not None and t.global_batch_size % t.micro_batch_size:
        raise BATCH.error(f"{t.global_batch_size} and {t.micro_batch_size}")
    check_model(spec.shape)
    check_moe_spec(spec)
    check_files_spec(spec)
    check_queue_name(spec)
    check_policy(spec.run_policy.pod_failure_policy)
    check_egress(spec)
    check_elastic(spec)
    if t.data is None:
        check_data(spec.dataset, spec.shape)


def check_egress(spec: JobSpec) -> None:
    """Each allowed egress CIDR is an IPv4 or IPv6 network (a NetworkPolicy ipBlock's cidr)."""
    for index, cidr in enumerate(spec.networking.egress.allowed_cidrs or []):
        try:
            ipaddress.ip_network(cidr, strict=False)
        except ValueError:
            field = f"spec.networking.egress.allowedCIDRs[{index}]"
            raise SpecError(field, f"{cidr!r} is not a CIDR such as 10.20.0.0/16") from None


def check_model(shape: ModelShape) -> None:
    """The model's own rules: heads split the width, kv heads the heads, rotary pairs."""
    if not shape.head_size and shape.hidden % shape.heads:  # a given head size needs no split
        raise HEADS.error(f"{shape.heads} does not divide hidden={shape.hidden}")
    if shape.kv_heads > shape.heads or shape.heads % shape.kv_heads:
        raise KV_HEADS.error(f"{shape.kv_heads} does not divide heads={shape.heads}")
    if shape.head_dim % 2:
        raise ROTARY.error(f"{shape.hidden} / {shape.heads} = {shape.head_dim}")


def check_context(cp: int, shape: ModelShape) -> None:
    """Context parallelism's split of the sequence: 2 x cp equal chunks (load-balanced)."""
    if cp > 1 and shape.seq_len % (2 * cp):
        raise CP_SEQUENCE.error(f"seqLen={shape.seq_len} for contextParallel={cp}")


def check_data(dataset: str, shape: ModelShape) -> None:
    """What the training data needs from the model."""
    if dataset == "corpus" and shape.vocab < BYTE_VOCAB:
        raise CORPUS_VOCAB.error(f"got {shape.vocab}")
    if dataset == "corpus" and shape.seq_len + 1 >= CORPUS_BYTES:
        raise SpecError(
            f"{MODEL}.seqLen",
            f"{shape.seq_len} must be below {CORPUS_BYTES - 1} for {TRAINING}.dataset corpus (the "
            f"shipped text has {CORPUS_BYTES} bytes); use dataset synthetic for longer sequences",
        )


def tp_fits_pods(tp: int, num_proc_per_node: int) -> bool:
    """Whether a TP group of ``tp`` consecutive ranks lies inside one pod or over whole pods."""
    return num_proc_per_node % tp == 0 or tp % num_proc_per_node == 0


def tp_unsplit(shape: ModelShape, tp: int) -> str | None:
    """The first of the sizes tensor parallelism splits that ``tp`` does not divide
    (``kvHeads=3``), or None when it divides them all."""
    for name, size in (
        ("heads", shape.heads),
        ("kvHeads", shape.kv_heads),
        ("ffnHidden", shape.ffn_hidden),
        ("vocab", shape.vocab),
        ("seqLen", shape.seq_len),  # sequence parallelism shards the sequence
    ):
        if size % tp:
            return f"{name}={size}"
    return None


def check_layout(
    layout: Layout,
    shape: ModelShape,
    *,
    global_batch_size: int,
    world_size: int | None = None,
    num_proc_per_node: int | None = None,
) -> None:
    """A layout's rules against the model, the batch and (when known) the machines."""
    dp, cp, pp, tp = layout.dp, layout.cp, layout.pp, layout.tp
    if world_size is not None and layout.world_size != world_size:
        raise DEGREES_WORLD.error(f"{dp}x{cp}x{pp}x{tp} = {layout.world_size}, not {world_size}")
    if num_proc_per_node is not None and not tp_fits_pods(tp, num_proc_per_node):
        raise TP_PROCS.error(
            f"{tp} neither divides nor is a multiple of numProcPerNode={num_proc_per_node}"
        )
    unsplit = tp_unsplit(shape, tp)
    if unsplit is not None:
        raise TP_MODEL.error(f"{tp} does not divide {unsplit}")
    check_context(cp, shape)
    if (shape.seq_len // cp) % tp:
        raise CP_TP_SEQUENCE.error(f"{shape.seq_len} / {cp} for tensorParallel={tp}")
    if not 0 <= layout.zero_stage <= 3:
        raise SpecError(f"{STRATEGY}.zeroStage", f"must be 0, 1, 2 or 3, got {layout.zero_stage}")
    chunks = layout.num_stages
    if chunks > shape.layers:
        stages = f"{pp} stages" + (
            f" x {layout.virtual_stages} virtual stages" if layout.virtual_stages > 1 else ""
        )
        raise PP_LAYERS.error(f"{stages} for layers={shape.layers}")
    check_expert_layout(layout, shape)
    check_batch(layout, global_batch_size)
    check_schedule(layout)


def check_batch(layout: Layout, global_batch_size: int) -> None:
    """The global batch splits into dp x micro-batches x accumulation passes of the layout's
    micro-batch size."""
    size = layout.micro_batch_size
    if not isinstance(size, int) or size < 1:  # a hand-written job document's plan
        raise SpecError(f"{TRAINING}.microBatchSize", f"must be at least 1, got {size!r}")
    per_pass = layout.dp * layout.micro_batch_size
    if global_batch_size % per_pass:
        raise DP_BATCH.error(
            f"{global_batch_size} against {layout.dp}x{layout.micro_batch_size} = {per_pass}"
        )
    passes = global_batch_size // per_pass
    if passes % layout.micro_batches:
        raise SpecError(
            f"{STRATEGY}.microBatches",
            f"{layout.micro_batches} must divide globalBatchSize / (dataParallel x "
            f"microBatchSize) = {passes}",
        )
    if layout.micro_batches * layout.grad_accumulation != passes:
        raise SpecError(
            f"{TRAINING}.globalBatchSize",
            f"{global_batch_size} must equal dataParallel x microBatchSize x microBatches x "
            f"gradient accumulation = {per_pass}x{layout.micro_batches}x"
            f"{layout.grad_accumulation}",
        )


def check_schedule(layout: Layout) -> None:
    """What torch's pipeline schedules accept."""
    pp, micro, virtual = layout.pp, layout.micro_batches, layout.virtual_stages
    if pp == 1:
        if micro != 1 or virtual != 1:
            raise SpecError(f"{STRATEGY}.microBatches", "must be 1 without pipeline parallelism")
        return
    if layout.schedule == "1f1b" and micro < pp:
        # torch's Schedule1F1B raises ValueError below one micro-batch per stage.
        raise ONE_F_ONE_B.error(f"{micro} micro-batches for pipelineParallel={pp}")
    if layout.schedule == "interleaved-1f1b":
        if virtual < 2:
            raise INTERLEAVED_VIRTUAL.error(f"got {virtual}")
        # Megatron-LM runs interleaved micro-batches in groups of pp (Narayanan et al. 2021,
        # section 2.2); torch's ScheduleInterleaved1F1B relaxes that to whole "rounds" of
        # max(1, m // pp) and raises ValueError otherwise (torch 2.13 pipelining/schedules.py).
        rounds = max(1, micro // pp)
        if micro % rounds:
            raise SpecError(
                f"{STRATEGY}.microBatches",
                f"{micro} must be a multiple of max(1, microBatches // pipelineParallel) = "
                f"{rounds} for interleaved-1f1b",
            )
    elif virtual != 1:
        raise VIRTUAL_STAGES.error(f"got {virtual} with {layout.schedule}")
