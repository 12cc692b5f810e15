"""Every layout the machines allow that fits, fastest predicted first (``strategy: auto`` takes
the first: meshrun.planner.fastest).

The search runs over TP degrees inside a pod, context-parallel degrees (:func:`context_degrees`),
pipeline depths, ZeRO stages, the pipeline schedule and its virtual stages, and activation
checkpointing (the spec's, when it sets one),
keeps the layouts whose memory estimate fits, and ranks them by the step-time model's tokens/s
per GPU (:mod:`meshrun.planner.steptime`).
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import product

from meshrun.api.errors import SpecError
from meshrun.api.layout import Degrees, Layout, Stage, divisors
from meshrun.api.spec import JobSpec
from meshrun.planner.auto import (
    Choice,
    checkpointing_modes,
    strategy_name,
)
from meshrun.planner.degrees import complete_layout, stage_split
from meshrun.planner.memory import MemoryEstimate, estimate_memory
from meshrun.planner.moe import expert_degrees
from meshrun.planner.steptime import WorkCache, estimate_step, pressure_slowdown
from meshrun.rules.strategy import tp_unsplit

MICRO_BATCH_SIZES = (1, 2, 4, 8)
"""Micro-batch sizes the search tries when the spec leaves microBatchSize unset: larger ones
lengthen the backward that hides gradient traffic and amortise per-micro-batch costs, at the
price of activation memory and, under pipelining, fewer micro-batches to fill the bubble."""
LONG_SEQUENCE = 8192
"""Sequences of at least this many tokens are long: the search tries context parallelism for
them (NVIDIA's Llama 3.1 recipes use CP 2 from 8K tokens; Llama 3 used CP 16 at 128K)."""
MIN_CHUNK_TOKENS = 1024
"""The shortest chunk (seqLen / (2 x cp)) the search splits a sequence into: below it the
matrices of a rank's share run far from peak and the all-gathers' latency dominates."""
VIRTUAL_CHOICES = (2, 4)
"""Virtual stages the search tries for interleaved 1F1B (more cut the bubble further but add
point-to-point traffic; Megatron's runs use 2 to 8)."""

Splits = dict[tuple[int, int], list[Stage]]
"""Layer ranges per (pipeline depth, virtual stages), computed once per search."""


def schedules(spec: JobSpec, pp: int) -> list[tuple[str, int]]:
    """(schedule, virtual stages) to try at pipeline depth ``pp``: the spec's when it sets
    virtualStages or asks for GPipe, else 1F1B and interleaved 1F1B."""
    s = spec.strategy
    if pp == 1:
        return [(s.pipeline_schedule, 1)]
    if s.virtual_stages is not None or s.pipeline_schedule == "gpipe":
        default = s.virtual_stages or (2 if s.pipeline_schedule == "interleaved-1f1b" else 1)
        return [(s.pipeline_schedule, default)]
    found = [] if s.pipeline_schedule == "interleaved-1f1b" else [("1f1b", 1)]
    found += [("interleaved-1f1b", v) for v in VIRTUAL_CHOICES if pp * v <= spec.shape.layers]
    return found


def micro_batch_sizes(spec: JobSpec) -> tuple[int, ...]:
    """The micro-batch sizes to try: the spec's, or (unset) those of MICRO_BATCH_SIZES that
    keep every degree spec.elastic allows splitting the global batch (the rule of
    :mod:`meshrun.rules.elastic`, which the API server can only check with a size of 1)."""
    if spec.training.micro_batch_size is not None:
        return (spec.training.micro_batch_size,)
    if spec.elastic is None:
        return MICRO_BATCH_SIZES
    bounds = [d for d in (spec.elastic.min_data_parallel, spec.elastic.max_data_parallel) if d]
    kept = tuple(
        size
        for size in MICRO_BATCH_SIZES
        if all((spec.training.global_batch_size // size) % d == 0 for d in bounds)
    )
    return kept or (1,)


def context_degrees(spec: JobSpec) -> tuple[int, ...]:
    """The context-parallel degrees to try: the spec's for every type but auto; under auto 1,
    and powers of two that split seqLen into 2 x cp chunks of at least MIN_CHUNK_TOKENS and
    divide the world size, when the sequence is long (LONG_SEQUENCE) or the global batch has
    fewer sequences than the world has pods' worth of ranks (even a tensor-parallel group
    filling every pod leaves more data-parallel replicas than sequences)."""
    if spec.strategy.type != "auto":
        return (spec.strategy.context_parallel,)
    seq, world = spec.shape.seq_len, spec.resources.world_size
    replicas = world // spec.resources.num_proc_per_node
    if seq < LONG_SEQUENCE and spec.training.global_batch_size >= replicas:
        return (1,)
    found, cp = [1], 2
    while seq % (2 * cp) == 0 and seq // (2 * cp) >= MIN_CHUNK_TOKENS and world % cp == 0:
        found.append(cp)
        cp *= 2
    return tuple(found)


def enumerate_layouts(spec: JobSpec) -> tuple[list[Choice], Choice | None]:
    """(every layout that fits, fastest first; the smallest estimate when none fits)."""
    fitting: list[Choice] = []
    smallest: Choice | None = None
    splits: Splits = {}
    for size in micro_batch_sizes(spec):
        if spec.training.global_batch_size % size:
            continue
        found, least = _layouts_of(spec, size, splits)
        fitting += found
        if least is not None and (smallest is None or least.memory.total < smallest.memory.total):
            smallest = least
    fitting.sort(key=_speed, reverse=True)
    return fitting, None if fitting else smallest


def _layouts_of(
    spec: JobSpec, micro_batch_size: int, splits: Splits
) -> tuple[list[Choice], Choice | None]:
    """The layouts of one micro-batch size: those that fit, and the smallest that does not."""
    fitting: list[Choice] = []
    smallest: Choice | None = None
    works: WorkCache = {}
    for degrees in _degree_candidates(spec):
        stage_ranks = degrees.dp * degrees.cp * degrees.tp  # expert parallelism is drawn from them
        for schedule, ep in product(schedules(spec, degrees.pp), expert_degrees(spec, stage_ranks)):
            tried = _sharding_and_recompute(spec, degrees, schedule, ep, micro_batch_size, splits)
            for layout, stages, memory, mode in tried:
                if memory.fits:
                    fitting.append(_choice(spec, layout, stages, memory, mode, works))
                elif smallest is None or memory.total < smallest.memory.total:
                    smallest = _choice(spec, layout, stages, memory, mode, None)
    return fitting, smallest


def _degree_candidates(spec: JobSpec) -> Iterator[Degrees]:
    """Every (dp, cp, pp, tp) of the world: TP inside a pod and splitting the model, CP from
    :func:`context_degrees`, PP up to a layer a stage."""
    world = spec.resources.world_size
    for tp, cp in product(divisors(spec.resources.num_proc_per_node), context_degrees(spec)):
        if tp_unsplit(spec.shape, tp) is not None or world % (tp * cp):
            continue
        for pp in divisors(world // (tp * cp), spec.shape.layers):
            yield Degrees(dp=world // (tp * cp * pp), cp=cp, pp=pp, tp=tp)


def _zero_stages(degrees: Degrees) -> tuple[int, ...]:
    """The ZeRO stages to try, in order. ZeRO-1 moves no more than DDP (a reduce-scatter and an
    all-gather for the all-reduce) and steps 1/dp of the optimizer: it comes first, DDP (more
    memory, no faster) last. ZeRO-3 under pipelining keeps stages gathered: ZeRO-2's memory.
    ZeRO shards over the dp x cp ranks holding the same parameters."""
    if degrees.dp * degrees.cp == 1:
        return (0,)
    return ((1, 2) if degrees.pp > 1 else (1, 2, 3)) + (0,)


def _sharding_and_recompute(
    spec: JobSpec,
    degrees: Degrees,
    schedule: tuple[str, int],
    ep: int | None,
    micro_batch_size: int,
    splits: Splits,
) -> Iterator[tuple[Layout, list[Stage], MemoryEstimate, str]]:
    """(layout, stages, memory, checkpointing) of the ZeRO stages and checkpointing modes worth
    estimating for one set of degrees, schedule and EP degree.

    A higher ZeRO stage moves as much or more and recomputing more only costs, so once a stage
    fits with a mode and room to spare, later stages only count with less recompute. Without
    room to spare (memory pressure slows the step) more sharding or recomputation may still be
    faster, so they are tried too.
    """
    modes = checkpointing_modes(spec)
    allowed = len(modes)
    for zero in _zero_stages(degrees):
        try:
            layout = complete_layout(
                spec, degrees, zero, schedule, micro_batch_size=micro_batch_size, ep=ep
            )
        except SpecError:
            return  # the degrees or schedule break a rule for every stage
        key = (degrees.pp, layout.virtual_stages)
        stages = splits.get(key) or splits.setdefault(
            key, stage_split(spec.shape, degrees.pp, layout.virtual_stages)
        )
        for index, mode in enumerate(modes[:allowed]):
            memory = estimate_memory(spec, layout, stages, mode)
            yield layout, stages, memory, mode
            if memory.fits and not pressure_slowdown(memory, layout):
                allowed = index
                break
        if allowed == 0:
            return


def _choice(
    spec: JobSpec,
    layout: Layout,
    stages: list[Stage],
    memory: MemoryEstimate,
    mode: str,
    works: WorkCache | None,
) -> Choice:
    """A layout that fits, timed with ``works`` (None: one that does not, untimed)."""
    name = strategy_name(layout.degrees, layout.zero_stage)
    estimate = None if works is None else estimate_step(spec, layout, stages, mode, works, memory)
    return Choice(name, layout, stages, memory, mode, estimate=estimate)


def _speed(choice: Choice) -> float:
    return choice.estimate.tokens_per_second_per_gpu if choice.estimate else 0.0


def best_layouts(spec: JobSpec, count: int) -> list[Choice]:
    """The ``count`` fastest layouts that fit (``meshrun plan --candidates``), whatever the
    spec's strategy type."""
    fitting, _ = enumerate_layouts(spec)
    return fitting[:count]
