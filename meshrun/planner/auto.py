"""The strategy table (docs/planner.md), decided by the memory estimate, and the evaluation of a
layout (memory and predicted step) that every strategy shares.

``strategy: auto`` itself takes the fastest layout that fits (:mod:`meshrun.planner.search`);
the table's choice is what it compares itself with and explains against. The table (from the
Transformers guide "Parallelism methods"):

* one node, model fits one GPU: DDP (ZeRO would also work; DDP communicates least);
* one node, model does not fit: ZeRO, PP or TP -- on par with NVLink, and without it PP is
  faster (it sends only activations, point to point), so PCIe nodes try PP first;
* one node, largest layer does not fit one GPU: TP (PP and ZeRO-3 still hold a whole layer);
* many nodes, fast network: ZeRO (no model changes; ZeRO-1/2 move as much data as DDP, ZeRO-3
  1.5x, ZeRO paper section 7), else 3D;
* many nodes, slow network: ZeRO-1/2 if enough, else 3D (PP across nodes, TP inside, DP) with
  ZeRO-1, as the guide advises when memory is short.

Within a row the first candidate that fits wins; candidates go from least to most model
parallelism, so data parallelism stays as wide as memory allows. When no candidate of the row
fits, the row is tried again with selective, then full activation checkpointing (recomputation
costs compute, more model parallelism costs communication and bubbles; checkpointing is the
cheaper way out once the row's layouts are exhausted).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from meshrun.api.errors import SpecError
from meshrun.api.layout import Degrees, Layout, Stage, divisors, split_layers
from meshrun.api.spec import CPU, GIB, JobSpec
from meshrun.planner.degrees import complete_layout, micro_batch_size_of, stage_split
from meshrun.planner.explain import parameter_text
from meshrun.planner.memory import (
    CHECKPOINTING,
    MemoryEstimate,
    bytes_per_parameter,
    estimate_memory,
    layer_activation_bytes,
)
from meshrun.planner.steptime import StepEstimate, estimate_step, pressure_slowdown


class Candidate(NamedTuple):
    """Degrees to try and the ZeRO stage over their data-parallel ranks."""

    degrees: Degrees
    """The parallel degrees."""
    zero_stage: int
    """ZeRO stage 0-3."""


@dataclass(frozen=True)
class Choice:
    """A planned layout with its memory estimate and the reasons for it."""

    strategy: str
    """The strategy type this layout amounts to."""
    layout: Layout
    """Degrees and schedule."""
    stages: list[Stage]
    """Layer ranges per pipeline chunk."""
    memory: MemoryEstimate
    """Estimated bytes per accelerator."""
    checkpointing: str = "none"
    """Activation checkpointing the estimate assumes (none, selective or full)."""
    reasons: list[str] = field(default_factory=list)
    """Sentences explaining the choice."""
    estimate: StepEstimate | None = None
    """The predicted step (None when the layout was not timed)."""


def strategy_name(degrees: Degrees, zero_stage: int) -> str:
    """The strategy type a set of degrees amounts to (context parallelism goes with any: it
    does not name one)."""
    dp, pp, tp = degrees.dp, degrees.pp, degrees.tp
    if pp > 1 and tp > 1:
        return "hybrid"
    if pp > 1:
        return "pipeline"
    if tp > 1:
        return "tensor"
    return "zero" if zero_stage and dp > 1 else "ddp"


def evaluate(
    spec: JobSpec,
    candidate: Candidate,
    strategy: str | None = None,
    checkpointing: str = "none",
    given: bool = False,
) -> Choice:
    """Plan these degrees (SpecError when they break a rule); ``given``: the spec's own, where
    1F1B with fewer micro-batches than stages runs as GPipe (a search skips such layouts)."""
    degrees, zero = candidate
    layout = complete_layout(spec, degrees, zero, gpipe_below_stages=given)
    stages = stage_split(spec.shape, degrees.pp, layout.virtual_stages)
    memory = estimate_memory(spec, layout, stages, checkpointing)
    name = strategy or strategy_name(degrees, zero)
    estimate = estimate_step(spec, layout, stages, checkpointing, memory=memory)
    return Choice(name, layout, stages, memory, checkpointing, estimate=estimate)


def checkpointing_modes(spec: JobSpec) -> tuple[str, ...]:
    """The activation-checkpointing modes to try in turn: the one the spec sets, or (unset)
    none first and then more recomputation."""
    chosen = spec.training.activation_checkpointing
    return CHECKPOINTING if chosen is None else (chosen,)


def first_fit(spec: JobSpec, candidates: Iterable[Candidate]) -> Choice | None:
    """The first valid candidate that fits without activation checkpointing, else with the
    next mode (unless the spec sets one); failing all, the valid one with the smallest
    estimate."""
    candidates = list(candidates)
    smallest: Choice | None = None
    modes = checkpointing_modes(spec)
    for mode in modes:
        for candidate in candidates:
            try:
                choice = evaluate(spec, candidate, checkpointing=mode)
            except SpecError:
                continue
            if choice.memory.fits:
                if mode != modes[0]:
                    choice.reasons.append(checkpointing_reason(spec, candidate, choice))
                return choice
            if smallest is None or choice.memory.total < smallest.memory.total:
                smallest = choice
    return smallest


def checkpointing_reason(
    spec: JobSpec, candidate: Candidate, choice: Choice, what: str = "no layout of the row fits"
) -> str:
    """Why activation checkpointing is on: the layout's activations with and without it."""
    plain = evaluate(spec, candidate, given=True).memory
    return (
        f"Activation checkpointing ({choice.checkpointing}) is on: without it {what} "
        f"(this one would hold {plain.activations / GIB:.1f} GiB of activations, "
        f"{plain.total / GIB:.1f} GiB in all); recomputing in backward brings the activations "
        f"to {choice.memory.activations / GIB:.1f} GiB."
    )


def fit_degrees(spec: JobSpec, degrees: Candidate, strategy: str) -> Choice:
    """Given degrees (SpecError when they break a rule), with the spec's activation
    checkpointing, or unset the least that fits (more when that fits with too little headroom
    and recomputing is predicted faster); a sentence when more would fit."""
    modes = checkpointing_modes(spec)
    choice = evaluate(spec, degrees, strategy, modes[0], given=True)
    for mode in modes[1:]:
        if choice.memory.fits:
            break
        choice = evaluate(spec, degrees, strategy, mode, given=True)
        if choice.memory.fits:
            choice.reasons.append(
                checkpointing_reason(spec, degrees, choice, "the layout does not fit")
            )
    # Fitting with little headroom slows the step (memory pressure): more recomputation may
    # then be faster.
    for mode in modes[modes.index(choice.checkpointing) + 1 :]:
        if not choice.memory.fits or not pressure_slowdown(choice.memory, choice.layout):
            break
        roomier = evaluate(spec, degrees, strategy, mode, given=True)
        assert roomier.estimate is not None and choice.estimate is not None
        if roomier.estimate.step_seconds < choice.estimate.step_seconds:
            roomier.reasons.append(
                f"Activation checkpointing ({mode}) is on: the layout fits with less "
                f"recomputation ({choice.checkpointing}, {choice.memory.total / GIB:.1f} GiB of "
                f"{choice.memory.accelerator_bytes / GIB:.0f}), but with too little headroom "
                "for the allocator to run at speed; recomputing is predicted faster."
            )
            choice = roomier
    stronger = CHECKPOINTING[CHECKPOINTING.index(choice.checkpointing) + 1 :]
    if not choice.memory.fits and len(modes) == 1:
        for mode in stronger:
            if evaluate(spec, degrees, strategy, mode, given=True).memory.fits:
                choice.reasons.append(
                    f"It would fit with spec.training.activationCheckpointing: {mode}."
                )
                break
    return choice


def size_text(value: int) -> str:
    """Bytes in GiB with two decimals, or MiB below a quarter of one."""
    return f"{value / GIB:.2f} GiB" if value >= GIB / 4 else f"{value / 2**20:.1f} MiB"


def context_reason(spec: JobSpec, choice: Choice) -> list[str]:
    """What a given contextParallel buys: the same job with its cp ranks turned into data
    parallelism (``dp x cp`` replicas), refused, not fitting, or fitting with its memory and
    predicted speed beside the plan's. Nothing at cp 1."""
    layout = choice.layout
    cp = layout.cp
    if cp == 1:
        return []
    plain_degrees = Degrees(dp=layout.dp * cp, pp=layout.pp, tp=layout.tp)
    without = f"Without context parallelism ({plain_degrees.text()})"
    try:
        plain = fit_degrees(spec, Candidate(plain_degrees, layout.zero_stage), choice.strategy)
    except SpecError as error:
        return [f"{without} the job is not valid: {error}."]
    unit = "process" if spec.resources.accelerator == CPU else "GPU"
    ours = f"{size_text(choice.memory.total)} per {unit}"
    if not plain.memory.fits:
        how = (
            "even with full activation checkpointing"
            if spec.training.activation_checkpointing is None
            else f"with activationCheckpointing {plain.checkpointing}"
        )
        return [
            f"{without} it does not fit: a {unit} would need {size_text(plain.memory.total)} "
            f"of its {size_text(plain.memory.accelerator_bytes)}, {how}. Context parallelism "
            f"is what makes it fit: each rank keeps the activations of 1/{cp} of every "
            f"sequence ({ours})."
        ]
    assert plain.estimate is not None and choice.estimate is not None
    recompute = "" if plain.checkpointing == "none" else f" with {plain.checkpointing} recompute"
    return [
        f"{without} it would fit too{recompute}: {size_text(plain.memory.total)} per {unit} "
        f"against {ours}, predicted {plain.estimate.tokens_per_second_per_gpu:,.0f} tokens/s "
        f"per {unit} against {choice.estimate.tokens_per_second_per_gpu:,.0f}."
    ]


def model_parallel(spec: JobSpec, zero_stage: int, need_both: bool = False) -> list[Candidate]:
    """Degrees with TP inside a node and the spec's contextParallel, least model parallelism
    first.

    Ties prefer layouts using both PP and TP (3D), then a wider TP on NVLink nodes (TP's
    per-layer all-reduces want NVLink) or a deeper PP on PCIe nodes.
    """
    res, cp = spec.resources, spec.strategy.context_parallel
    world, fast = res.world_size // cp, res.fast_intra_node
    found = []
    for tp in divisors(res.num_proc_per_node):
        for pp in divisors(world // tp, spec.shape.layers):  # a stage needs a layer
            if (tp == 1 and pp == 1) or (need_both and (tp == 1 or pp == 1)):
                continue
            key = (tp * pp, 0 if tp > 1 and pp > 1 else 1, -tp if fast else tp)
            degrees = Degrees(dp=world // (tp * pp), cp=cp, pp=pp, tp=tp)
            found.append((key, Candidate(degrees, zero_stage)))
    return [candidate for _, candidate in sorted(found)]


def situation(spec: JobSpec) -> tuple[bool, bool, str]:
    """(model fits one GPU, largest layer fits one GPU, a sentence saying so)."""
    res, model = spec.resources, spec.shape
    size = micro_batch_size_of(spec)
    single = estimate_memory(
        spec, Layout(Degrees(), 0, "1f1b", 1, 1, 1, size), split_layers(model.layers, 1, 1)
    )
    largest = max(model.layer_parameters(), model.vocab * model.hidden)
    layer_bytes = largest * sum(bytes_per_parameter(spec.training.precision))
    layer_bytes += layer_activation_bytes(spec, 1, size)
    layer_fits = layer_bytes <= res.accelerator_bytes
    sentence = (
        f"The model ({parameter_text(model.parameters())} parameters) needs about "
        f"{single.total / GIB:.1f} GiB per GPU unsharded against "
        f"{res.accelerator_bytes / GIB:.0f} GiB: "
    )
    if single.fits:
        sentence += "it fits one GPU."
    elif layer_fits:
        sentence += "it does not fit one GPU."
    else:
        sentence += (
            f"it does not fit one GPU, and its largest layer ({layer_bytes / GIB:.1f} GiB with "
            "its states) does not either."
        )
    return single.fits, layer_fits, sentence


def data_parallel(spec: JobSpec) -> Candidate:
    """Every process data-parallel (with the spec's contextParallel): DDP, the fallback."""
    cp = spec.strategy.context_parallel
    return Candidate(Degrees(dp=spec.resources.world_size // cp, cp=cp), 0)


def table_row(spec: JobSpec) -> tuple[str, list[Candidate]]:
    """The strategy table's row for this job (docs/planner.md) and its candidates in order."""
    res, world = spec.resources, spec.resources.world_size
    ddp = data_parallel(spec)
    fits_one, layer_fits, _ = situation(spec)
    zero = [Candidate(ddp.degrees, stage) for stage in (1, 2, 3)]
    if world == 1:
        return "a single GPU: DDP with one process", [ddp]
    if res.num_nodes == 1 and fits_one:
        return "one node, model fits one GPU: DDP (ZeRO also works but communicates more)", [ddp]
    if res.num_nodes == 1 and layer_fits:
        tensor = [c for c in model_parallel(spec, 0) if c.degrees.pp == 1]
        pipeline = [c for c in model_parallel(spec, 0) if c.degrees.tp == 1]
        if res.fast_intra_node:
            row = "one node, model does not fit one GPU, NVLink: ZeRO, PP and TP are on par; "
            row += "ZeRO first, as it needs no model changes"
            return row, [*zero, *pipeline, *tensor]
        row = "one node, model does not fit one GPU, PCIe: PP first (faster than TP or ZeRO "
        row += "without NVLink)"
        return row, [*pipeline, *zero, *tensor]
    if res.num_nodes == 1:
        row = "one node, largest layer does not fit one GPU: TP (PP and ZeRO-3 hold whole layers)"
        return row, [c for z in (0, 1, 2, 3) for c in model_parallel(spec, z) if c.degrees.pp == 1]
    if res.fast_inter_node:
        row = "many nodes, fast interconnect: ZeRO (no model changes), else 3D (PP + TP + DP)"
        return row, [*zero, *model_parallel(spec, 1)]
    row = "many nodes, slow interconnect: ZeRO-1/2 (as much traffic as DDP), else 3D "
    row += "(PP across nodes, TP inside, DP) with ZeRO-1"
    return row, [*zero[:2], *model_parallel(spec, 1)]


def table_choice(spec: JobSpec) -> Choice:
    """Apply the strategy table (docs/planner.md) to this job; its first reasons are the
    situation and the row."""
    _, _, sentence = situation(spec)
    row, candidates = table_row(spec)
    choice = first_fit(spec, candidates) or evaluate(spec, data_parallel(spec), "ddp")
    choice.reasons.insert(0, f"Strategy table row (docs/planner.md): {row}.")
    choice.reasons.insert(0, sentence)
    if not choice.memory.fits:
        choice.reasons.append(
            "No candidate of that row fits; this is the one with the smallest estimate."
        )
    return choice


def search_hybrid(spec: JobSpec) -> Choice:
    """A hybrid job with two or more degrees unset: the least model parallelism that fits;
    no model parallelism at all (every process data-parallel, with the spec's
    contextParallel) only where the given degrees leave nothing else."""
    s = spec.strategy
    zero = s.zero_stage or 0
    candidates = [
        c
        for c in [*model_parallel(spec, zero), Candidate(data_parallel(spec).degrees, zero)]
        if (s.data_parallel is None or c.degrees.dp == s.data_parallel)
        and (s.pipeline_parallel is None or c.degrees.pp == s.pipeline_parallel)
        and (s.tensor_parallel is None or c.degrees.tp == s.tensor_parallel)
    ]
    choice = first_fit(spec, candidates)
    if choice is None:
        raise SpecError(
            "spec.strategy",
            "no dataParallel x contextParallel x pipelineParallel x tensorParallel layout "
            "satisfies the given "
            "degrees, spec.resources and spec.model (tensorParallel must divide "
            "numProcPerNode and the head counts; pipelineParallel at most spec.model.layers)",
        )
    choice = Choice(
        "hybrid",
        choice.layout,
        choice.stages,
        choice.memory,
        choice.checkpointing,
        choice.reasons,
        choice.estimate,
    )
    choice.reasons.append(
        "Hybrid with degrees left unset: the planner took the least model parallelism that "
        "fits, keeping TP inside a node."
    )
    return choice
