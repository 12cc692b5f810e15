"""Parallel degrees of an explicit strategy, and the schedule settings that complete a layout.

The degrees of an explicit strategy are filled in here; ``auto`` and a partly given ``hybrid``
search in :mod:`meshrun.planner.auto`. Every layout is checked by :func:`meshrun.rules.strategy.
check_layout`, the rules the trainer checks too.
"""

from __future__ import annotations

from meshrun.api.errors import SpecError
from meshrun.api.layout import Degrees, Layout, Stage, divisors
from meshrun.api.presets import ModelShape
from meshrun.api.spec import JobSpec
from meshrun.rules.strategy import check_layout, tp_unsplit

STRATEGY = "spec.strategy"


def explicit_degrees(spec: JobSpec) -> Degrees:
    """The degrees of the types whose degrees follow from the spec alone.

    contextParallel is the spec's; the rest split the world size divided by it. ddp/zero: all
    those processes data-parallel. tensor: the widest TP inside a pod that the model's
    head counts and widths allow. pipeline: one stage per pod when there are several pods, else
    one per process, capped by the layers. hybrid: the missing one of the three from the world
    size (the planner searches when two or more are missing).
    """
    s, cp = spec.strategy, spec.strategy.context_parallel
    world = spec.resources.world_size // cp  # check_spec: cp divides the world size
    if s.type in ("ddp", "zero"):
        return Degrees(dp=world, cp=cp)
    if s.type == "tensor":
        tp = s.tensor_parallel or (
            _quotient(world, s.data_parallel, "dataParallel") if s.data_parallel else None
        )
        tp = tp or max(
            t
            for t in divisors(spec.resources.num_proc_per_node)
            if tp_unsplit(spec.shape, t) is None
        )
        return Degrees(dp=_quotient(world, tp, "tensorParallel"), cp=cp, tp=tp)
    if s.type == "pipeline":
        pp = s.pipeline_parallel or (
            _quotient(world, s.data_parallel, "dataParallel") if s.data_parallel else None
        )
        if pp is None:
            wanted = spec.resources.num_nodes if spec.resources.num_nodes > 1 else world
            deepest = max(1, spec.shape.layers // chunks_per_rank(spec, 2))
            pp = max(p for p in divisors(world) if p <= min(wanted, deepest))
        return Degrees(dp=_quotient(world, pp, "pipelineParallel"), cp=cp, pp=pp)
    given = {
        "dataParallel": s.data_parallel,
        "pipelineParallel": s.pipeline_parallel,
        "tensorParallel": s.tensor_parallel,
    }
    missing = [name for name, value in given.items() if value is None]
    if not missing:
        return Degrees(
            dp=s.data_parallel or 1,
            cp=cp,
            pp=s.pipeline_parallel or 1,
            tp=s.tensor_parallel or 1,
        )
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
                    f"size {world} (spec.resources.numNodes x numProcPerNode / contextParallel)",
                )
    given[missing[0]] = world // known
    return Degrees(
        dp=given["dataParallel"] or 1,
        cp=cp,
        pp=given["pipelineParallel"] or 1,
        tp=given["tensorParallel"] or 1,
    )


def _quotient(world: int, degree: int, name: str) -> int:
    if world % degree:
        raise SpecError(
            f"{STRATEGY}.{name}",
            f"{degree} must divide the world size {world} "
            "(spec.resources.numNodes x numProcPerNode / contextParallel)",
        )
    return world // degree


def chunks_per_rank(spec: JobSpec, pp: int) -> int:
    """Model chunks per pipeline rank: virtualStages, 2 by default for interleaved-1f1b."""
    if pp == 1:
        return 1
    if spec.strategy.pipeline_schedule != "interleaved-1f1b":
        return spec.strategy.virtual_stages or 1
    return spec.strategy.virtual_stages or 2


def micro_batch_size_of(spec: JobSpec) -> int:
    """The micro-batch size a layout of ``spec`` runs unless a search tries others: the spec's,
    1 when unset."""
    return spec.training.micro_batch_size or 1


def complete_layout(
    spec: JobSpec,
    degrees: Degrees,
    zero_stage: int,
    schedule: tuple[str, int] | None = None,
    gpipe_below_stages: bool = False,
    micro_batch_size: int | None = None,
    ep: int | None = None,
) -> Layout:
    """The full layout for these degrees (micro-batches, virtual stages, gradient accumulation),
    checked by the rules every component shares; ``schedule`` (name, virtual stages) replaces
    the spec's, ``micro_batch_size`` the spec's (:func:`micro_batch_size_of`), ``ep`` the spec's
    expertParallel. With ``gpipe_below_stages`` (degrees the spec gives), 1F1B with fewer
    micro-batches than stages runs GPipe's order instead of breaking torch's rule."""
    s, t = spec.strategy, spec.training
    dp, pp = degrees.dp, degrees.pp
    size = micro_batch_size or micro_batch_size_of(spec)
    passes = max(1, t.global_batch_size // (dp * size))
    micro = 1 if pp == 1 else s.micro_batches or passes
    name, virtual = schedule or (s.pipeline_schedule, chunks_per_rank(spec, pp))
    if gpipe_below_stages and name == "1f1b" and pp > 1 and micro < pp:
        # With fewer micro-batches than stages every rank's 1F1B warm-up holds all of them:
        # GPipe's order, the same bubble; torch's Schedule1F1B refuses it, ScheduleGPipe runs it.
        name = "gpipe"
    layout = Layout(
        degrees=degrees,
        zero_stage=zero_stage,
        schedule=name,
        micro_batches=micro,
        virtual_stages=virtual if pp > 1 else 1,
        grad_accumulation=max(1, passes // micro),
        micro_batch_size=size,
        ep=ep or s.expert_parallel or 1,
        etp=s.expert_tensor_parallel or degrees.tp,
    )
    check_layout(
        layout,
        spec.shape,
        global_batch_size=t.global_batch_size,
        world_size=spec.resources.world_size,
        num_proc_per_node=spec.resources.num_proc_per_node,
    )
    return layout


def chunk_weights(shape: ModelShape) -> tuple[int, int, int]:
    """(block, input embedding, output head) weights for balancing pipeline chunks.

    A block weighs its parameters plus 2*s*h, its attention matmuls per token in the same units
    (training FLOPs per token are about 6*psi + 12*L*h*s, Narayanan et al. 2021): its compute.
    The head weighs its vocab*h parameters (6*V*h FLOPs per token and the loss), the embedding
    its vocab*h parameters (little compute, but gradients and optimizer state like a layer's).
    """
    block = shape.layer_parameters() + 2 * shape.seq_len * shape.hidden
    return block, shape.vocab * shape.hidden, shape.vocab * shape.hidden + shape.hidden


def stage_split(shape: ModelShape, pp: int, virtual: int) -> list[Stage]:
    """Layers over pp x virtual chunks in model order, balanced by :func:`chunk_weights`.

    The chunk holding the embedding (the first) and the one holding the head (the last) get
    fewer blocks when those weigh enough, as Megatron-LM's option to count the embedding and
    the loss as layers in the split does. Chunk c sits on pipeline rank c % pp.
    """
    chunks, layers = pp * virtual, shape.layers
    block, embedding, head = chunk_weights(shape)
    extra = [0] * chunks
    extra[0] += embedding
    extra[-1] += head

    def capacities(limit: int) -> list[int]:
        return [max(0, (limit - e) // block) for e in extra]

    limits = sorted({e + k * block for e in extra for k in range(1, layers + 1)})
    limit = next(t for t in limits if min(capacities(t)) >= 1 and sum(capacities(t)) >= layers)
    counts = capacities(limit)
    while sum(counts) > layers:  # trim the heaviest chunk, the later one on ties
        cost = [e + n * block if n > 1 else -1 for e, n in zip(extra, counts, strict=True)]
        heaviest = max(range(chunks), key=lambda c: (cost[c], c))
        counts[heaviest] -= 1
    stages, first = [], 0
    for chunk, count in enumerate(counts):
        stages.append(Stage(chunk % pp, chunk // pp, first, first + count - 1))
        first += count
    return stages
