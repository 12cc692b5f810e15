"""Sentences for a plan's ``explanation`` and ``warnings``."""

from __future__ import annotations

from meshrun.api.hardware import DEFAULT_PRODUCT, PROFILES
from meshrun.api.layout import Layout
from meshrun.api.spec import CPU, DEFAULT_GPU_MEMORY_GIB, JobSpec
from meshrun.planner.memory import MemoryEstimate

SHORT_CHUNK = 1024
"""Context-parallel chunks (seqLen / (2 x cp)) shorter than this get a warning."""
ZERO_WHAT = {
    1: "optimizer state",
    2: "optimizer state and gradients",
    3: "optimizer state, gradients and parameters",
}


def parameter_text(count: int) -> str:
    """A parameter count as 6.74B or 246.3K."""
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if count >= scale:
            return f"{count / scale:.2f}{suffix}"
    return str(count)


def describe(spec: JobSpec, strategy: str, layout: Layout) -> list[str]:
    """What the layout does, in the terms of the strategy table (docs/planner.md)."""
    lines: list[str] = []
    dp, pp, tp = layout.dp, layout.pp, layout.tp
    if dp == 1 and layout.cp == 1 and strategy == "ddp":
        lines.append("A single process: nothing to split (DDP with one replica).")
    elif dp > 1:
        lines.append(
            f"Data parallel over {dp} replicas, one process per "
            f"{'CPU slot' if spec.resources.accelerator == CPU else 'GPU'}, gradients "
            "all-reduced as DDP does; DDP supersedes the single-process DataParallel, where "
            "GPU 0 scatters inputs and gathers outputs every step."
        )
    if layout.zero_stage:
        over = f"{dp} data-parallel ranks"
        if layout.cp > 1:
            over = f"{layout.data_shards} data- and context-parallel ranks"
        lines.append(
            f"ZeRO-{layout.zero_stage} shards {ZERO_WHAT[layout.zero_stage]} over the {over}."
        )
    per_pod = spec.resources.num_proc_per_node
    cp = layout.cp
    if cp > 1:
        span = "inside one pod" if cp * tp <= per_pod else f"over {cp * tp // per_pod} pods"
        lines.append(
            f"Context parallel {cp} splits each sequence of {spec.shape.seq_len:,} tokens over "
            f"{cp} ranks {span} (2 x {cp} chunks, rank i holding chunks i and {2 * cp - 1}-i, so "
            "causal attention costs each the same); every attention layer all-gathers the "
            "sequence's keys and values and reduce-scatters their gradients in backward."
        )
    if 1 < tp <= per_pod:
        lines.append(
            f"Tensor parallel {tp} splits every layer's matrices over {tp} processes of one pod "
            "(an all-reduce per layer, so the group stays on the node's fast links)."
        )
    elif tp > per_pod:
        lines.append(
            f"Tensor parallel {tp} splits every layer's matrices over {tp // per_pod} whole pods "
            "(an all-reduce per layer over the network between them)."
        )
    if pp > 1:
        bubble = layout.bubble_fraction()
        chunks = f" x {layout.virtual_stages} virtual stages" if layout.virtual_stages > 1 else ""
        lines.append(
            f"Pipeline of {pp} stages{chunks} ({layout.schedule}, {layout.micro_batches} "
            f"micro-batches per step): bubble (p-1)/(v*m+p-1) = {bubble:.0%} of each step."
        )
        if layout.micro_batches == 1:
            lines.append(
                "With microBatches 1 this is plain (naive) model parallelism: one "
                f"stage works at a time, a (p-1)/p = {(pp - 1) / pp:.0%} bubble; more "
                "micro-batches shrink it."
            )
    where = (
        "a TP group never leaves a pod"
        if tp <= per_pod
        else f"each TP group holds {tp // per_pod} whole pods"
    )
    order = "TP innermost, then " + ("CP, DP" if cp > 1 else "DP") + ", PP outermost"
    lines.append(
        f"Ranks run {order}, so {where}"
        + (
            " and each pod holds one pipeline stage."
            if pp > 1 and (dp * cp * tp) % per_pod == 0
            else "."
        )
    )
    return lines


def warn(spec: JobSpec, layout: Layout, memory: MemoryEstimate) -> list[str]:
    """Things that are allowed but probably unintended or slow."""
    res, s = spec.resources, spec.strategy
    warnings: list[str] = []
    if res.memory_assumed:
        warnings.append(
            f"spec.resources.acceleratorMemoryGiB is unset: assuming {DEFAULT_GPU_MEMORY_GIB} GiB."
        )
    product = res.accelerator_product
    if product is not None and product not in PROFILES:
        warnings.append(
            f"spec.resources.acceleratorProduct {product} has no built-in profile: the step-time "
            f"estimate assumes an {DEFAULT_PRODUCT}"
            + ("." if res.accelerator_memory_gib else " and its memory.")
        )
    if layout.tp > 1 and not res.fast_intra_node:
        warnings.append(
            "Tensor parallelism over PCIe: its per-layer all-reduces are slow without NVLink."
        )
    if layout.pp > 1 and layout.micro_batches < layout.pp:
        order = (
            " They run in GPipe's order, which 1F1B reduces to with fewer micro-batches than "
            "stages."
            if s.pipeline_schedule == "1f1b"
            else ""
        )
        warnings.append(
            f"microBatches {layout.micro_batches} is below pipelineParallel {layout.pp}: "
            f"stages sit idle {layout.bubble_fraction():.0%} of each step.{order}"
        )
    if layout.tp > res.num_proc_per_node:
        warnings.append(
            f"tensorParallel {layout.tp} spans {layout.tp // res.num_proc_per_node} pods: its "
            "collectives, several per layer, cross the network between them."
        )
    chunk = spec.shape.seq_len // (2 * layout.cp)
    if layout.cp > 1 and chunk < SHORT_CHUNK and res.accelerator != CPU:
        warnings.append(
            f"contextParallel {layout.cp} cuts seqLen {spec.shape.seq_len} into chunks of "
            f"{chunk} tokens: each rank's matrices are small and the key/value all-gathers' "
            "latency weighs; context parallelism pays off on long sequences."
        )
    if layout.pp == 1 and s.micro_batches not in (None, 1):
        warnings.append("spec.strategy.microBatches is ignored without pipeline parallelism.")
    if layout.zero_stage and layout.dp == 1:
        warnings.append("spec.strategy.zeroStage has no effect with dataParallel 1.")
    if layout.pp > 1 and layout.zero_stage >= 2:
        warnings.append(
            "ZeRO-2/3 with pipeline parallelism keeps each stage's parameters gathered through "
            "the step (no all-gather per micro-batch), so ZeRO-3 saves no more than ZeRO-2, and "
            "reduce-scatters gradients once per gradient-accumulation step."
        )
    limit = memory.accelerator_bytes
    if limit and 0.9 * limit < memory.total <= limit:
        warnings.append(
            "The estimate is within 10% of accelerator memory; it leaves out the CUDA context "
            "and allocator fragmentation."
        )
    if res.accelerator == CPU and limit == 0:
        warnings.append("No acceleratorMemoryGiB for a CPU job: memory is not checked.")
    return warnings
