"""Parallel degrees: checking them against the job, and completing the schedule settings.

The degrees of an explicit strategy are filled in here; ``auto`` and a partly given ``hybrid``
search in :mod:`meshrun.planner.auto`. Every rule that a layout can break raises SpecError
naming the spec field and the number it must satisfy.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshrun.errors import SpecError
from meshrun.planner.spec import JobSpec

STRATEGY = "spec.strategy"


@dataclass(frozen=True)
class Layout:
    """A complete parallel layout: degrees, sharding and pipeline schedule."""

    dp: int
    """Data-parallel degree (replicas, or ZeRO shards)."""
    pp: int
    """Pipeline stages."""
    tp: int
    """Tensor-parallel degree (innermost, inside one pod)."""
    zero_stage: int
    """ZeRO stage over the data-parallel group: 0 none, 1 optimizer, 2 +grads, 3 +params."""
    schedule: str
    """Pipeline schedule (gpipe, 1f1b, interleaved-1f1b); meaningful when pp > 1."""
    micro_batches: int
    """Micro-batches per pipeline step (1 when pp == 1)."""
    virtual_stages: int
    """Model chunks per pipeline rank (above 1 only for interleaved-1f1b)."""
    grad_accumulation: int
    """Forward/backward passes (or pipeline steps) summed per optimizer step."""

    @property
    def world_size(self) -> int:
        return self.dp * self.pp * self.tp

    def bubble_fraction(self) -> float:
        """Idle share of a pipeline step (Narayanan et al. 2021, arXiv 2104.04473)."""
        if self.pp == 1:
            return 0.0
        chunks = self.virtual_stages * self.micro_batches
        return (self.pp - 1) / (chunks + self.pp - 1)

    def text(self) -> str:
        return f"dp{self.dp} x pp{self.pp} x tp{self.tp}"


def explicit_degrees(job: JobSpec) -> tuple[int, int, int]:
    """(dp, pp, tp) for the types whose degrees follow from the spec alone.

    ddp/zero: all processes data-parallel. tensor: the widest TP inside a pod that the model's
    head counts and widths allow. pipeline: one stage per pod when there are several pods, else
    one per process, capped by the layers. hybrid: the missing one of the three from the world
    size (the planner searches when two or more are missing).
    """
    s, world = job.strategy, job.resources.world_size
    if s.type in ("ddp", "zero"):
        if s.dp is not None and s.dp != world:
            raise SpecError(
                f"{STRATEGY}.dataParallel",
                f"{s.dp} must equal the world size {world} for type {s.type}",
            )
        return world, 1, 1
    if s.type == "tensor":
        tp = s.tp or (_quotient(world, s.dp, "dataParallel") if s.dp else None)
        tp = tp or max(t for t in _divisors(job.resources.proc_per_node) if _tp_fits_model(job, t))
        return _quotient(world, tp, "tensorParallel"), 1, tp
    if s.type == "pipeline":
        pp = s.pp or (_quotient(world, s.dp, "dataParallel") if s.dp else None)
        if pp is None:
            wanted = job.resources.num_nodes if job.resources.num_nodes > 1 else world
            deepest = max(1, job.model.layers // chunks_per_rank(job, 2))
            pp = max(p for p in _divisors(world) if p <= min(wanted, deepest))
        return _quotient(world, pp, "pipelineParallel"), pp, 1
    given = {"dataParallel": s.dp, "pipelineParallel": s.pp, "tensorParallel": s.tp}
    missing = [name for name, value in given.items() if value is None]
    if not missing:
        return s.dp or 1, s.pp or 1, s.tp or 1
    if len(missing) != 1:
        raise AssertionError("hybrid with several degrees unset is searched by auto")
    known = 1
    for name, value in given.items():
        if value is not None:
            known *= value
            if world % known:
                raise SpecError(
                    f"{STRATEGY}.{name}",
                    f"{value} times the other given degrees ({known}) must divide the world "
                    f"size {world} (spec.resources.numNodes x numProcPerNode)",
                )
    given[missing[0]] = world // known
    return given["dataParallel"] or 1, given["pipelineParallel"] or 1, given["tensorParallel"] or 1


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _tp_fits_model(job: JobSpec, tp: int) -> bool:
    """Whether TP degree ``tp`` divides every dimension TP splits."""
    m = job.model
    return all(size % tp == 0 for size in (m.heads, m.kv_heads, m.ffn_hidden, m.vocab))


def _quotient(world: int, degree: int, name: str) -> int:
    if world % degree:
        raise SpecError(
            f"{STRATEGY}.{name}",
            f"{degree} must divide the world size {world} "
            "(spec.resources.numNodes x numProcPerNode)",
        )
    return world // degree


def check_degrees(job: JobSpec, dp: int, pp: int, tp: int) -> None:
    """Raise SpecError unless (dp, pp, tp) fits the machines and the model."""
    res, model = job.resources, job.model
    if dp * pp * tp != res.world_size:
        raise SpecError(
            STRATEGY,
            f"dataParallel x pipelineParallel x tensorParallel = {dp}x{pp}x{tp} must equal "
            f"spec.resources.numNodes x numProcPerNode = {res.world_size}",
        )
    tp_field = f"{STRATEGY}.tensorParallel"
    if res.proc_per_node % tp:
        raise SpecError(
            tp_field, f"{tp} must divide spec.resources.numProcPerNode={res.proc_per_node}"
        )
    for what, size in (
        ("heads", model.heads),
        ("kvHeads", model.kv_heads),
        ("ffnHidden", model.ffn_hidden),
        ("vocab", model.vocab),
    ):
        if size % tp:
            raise SpecError(tp_field, f"{tp} must divide spec.model.{what}={size}")
    virtual = chunks_per_rank(job, pp)
    if pp * virtual > model.layers:
        stages = f"{pp} stages" + (f" x {virtual} virtual stages" if virtual > 1 else "")
        raise SpecError(
            f"{STRATEGY}.pipelineParallel",
            f"{stages} must not exceed spec.model.layers={model.layers} (each stage needs a layer)",
        )


def chunks_per_rank(job: JobSpec, pp: int) -> int:
    """Model chunks per pipeline rank: virtualStages, 2 by default for interleaved-1f1b."""
    if pp == 1:
        return 1
    if job.strategy.schedule != "interleaved-1f1b":
        return job.strategy.virtual_stages or 1
    return job.strategy.virtual_stages or 2


def complete_layout(job: JobSpec, dp: int, pp: int, tp: int, zero_stage: int) -> Layout:
    """The full layout for these degrees: micro-batches, virtual stages, gradient accumulation."""
    check_degrees(job, dp, pp, tp)
    s, t = job.strategy, job.training
    if t.global_batch % (dp * t.micro_batch):
        raise SpecError(
            "spec.training.globalBatchSize",
            f"{t.global_batch} must be a multiple of dataParallel x microBatchSize = "
            f"{dp}x{t.micro_batch} = {dp * t.micro_batch}",
        )
    passes = t.global_batch // (dp * t.micro_batch)
    if pp == 1:
        return Layout(dp, pp, tp, zero_stage, s.schedule, 1, 1, passes)
    micro = s.micro_batches or passes
    if passes % micro:
        raise SpecError(
            f"{STRATEGY}.microBatches",
            f"{micro} must divide globalBatchSize / (dataParallel x microBatchSize) = {passes}",
        )
    virtual = chunks_per_rank(job, pp)
    if s.schedule == "1f1b" and micro < pp:
        # torch's Schedule1F1B raises ValueError below one micro-batch per stage.
        raise SpecError(
            f"{STRATEGY}.microBatches",
            f"{micro} must be at least pipelineParallel={pp} for 1f1b; use pipelineSchedule "
            "gpipe for fewer (microBatches 1 is plain model parallelism)",
        )
    if s.schedule == "interleaved-1f1b":
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
    elif s.virtual_stages not in (None, 1):
        raise SpecError(
            f"{STRATEGY}.virtualStages",
            "above 1 needs spec.strategy.pipelineSchedule interleaved-1f1b",
        )
    return Layout(dp, pp, tp, zero_stage, s.schedule, micro, virtual, passes // micro)


@dataclass(frozen=True)
class Stage:
    """A contiguous run of layers on one pipeline rank (one model chunk)."""

    pp: int
    """Pipeline rank holding the chunk."""
    virtual: int
    """Chunk index on that rank (0 unless interleaved)."""
    first: int
    """First layer (0-based, inclusive)."""
    last: int
    """Last layer (inclusive)."""


def split_layers(layers: int, pp: int, virtual: int) -> list[Stage]:
    """Layers split evenly over pp x virtual chunks in model order; earlier chunks take the rest.

    Chunk c sits on pipeline rank c % pp (Megatron's interleaved assignment, so rank 0 holds
    chunks 0, pp, 2pp, ...).
    """
    chunks = pp * virtual
    base, extra = divmod(layers, chunks)
    stages, first = [], 0
    for chunk in range(chunks):
        count = base + (1 if chunk < extra else 0)
        stages.append(Stage(chunk % pp, chunk // pp, first, first + count - 1))
        first += count
    return stages
