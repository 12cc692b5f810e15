"""``strategy: auto``: every layout the machines allow, the fastest predicted one that fits.

The search runs over TP degrees inside a pod, pipeline depths, ZeRO stages, the pipeline
schedule and its virtual stages, and activation checkpointing (the spec's, when it sets one),
keeps the layouts whose memory estimate fits, and ranks them by the step-time model's tokens/s
per GPU (:mod:`meshrun.planner.steptime`). The strategy table of docs/planner.md is still
consulted: the explanation says what it would have picked, and why that is slower when it is.
"""

from __future__ import annotations

from typing import Any

from meshrun.errors import SpecError
from meshrun.layout import Layout, Stage, divisors
from meshrun.planner.auto import (
    Choice,
    checkpointing_modes,
    evaluate,
    situation,
    strategy_name,
    table_choice,
    table_row,
)
from meshrun.planner.layout import complete_layout, stage_split, tp_fits_model
from meshrun.planner.memory import MemoryEstimate, estimate_memory
from meshrun.planner.steptime import WorkCache, estimate_step
from meshrun.spec import GIB, JobSpec

VIRTUAL_CHOICES = (2, 4)
"""Virtual stages the search tries for interleaved 1F1B (more cut the bubble further but add
point-to-point traffic; Megatron's runs use 2 to 8)."""
RUNNERS_UP = 3
"""Runners-up the explanation names."""

PART_WORDS = {
    "compute": "compute (smaller matrices per rank run further from peak)",
    "recompute": "activation recomputation",
    "elementwise": "memory-bound element-wise work",
    "tensorParallel": "tensor-parallel collectives",
    "pipelineBubble": "the pipeline bubble",
    "pipelineTransfer": "stage-to-stage transfers",
    "dataParallel": "data-parallel traffic not hidden behind compute",
    "optimizer": "the optimizer step",
}
"""The breakdown's parts in words, for the explanation."""


def schedules(job: JobSpec, pp: int) -> list[tuple[str, int]]:
    """(schedule, virtual stages) to try at pipeline depth ``pp``: the spec's when it sets
    virtualStages or asks for GPipe, else 1F1B and interleaved 1F1B."""
    s = job.strategy
    if pp == 1:
        return [(s.pipeline_schedule, 1)]
    if s.virtual_stages is not None or s.pipeline_schedule == "gpipe":
        default = s.virtual_stages or (2 if s.pipeline_schedule == "interleaved-1f1b" else 1)
        return [(s.pipeline_schedule, default)]
    found = [] if s.pipeline_schedule == "interleaved-1f1b" else [("1f1b", 1)]
    found += [("interleaved-1f1b", v) for v in VIRTUAL_CHOICES if pp * v <= job.shape.layers]
    return found


def enumerate_layouts(job: JobSpec) -> tuple[list[Choice], Choice | None]:
    """(every layout that fits, fastest first; the smallest estimate when none fits)."""
    res, world = job.resources, job.resources.world_size
    modes = checkpointing_modes(job)
    fitting: list[Choice] = []
    smallest: Choice | None = None
    splits: dict[tuple[int, int], list[Stage]] = {}
    works: WorkCache = {}
    for tp in divisors(res.num_proc_per_node):
        if not tp_fits_model(job, tp):
            continue
        for pp in divisors(world // tp):
            if pp > job.shape.layers:
                break
            dp = world // (tp * pp)
            # ZeRO-1 moves no more than DDP (a reduce-scatter and an all-gather for the
            # all-reduce) and steps 1/dp of the optimizer: it comes first, DDP (more memory,
            # no faster) last. ZeRO-3 under pipelining keeps stages gathered: ZeRO-2's memory.
            zeros: tuple[int, ...] = ((1, 2) if pp > 1 else (1, 2, 3)) + (0,) if dp > 1 else (0,)
            for schedule in schedules(job, pp):
                # A higher ZeRO stage moves as much or more and recomputing more only costs, so
                # once a stage fits with a mode, later stages only count with less recompute.
                allowed = len(modes)
                for zero in zeros:
                    try:
                        layout = complete_layout(job, dp, pp, tp, zero, schedule)
                    except SpecError:
                        break  # the degrees or schedule break a rule for every stage
                    key = (pp, layout.virtual_stages)
                    stages = splits.get(key) or splits.setdefault(
                        key, stage_split(job.shape, pp, layout.virtual_stages)
                    )
                    for index, mode in enumerate(modes[:allowed]):
                        memory = estimate_memory(job, layout, stages, mode)
                        if not memory.fits:
                            if smallest is None or memory.total < smallest.memory.total:
                                smallest = _choice(job, layout, stages, memory, mode, None)
                            continue
                        fitting.append(_choice(job, layout, stages, memory, mode, works))
                        allowed = index
                        break
                    if allowed == 0:
                        break
    fitting.sort(key=_speed, reverse=True)
    return fitting, None if fitting else smallest


def _choice(
    job: JobSpec,
    layout: Layout,
    stages: list[Stage],
    memory: MemoryEstimate,
    mode: str,
    works: WorkCache | None,
) -> Choice:
    """A layout that fits, timed with ``works`` (None: one that does not, untimed)."""
    name = strategy_name(layout.dp, layout.pp, layout.tp, layout.zero_stage)
    estimate = None if works is None else estimate_step(job, layout, stages, mode, works)
    return Choice(name, layout, stages, memory, mode, estimate=estimate)


def _speed(choice: Choice) -> float:
    return choice.estimate.tokens_per_second_per_gpu if choice.estimate else 0.0


def describe_layout(choice: Choice) -> str:
    """``dp8 x pp1 x tp1 ZeRO-1`` with the schedule and recomputation when they matter."""
    lay = choice.layout
    text = f"{lay.text()} ZeRO-{lay.zero_stage}"
    if lay.pp > 1:
        text += f" {lay.schedule}"
        if lay.virtual_stages > 1:
            text += f" v{lay.virtual_stages}"
    if choice.checkpointing != "none":
        text += f" {choice.checkpointing} recompute"
    return text


def speed_text(choice: Choice) -> str:
    est = choice.estimate
    assert est is not None
    return f"{est.tokens_per_second_per_gpu:,.0f} tokens/s per GPU"


def same_layout(a: Choice, b: Choice) -> bool:
    return (a.layout, a.checkpointing) == (b.layout, b.checkpointing)


def choose_fastest(job: JobSpec) -> Choice:
    """``strategy: auto``: the fastest predicted layout that fits, explained."""
    if job.resources.accelerator_bytes == 0:
        choice = evaluate(job, (job.resources.world_size, 1, 1, 0), "ddp")
        choice.reasons.append(
            "No accelerator memory to respect (accelerator cpu without acceleratorMemoryGiB), "
            "so the simplest strategy, DDP, is chosen."
        )
        return choice
    fitting, smallest = enumerate_layouts(job)
    _, _, sentence = situation(job)
    if not fitting:
        assert smallest is not None
        choice = _timed(job, smallest)
        row, _ = table_row(job)
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
    if best.checkpointing != "none" and job.training.activation_checkpointing is None:
        best.reasons.append(
            f"Activation checkpointing ({best.checkpointing}) is on: without it this layout "
            "does not fit, and no layout without it is faster."
        )
    best.reasons.append(_against_table(job, best))
    return best


def _against_table(job: JobSpec, best: Choice) -> str:
    """What the strategy table would have picked, and why it is slower."""
    row, _ = table_row(job)
    table = table_choice(job)
    lead = f"Strategy table row (docs/planner.md): {row}"
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


def _timed(job: JobSpec, choice: Choice) -> Choice:
    estimate = estimate_step(job, choice.layout, choice.stages, choice.checkpointing)
    return Choice(
        choice.strategy,
        choice.layout,
        choice.stages,
        choice.memory,
        choice.checkpointing,
        [],
        estimate,
    )


def best_layouts(job: JobSpec, count: int) -> list[Choice]:
    """The ``count`` fastest layouts that fit (``meshrun plan --candidates``), whatever the
    spec's strategy type."""
    fitting, _ = enumerate_layouts(job)
    return fitting[:count]


def candidate_dict(choice: Choice) -> dict[str, Any]:
    """One entry of ``candidates`` in ``meshrun plan --candidates N -o json``."""
    lay, est = choice.layout, choice.estimate
    assert est is not None
    return {
        "layoutString": lay.text(),
        "strategy": choice.strategy,
        "dp": lay.dp,
        "pp": lay.pp,
        "tp": lay.tp,
        "zeroStage": lay.zero_stage,
        "pipelineSchedule": lay.schedule,
        "virtualStages": lay.virtual_stages,
        "microBatches": lay.micro_batches,
        "activationCheckpointing": choice.checkpointing,
        "memoryBytes": choice.memory.total,
        "stepSeconds": round(est.step_seconds, 6),
        "tokensPerSecondPerGpu": round(est.tokens_per_second_per_gpu, 3),
        "mfu": round(est.mfu, 4),
    }
