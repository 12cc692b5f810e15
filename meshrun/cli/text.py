"""The readable form of a plan (``meshrun plan`` without ``-o``), drawn with rich."""

from __future__ import annotations

from rich import box
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from meshrun.planner.auto import Choice
from meshrun.planner.explain import parameter_text
from meshrun.planner.fastest import describe_layout
from meshrun.planner.plan import Plan
from meshrun.planner.ranks import compress_ranks
from meshrun.planner.steptime import StepEstimate

MAX_POD_ROWS = 16
"""Pods listed at most; large jobs show the first ones and a count."""


def gib(value: int) -> str:
    """Bytes in binary units (KiB to TiB) with two decimals."""
    size, unit = float(value), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            break
        size /= 1024
    return f"{size:.2f} {unit}" if unit != "B" else f"{value} B"


def render(plan: Plan) -> RenderableType:
    """Header, layout, memory, stages, pods, explanation and warnings."""
    lay, mem = plan.layout, plan.memory
    device = "CPU processes" if plan.accelerator == "cpu" else "GPUs"
    header = Text.assemble(
        (f"{plan.name}", "bold"),
        f": {plan.strategy} ",
        (lay.text(), "bold cyan"),
        f" on {plan.num_nodes} pod(s) x {plan.num_proc_per_node} {device} "
        f"(world size {plan.world_size}), model {plan.preset or 'custom'} "
        f"({parameter_text(plan.model.parameters())} parameters)",
    )
    layout = Table(box=box.SIMPLE_HEAD, title="Layout", title_justify="left")
    for column in ("dp", "pp", "tp", "ZeRO", "schedule", "micro", "virtual", "accum", "bubble"):
        layout.add_column(column, justify="right")
    layout.add_row(
        str(lay.dp),
        str(lay.pp),
        str(lay.tp),
        str(lay.zero_stage),
        lay.schedule,
        str(lay.micro_batches),
        str(lay.virtual_stages),
        str(lay.grad_accumulation),
        f"{lay.bubble_fraction():.0%}",
    )
    memory = Table(
        box=box.SIMPLE_HEAD, title="Memory per accelerator (estimate)", title_justify="left"
    )
    columns = ("params", "grads", "optimizer", "activations", "gathered", "total", "limit", "fits")
    for column in columns:
        memory.add_column(column, justify="right")
    limit = gib(mem.accelerator_bytes) if mem.accelerator_bytes else "unchecked"
    memory.add_row(
        gib(mem.params),
        gib(mem.grads),
        gib(mem.optimizer),
        gib(mem.activations),
        gib(mem.gathered),
        gib(mem.total),
        limit,
        Text("yes", "green") if mem.fits else Text("NO", "bold red"),
    )
    stages = Table(box=box.SIMPLE_HEAD, title="Pipeline stages", title_justify="left")
    stages.add_column("stage", justify="right")
    stages.add_column("chunk", justify="right")
    stages.add_column("layers")
    for stage in plan.stages:
        stages.add_row(str(stage.pp), str(stage.virtual), f"{stage.first}-{stage.last}")
    pods = Table(box=box.SIMPLE_HEAD, title="Pods", title_justify="left")
    for column in ("pod", "ranks", "pp", "dp", "tp"):
        pods.add_column(column)
    for pod in range(min(plan.num_nodes, MAX_POD_ROWS)):
        per_pod = plan.num_proc_per_node
        coords = [plan.coords(pod * per_pod + i) for i in range(per_pod)]
        pods.add_row(
            f"{plan.name}-{pod}",
            f"{coords[0].rank}-{coords[-1].rank}",
            compress_ranks([c.pp for c in coords]),
            compress_ranks([c.dp for c in coords]),
            compress_ranks([c.tp for c in coords]),
        )
    if plan.num_nodes > MAX_POD_ROWS:
        pods.add_row(f"... {plan.num_nodes - MAX_POD_ROWS} more", "", "", "", "")
    parts: list[RenderableType] = [header, layout, memory]
    if plan.estimate is not None:
        parts.append(render_estimate(plan.estimate, plan.accelerator == "cpu"))
    parts += [stages, pods, Text(plan.explanation)]
    parts.extend(Text(f"warning: {w}", "yellow") for w in plan.warnings)
    return Group(*parts)


PART_NAMES = {
    "compute": "compute (matmuls, attention)",
    "recompute": "activation recomputation",
    "elementwise": "element-wise (memory bound)",
    "tensorParallel": "tensor-parallel collectives",
    "launch": "waiting on kernel launches",
    "pipelineBubble": "pipeline bubble",
    "pipelineTransfer": "stage-to-stage transfers",
    "dataParallel": "data-parallel traffic (exposed)",
    "optimizer": "optimizer step",
    "memoryPressure": "memory pressure (little headroom)",
}


def render_estimate(est: StepEstimate, cpu: bool) -> RenderableType:
    """The predicted step: time, tokens/s per GPU, MFU, and seconds by part."""
    speed = f"{est.tokens_per_second_per_gpu:,.0f} tokens/s per"
    if cpu:  # a nominal CPU profile: a ranking, not a promise, and no peak to compare with
        speed += " process (nominal CPU figures)"
    else:
        speed += f" GPU, MFU {est.mfu:.0%}"
    title = f"Predicted step: {seconds(est.step_seconds)}, {speed}"
    table = Table(box=box.SIMPLE_HEAD, title=title, title_justify="left")
    for column in ("part", "time", "share"):
        table.add_column(column, justify="left" if column == "part" else "right")
    for part, value in est.breakdown.items():
        if value > 0:
            share = value / est.step_seconds if est.step_seconds else 0.0
            table.add_row(PART_NAMES.get(part, part), seconds(value), f"{share:.0%}")
    return table


def seconds(value: float) -> str:
    """Seconds with three significant digits, in ms below one second."""
    return f"{value:.3g} s" if value >= 1 else f"{value * 1e3:.3g} ms"


def render_candidates(choices: list[Choice]) -> RenderableType:
    """``--candidates``: the fastest layouts that fit, fastest first."""
    table = Table(box=box.SIMPLE_HEAD, title="Fastest layouts that fit", title_justify="left")
    for column in ("#", "layout", "memory", "step", "tokens/s/GPU", "MFU"):
        table.add_column(column, justify="left" if column == "layout" else "right")
    for index, choice in enumerate(choices, 1):
        est = choice.estimate
        assert est is not None
        table.add_row(
            str(index),
            describe_layout(choice),
            gib(choice.memory.total),
            seconds(est.step_seconds),
            f"{est.tokens_per_second_per_gpu:,.0f}",
            f"{est.mfu:.0%}",
        )
    if not choices:
        table.add_row("", "no layout fits", "", "", "", "")
    return table


def elastic_text(plan: Plan, degrees: list[int]) -> str:
    """The sizes an elastic job may run at (spec.elastic), in one sentence."""
    per_replica = plan.layout.pp * plan.layout.tp
    sizes = ", ".join(
        f"dp{dp} ({dp * per_replica // plan.num_proc_per_node} pod(s))" for dp in degrees
    )
    return (
        f"Elastic: may run at {sizes}, the same pp{plan.layout.pp} x tp{plan.layout.tp} and "
        "global batch (gradient accumulation follows the degree)."
    )


def to_text(plan: Plan, width: int = 100) -> str:
    """The rendering as plain text (no colour), e.g. for tests and logs."""
    console = Console(width=width, record=True, color_system=None, force_terminal=False)
    with console.capture():
        console.print(render(plan))
    return console.export_text()
