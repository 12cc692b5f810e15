"""``strategy: auto``: the fastest predicted layout that fits (meshrun.planner.search), and the
explanation: its prediction, the runners-up, and what the strategy table of docs/planner.md
would have picked and why that is slower when it is.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from meshrun.api.errors import SpecError
from meshrun.api.read import view_of, write_section
from meshrun.api.spec import GIB, JobSpec
from meshrun.planner.auto import (
    Choice,
    data_parallel,
    evaluate,
    situation,
    table_choice,
    table_row,
)
from meshrun.planner.report import CandidateReport
from meshrun.planner.search import LONG_SEQUENCE, MICRO_BATCH_SIZES, enumerate_layouts
from meshrun.planner.steptime import estimate_step

RUNNERS_UP = 3
"""Runners-up the explanation names."""

PART_WORDS = {
    "compute": "compute (smaller matrices per rank run further from peak)",
    "recompute": "activation recomputation",
    "elementwise": "memory-bound element-wise work",
    "tensorParallel": "tensor-parallel collectives",
    "contextParallel": "context-parallel all-gathers of keys and values",
    "pipelineBubble": "the pipeline bubble",
    "pipelineTransfer": "stage-to-stage transfers",
    "dataParallel": "data-parallel traffic not hidden behind compute",
    "optimizer": "the optimizer step",
    "launch": "waiting on the host to launch kernels (small per-layer work)",
    "memoryPressure": "memory pressure (too little headroom for the allocator)",
}
"""The breakdown's parts in words, for the explanation."""


def describe_layout(choice: Choice) -> str:
    """``dp8 x pp1 x tp1 ZeRO-1`` with the schedule and recomputation when they matter."""
    return " ".join(layout_phrases(choice))


def layout_phrases(choice: Choice) -> list[str]:
    """The parts of ``describe_layout``, each a phrase a line may not break."""
    lay = choice.layout
    phrases = [lay.text(), f"ZeRO-{lay.zero_stage}"]
    if lay.micro_batch_size != 1:
        phrases.append(f"mbs{lay.micro_batch_size}")
    if lay.pp > 1:
        schedule = lay.schedule
        if lay.virtual_stages > 1:
            schedule += f" v{lay.virtual_stages}"
        phrases.append(schedule)
    if choice.checkpointing != "none":
        phrases.append(f"{choice.checkpointing} recompute")
    return phrases


def speed_text(choice: Choice) -> str:
    est = choice.estimate
    assert est is not None
    return f"{est.tokens_per_second_per_gpu:,.0f} tokens/s per GPU"


def same_layout(a: Choice, b: Choice) -> bool:
    return (a.layout, a.checkpointing) == (b.layout, b.checkpointing)


def choose_fastest(spec: JobSpec) -> Choice:
    """``strategy: auto``: the fastest predicted layout that fits, explained."""
    if spec.resources.accelerator_bytes == 0:
        choice = evaluate(spec, data_parallel(spec), "ddp")
        choice.reasons.append(
            "No accelerator memory to respect (accelerator cpu without acceleratorMemoryGiB), "
            "so the simplest strategy, DDP, is chosen."
        )
        return choice
    fitting, smallest = enumerate_layouts(spec)
    _, _, sentence = situation(spec)
    if not fitting and smallest is None:
        # No layout is valid at all: the table's fallback raises the rule that refuses it.
        return table_choice(spec)
    if not fitting:
        assert smallest is not None
        choice = _timed(spec, smallest)
        row, _ = table_row(spec)
        choice.reasons.extend(
            [
                sentence,
                "No layout fits in accelerator memory, with any ZeRO stage, pipeline, tensor "
                "parallelism or activation checkpointing; this is the one with the smallest "
                f"estimate ({smallest.memory.total / GIB:.1f} GiB).",
                f"Strategy table row (docs/planner.md): {row}; none of its layouts fits either.",
            ]
        )
        return choice
    best = fitting[0]
    est = best.estimate
    assert est is not None
    best.reasons.append(sentence)
    best.reasons.append(
        f"Fastest of the {len(fitting)} layouts that fit: {describe_layout(best)}, predicted "
        f"{speed_text(best)} ({est.step_seconds:.3g} s per step, MFU {est.mfu:.0%})."
    )
    others = [c for c in fitting[1:] if not same_layout(c, best)][:RUNNERS_UP]
    if others:
        best.reasons.append(
            "Runners-up: "
            + "; ".join(
                f"{describe_layout(c)} at {speed_text(c)} ({_relative(c, best)})" for c in others
            )
            + "."
        )
    if spec.training.micro_batch_size is None:
        sizes = ", ".join(str(b) for b in MICRO_BATCH_SIZES)
        best.reasons.append(
            f"spec.training.microBatchSize is unset: of {sizes}, {best.layout.micro_batch_size} is "
            "the fastest that fits."
        )
    if best.checkpointing != "none" and spec.training.activation_checkpointing is None:
        best.reasons.append(
            f"Activation checkpointing ({best.checkpointing}) is on: without it this layout "
            "does not fit, and no layout without it is faster."
        )
    best.reasons.extend(_context_reasons(spec, best, fitting))
    best.reasons.append(_against_table(spec, best))
    return best


def _context_reasons(spec: JobSpec, best: Choice, fitting: list[Choice]) -> list[str]:
    """Why the search chose context parallelism, when it did: what it does, and the fastest
    layout without it (or that none fits)."""
    cp = best.layout.cp
    if cp == 1:
        return []
    seq = spec.shape.seq_len
    why = (
        f"the sequence is long ({seq:,} tokens)"
        if seq >= LONG_SEQUENCE
        else f"the global batch ({spec.training.global_batch_size} sequences) is too small "
        "to fill data parallelism"
    )
    lines = [
        f"Context parallel {cp}: {why}, so each sequence is split into {2 * cp} chunks of "
        f"{seq // (2 * cp):,} tokens, rank i of a group of {cp} holding chunks i and "
        f"{2 * cp - 1}-i (every rank the same causal-attention work); each attention layer "
        "all-gathers the whole sequence's keys and values. A rank keeps the activations of "
        f"1/{cp} of each sequence (the gathered keys and values aside), and fewer sequences "
        "fill the GPUs."
    ]
    plain = next((c for c in fitting if c.layout.cp == 1), None)
    if plain is None:
        lines.append("No layout without context parallelism fits or splits the batch.")
    else:
        lines.append(
            f"Without it the fastest layout is {describe_layout(plain)} at {speed_text(plain)} "
            f"({_relative(plain, best)})."
        )
    return lines


def _against_table(spec: JobSpec, best: Choice) -> str:
    """What the strategy table would have picked, and why it is slower."""
    row, _ = table_row(spec)
    lead = f"Strategy table row (docs/planner.md): {row}"
    try:
        table = table_choice(spec)
    except SpecError as error:
        # The table knows no context parallelism: with few long sequences none of its layouts
        # may split the batch.
        return f"{lead}; none of its layouts is valid here ({error.rule})."
    if same_layout(table, best):
        return f"{lead}; it picks the same layout."
    if not table.memory.fits:
        return f"{lead}; its pick, {describe_layout(table)}, does not fit."
    assert table.estimate is not None and best.estimate is not None
    gaps = {
        part: table.estimate.breakdown.get(part, 0.0) - seconds
        for part, seconds in best.estimate.breakdown.items()
    }
    part, gap = max(gaps.items(), key=lambda item: item[1])
    why = (
        f"it spends {gap:.3g} s more per step on {PART_WORDS[part]}"
        if gap > 0
        else "the two are within the model's accuracy"
    )
    return (
        f"{lead}; it would pick {describe_layout(table)}, predicted {speed_text(table)} "
        f"({_relative(table, best)}): {why}."
    )


def _relative(choice: Choice, best: Choice) -> str:
    assert choice.estimate is not None and best.estimate is not None
    ratio = choice.estimate.tokens_per_second_per_gpu / best.estimate.tokens_per_second_per_gpu
    return f"{1 - ratio:.0%} slower" if ratio < 1 else "as fast"


def _timed(spec: JobSpec, choice: Choice) -> Choice:
    estimate = estimate_step(
        spec, choice.layout, choice.stages, choice.checkpointing, memory=choice.memory
    )
    return replace(choice, reasons=[], estimate=estimate)


def candidate_dict(choice: Choice) -> dict[str, Any]:
    """One entry of ``candidates`` in ``meshrun plan --candidates N -o json``."""
    written: dict[str, Any] = write_section(view_of(CandidateReport, choice))
    return written
